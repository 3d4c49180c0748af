package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// escalating stores the policy of acme's primary target "geo-a": max
// attempts, the fallback chain and, with deadline set, a call deadline
// and a 1s attempt timeout.
func escalating(t *testing.T, h *harness, attempts uint32, fb *pb.FallbackSettings, deadline time.Duration) {
	t.Helper()
	p := &pb.Policy{MaxAttempts: &attempts, Fallback: fb}
	if deadline > 0 {
		p.CallDeadline, p.AttemptTimeout = durationOf(deadline), durationOf(time.Second)
		p.Backoff = &pb.BackoffSettings{MaxDelay: durationOf(2 * time.Second)}
	}
	if _, err := h.admin.SetPolicy(context.Background(), &pb.SetPolicyRequest{Tenant: "acme", Target: "geo-a", Policy: p}); err != nil {
		t.Fatalf("SetPolicy(acme/geo-a): %v", err)
	}
}

// failures is the consecutive failure count of acme's breaker of target.
func failures(t *testing.T, h *harness, target string) uint32 {
	t.Helper()
	b, err := h.admin.GetBreaker(context.Background(), &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: target}})
	if status.Code(err) == codes.NotFound {
		return 0
	}
	if err != nil {
		t.Fatalf("GetBreaker(%s): %v", target, err)
	}
	return b.GetBreaker().GetConsecutiveFailures()
}

func force(t *testing.T, h *harness, target string, st pb.BreakerState) {
	t.Helper()
	if _, err := h.admin.ForceBreaker(context.Background(), &pb.ForceBreakerRequest{
		Key: &pb.BreakerKey{Tenant: "acme", Target: target}, State: st}); err != nil {
		t.Fatalf("ForceBreaker(%s, %v): %v", target, st, err)
	}
}

// TestEscalationAfterAttempts: with after_attempts 1 the second attempt
// goes to the fallback and the last target keeps the rest; max_attempts of
// the primary caps the whole call; each target's breaker counts only the
// failures of its own attempts; the audit trail and the run's call table
// name the attempt's target and the call's primary.
func TestEscalationAfterAttempts(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	escalating(t, h, 4, &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1}, 0)
	if _, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "nightly", Tenant: "acme", RetryPool: 100,
		CutoffTime: timestamppb.New(h.clock.Now().Add(time.Hour))}); err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	c := call("acme", "geo-a", "doc-1")
	c.RunId = "nightly"
	steps := []struct {
		attempt    uint32
		sentTo     string // attempt_target
		wantRetry  bool
		wantTarget string
	}{
		{1, "", true, "geo-b"},
		{2, "geo-b", true, "geo-b"},
		{3, "geo-b", true, "geo-b"},
		{4, "geo-b", false, ""},
	}
	for _, st := range steps {
		nd, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: st.attempt, Failure: http(503), AttemptTarget: st.sentTo})
		if err != nil {
			t.Fatalf("NextDelay(attempt %d on %q): %v", st.attempt, st.sentTo, err)
		}
		retry := nd.GetDecision() == pb.Decision_DECISION_RETRY
		if retry != st.wantRetry || nd.GetTarget() != st.wantTarget {
			t.Fatalf("NextDelay(attempt %d on %q): got %v target %q (%s), want retry %v target %q",
				st.attempt, st.sentTo, nd.GetDecision(), nd.GetTarget(), nd.GetDetail(), st.wantRetry, st.wantTarget)
		}
		if !retry && nd.GetStopReason() != pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED {
			t.Fatalf("attempt 4: stop %v, want ATTEMPTS_EXHAUSTED: max_attempts 4 caps the call across targets", nd.GetStopReason())
		}
	}
	if a, b := failures(t, h, "geo-a"), failures(t, h, "geo-b"); a != 1 || b != 3 {
		t.Fatalf("breakers: geo-a %d failures, geo-b %d; want 1 and 3 (each its own attempts)", a, b)
	}
	if _, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: c, Attempt: 4,
		AlreadyRecorded: true, AttemptTarget: "geo-b", FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER,
		FinalStopReason: pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED}}}); err != nil {
		t.Fatalf("ReportOutcome: %v", err)
	}

	audit, err := h.admin.QueryAudit(ctx, &pb.QueryAuditRequest{CallId: "doc-1", Tenant: "acme"})
	if err != nil {
		t.Fatalf("QueryAudit: %v", err)
	}
	var got []string
	for _, r := range audit.GetRecords() {
		got = append(got, fmt.Sprintf("%s#%d %s/%s", strings.TrimPrefix(r.GetEvent().String(), "AUDIT_EVENT_"), r.GetAttempt(), r.GetTarget(), r.GetPrimaryTarget()))
	}
	want := "[DECISION#1 geo-a/ DECISION#2 geo-b/geo-a DECISION#3 geo-b/geo-a DECISION#4 geo-b/geo-a OUTCOME#4 geo-b/geo-a FINAL#4 geo-b/geo-a]"
	if fmt.Sprint(got) != want {
		t.Fatalf("audit (event#attempt target/primary):\n got %v\nwant %s", got, want)
	}

	calls, err := h.admin.ListRunCalls(ctx, &pb.ListRunCallsRequest{RunId: "nightly"})
	if err != nil {
		t.Fatalf("ListRunCalls: %v", err)
	}
	if len(calls.GetCalls()) != 1 {
		t.Fatalf("ListRunCalls: %v, want doc-1", calls.GetCalls())
	}
	if rc := calls.GetCalls()[0]; rc.GetTarget() != "geo-b" || rc.GetPrimaryTarget() != "geo-a" || rc.GetAttempts() != 4 ||
		rc.GetDisposition() != pb.Disposition_DISPOSITION_DEAD_LETTER {
		t.Fatalf("run call: %v, want ended on geo-b (primary geo-a) after 4 attempts, DEAD_LETTER", rc)
	}
}

// TestEscalationDeadlineCarries: the primary's call deadline holds for the
// attempts on a fallback, whose own policy has none.
func TestEscalationDeadlineCarries(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	escalating(t, h, 5, &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1}, 10*time.Second)
	c := call("acme", "geo-a", "doc-1")
	c.OriginTime = timestamppb.New(h.clock.Now())
	nd, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: 1, Failure: http(503)})
	if err != nil || nd.GetDecision() != pb.Decision_DECISION_RETRY || nd.GetTarget() != "geo-b" {
		t.Fatalf("attempt 1: %v, %v; want RETRY on geo-b", nd, err)
	}
	h.clock.Advance(9 * time.Second)
	nd, err = h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: 2, Failure: http(503), AttemptTarget: "geo-b"})
	if err != nil {
		t.Fatalf("attempt 2: %v", err)
	}
	if nd.GetDecision() != pb.Decision_DECISION_STOP || nd.GetStopReason() != pb.StopReason_STOP_REASON_DEADLINE {
		t.Fatalf("attempt 2 on geo-b, 9s into a 10s deadline: %v %v (%s), want STOP DEADLINE", nd.GetDecision(), nd.GetStopReason(), nd.GetDetail())
	}
}

// TestEscalationOnCircuitOpen: with on_circuit_open, Admit on an open
// primary admits on the first fallback whose breaker is not open, and a
// NextDelay whose next target's breaker is open names the next target of
// the chain; when every target is open the call stops CIRCUIT_OPEN; without
// on_circuit_open an open primary refuses as before.
func TestEscalationOnCircuitOpen(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	escalating(t, h, 5, &pb.FallbackSettings{Targets: []string{"geo-b", "geo-c"}, OnCircuitOpen: true}, 0)
	admit := func(id, target string) *pb.AdmitResponse {
		t.Helper()
		a, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "geo-a", id), Attempt: 1, AttemptTarget: target})
		if err != nil {
			t.Fatalf("Admit(%s on %q): %v", id, target, err)
		}
		return a
	}
	if a := admit("doc-1", ""); !a.GetAdmitted() || a.GetTarget() != "geo-a" {
		t.Fatalf("Admit, all closed: %v, want admitted on geo-a", a)
	}
	force(t, h, "geo-a", pb.BreakerState_BREAKER_STATE_OPEN)
	if a := admit("doc-1", ""); !a.GetAdmitted() || a.GetTarget() != "geo-b" {
		t.Fatalf("Admit, geo-a open: %v, want admitted on geo-b", a)
	}
	force(t, h, "geo-b", pb.BreakerState_BREAKER_STATE_OPEN)
	if a := admit("doc-1", ""); !a.GetAdmitted() || a.GetTarget() != "geo-c" {
		t.Fatalf("Admit, geo-a and geo-b open: %v, want admitted on geo-c", a)
	}

	// Attempt 1 went to geo-c and failed; the chain's next target (geo-a,
	// after_attempts 0) and geo-b are open, so attempt 2 goes to geo-c.
	nd, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo-a", "doc-1"), Attempt: 1,
		Failure: http(503), AttemptTarget: "geo-c"})
	if err != nil {
		t.Fatalf("NextDelay: %v", err)
	}
	if nd.GetDecision() != pb.Decision_DECISION_RETRY || nd.GetTarget() != "geo-c" {
		t.Fatalf("NextDelay, geo-a and geo-b open: %v target %q (%s), want RETRY on geo-c", nd.GetDecision(), nd.GetTarget(), nd.GetDetail())
	}
	if a, c := failures(t, h, "geo-a"), failures(t, h, "geo-c"); a != 0 || c != 1 {
		t.Fatalf("breakers: geo-a %d failures, geo-c %d; want 0 and 1", a, c)
	}

	force(t, h, "geo-c", pb.BreakerState_BREAKER_STATE_OPEN)
	// The same NextDelay again replays its answer, target included, though
	// geo-c is open now.
	replay, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo-a", "doc-1"), Attempt: 1,
		Failure: http(503), AttemptTarget: "geo-c"})
	if err != nil || replay.GetDecision() != pb.Decision_DECISION_RETRY || replay.GetTarget() != "geo-c" {
		t.Fatalf("NextDelay replayed: %v, %v; want the RETRY on geo-c again", replay, err)
	}
	if a := admit("doc-2", ""); a.GetAdmitted() || a.GetTarget() != "" || a.GetState() != pb.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("Admit, every target open: %v, want refused OPEN", a)
	}
	nd, err = h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo-a", "doc-1"), Attempt: 2,
		Failure: http(503), AttemptTarget: "geo-c"})
	if err != nil {
		t.Fatalf("NextDelay: %v", err)
	}
	if nd.GetDecision() != pb.Decision_DECISION_STOP || nd.GetStopReason() != pb.StopReason_STOP_REASON_CIRCUIT_OPEN {
		t.Fatalf("NextDelay, every target open: %v %v, want STOP CIRCUIT_OPEN", nd.GetDecision(), nd.GetStopReason())
	}

	// Without on_circuit_open the open primary refuses.
	escalating(t, h, 5, &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 2}, 0)
	force(t, h, "geo-b", pb.BreakerState_BREAKER_STATE_CLOSED)
	if a := admit("doc-3", ""); a.GetAdmitted() {
		t.Fatalf("Admit, geo-a open, no on_circuit_open: %v, want refused", a)
	}
	if a := admit("doc-3", "geo-b"); !a.GetAdmitted() || a.GetTarget() != "geo-b" {
		t.Fatalf("Admit on geo-b: %v, want admitted on geo-b", a)
	}
}

// TestEscalationStopOpenBecomesRetry: a NextDelay whose failure tripped the
// primary's breaker stops CIRCUIT_OPEN without a fallback and retries on
// the fallback with on_circuit_open.
func TestEscalationStopOpenBecomesRetry(t *testing.T) {
	one := uint32(1)
	for _, tt := range []struct {
		name       string
		fallback   *pb.FallbackSettings
		wantRetry  bool
		wantTarget string
	}{
		{"no fallback", nil, false, ""},
		{"on_circuit_open", &pb.FallbackSettings{Targets: []string{"geo-b"}, OnCircuitOpen: true}, true, "geo-b"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			attempts := uint32(3)
			if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "geo-a", Policy: &pb.Policy{
				MaxAttempts: &attempts, Breaker: &pb.BreakerSettings{ConsecutiveFailures: &one}, Fallback: tt.fallback}}); err != nil {
				t.Fatal(err)
			}
			nd, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo-a", "doc-1"), Attempt: 1, Failure: http(503)})
			if err != nil {
				t.Fatal(err)
			}
			if retry := nd.GetDecision() == pb.Decision_DECISION_RETRY; retry != tt.wantRetry || nd.GetTarget() != tt.wantTarget {
				t.Fatalf("got %v %v target %q, want retry %v target %q", nd.GetDecision(), nd.GetStopReason(), nd.GetTarget(), tt.wantRetry, tt.wantTarget)
			}
			if !tt.wantRetry && nd.GetStopReason() != pb.StopReason_STOP_REASON_CIRCUIT_OPEN {
				t.Fatalf("stop %v, want CIRCUIT_OPEN", nd.GetStopReason())
			}
		})
	}
}

// TestEscalationOutcomeBreaker: ReportOutcome's attempt_target selects the
// attempt's breaker: a fallback's failures open the fallback's breaker,
// not the primary's.
func TestEscalationOutcomeBreaker(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	escalating(t, h, 3, &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1}, 0)
	var outs []*pb.Outcome
	for i := range 5 {
		outs = append(outs, &pb.Outcome{Call: call("acme", "geo-a", fmt.Sprint("doc-", i)), Attempt: 2, Failure: http(503), AttemptTarget: "geo-b"})
	}
	if _, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: outs}); err != nil {
		t.Fatalf("ReportOutcome: %v", err)
	}
	b, err := h.admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "geo-b"}})
	if err != nil || b.GetBreaker().GetState() != pb.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("geo-b after 5 failures: %v, %v; want OPEN", b, err)
	}
	if n := failures(t, h, "geo-a"); n != 0 {
		t.Fatalf("geo-a: %d failures, want 0", n)
	}
}

// TestFallbackPolicyRoundTrip: GetPolicy shows the fallback SetPolicy
// stored.
func TestFallbackPolicyRoundTrip(t *testing.T) {
	h := newHarness(t)
	escalating(t, h, 3, &pb.FallbackSettings{Targets: []string{"geo-b", "geo-c"}, AfterAttempts: 2, OnCircuitOpen: true}, 0)
	got, err := h.admin.GetPolicy(context.Background(), &pb.GetPolicyRequest{Tenant: "acme", Target: "geo-a"})
	if err != nil {
		t.Fatal(err)
	}
	if f := got.GetEntry().GetPolicy().GetFallback(); fmt.Sprint(f.GetTargets()) != "[geo-b geo-c]" || f.GetAfterAttempts() != 2 || !f.GetOnCircuitOpen() {
		t.Fatalf("GetPolicy: fallback %v, want [geo-b geo-c] after 2, on_circuit_open", f)
	}
}

// TestFallbackBadInput: each rule of the fallback chain and of
// attempt_target is INVALID_ARGUMENT naming the field.
func TestFallbackBadInput(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	three := uint32(3)
	set := func(target string, f *pb.FallbackSettings) error {
		_, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: target,
			Policy: &pb.Policy{MaxAttempts: &three, Fallback: f}})
		return err
	}
	// geo-b falls back to geo-c, geo-c to geo-a: geo-a naming geo-b closes
	// a cycle.
	if err := set("geo-b", &pb.FallbackSettings{Targets: []string{"geo-c"}}); err != nil {
		t.Fatal(err)
	}
	if err := set("geo-c", &pb.FallbackSettings{Targets: []string{"geo-a"}}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, field, rule string
		err               error
	}{
		{"five targets", "policy.fallback.targets", "at most 4", set("geo-a", &pb.FallbackSettings{Targets: []string{"b", "c", "d", "e", "f"}})},
		{"NUL in a target", "policy.fallback.targets[1]", "control", set("geo-a", &pb.FallbackSettings{Targets: []string{"b", "c\x00"}})},
		{"empty target", "policy.fallback.targets[0]", "required", set("geo-a", &pb.FallbackSettings{Targets: []string{""}})},
		{"oversized target", "policy.fallback.targets[0]", "at most 256 bytes", set("geo-a", &pb.FallbackSettings{Targets: []string{strings.Repeat("x", 257)}})},
		{"repeat", "policy.fallback.targets[1]", "repeats", set("geo-a", &pb.FallbackSettings{Targets: []string{"b", "b"}})},
		{"own target", "policy.fallback.targets[0]", "own target", set("geo-a", &pb.FallbackSettings{Targets: []string{"geo-a"}})},
		{"cycle", "policy.fallback.targets[1]", "geo-a -> geo-b -> geo-c -> geo-a", set("geo-a", &pb.FallbackSettings{Targets: []string{"x", "geo-b"}})},
		{"after_attempts = max_attempts", "policy.fallback.after_attempts", "below max_attempts", set("geo-a", &pb.FallbackSettings{Targets: []string{"b"}, AfterAttempts: 3})},
		{"after_attempts without targets", "policy.fallback.after_attempts", "needs fallback.targets", set("geo-a", &pb.FallbackSettings{AfterAttempts: 1})},
		{"on_circuit_open without targets", "policy.fallback.on_circuit_open", "needs fallback.targets", set("geo-a", &pb.FallbackSettings{OnCircuitOpen: true})},
		{"NextDelay attempt_target", "attempt_target", "control", func() error {
			_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo-a", "c"), Attempt: 1, Failure: http(503), AttemptTarget: "b\x00"})
			return err
		}()},
		{"Admit attempt_target", "attempt_target", "white space", func() error {
			_, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "geo-a", "c"), Attempt: 1, AttemptTarget: " b"})
			return err
		}()},
		{"ReportOutcome attempt_target", "outcomes[0].attempt_target", "at most 256 bytes", func() error {
			_, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: call("acme", "geo-a", "c"),
				Attempt: 1, Success: true, AttemptTarget: strings.Repeat("x", 257)}}})
			return err
		}()},
		{"ReleaseLease attempt_target", "attempt_target", "control", func() error {
			_, err := h.workers.ReleaseLease(ctx, &pb.ReleaseLeaseRequest{Call: call("acme", "geo-a", "c"), LeaseId: "l", AttemptTarget: "\x01"})
			return err
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := wantCode(t, tt.err, codes.InvalidArgument)
			if !strings.HasPrefix(msg, tt.field+": ") || !strings.Contains(msg, tt.rule) {
				t.Fatalf("got %q, want it to name %s and say %q", msg, tt.field, tt.rule)
			}
		})
	}
	// A tenant-wide policy may name any target: the chain skips the
	// primary, and there is no own target to cycle back to.
	if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Policy: &pb.Policy{MaxAttempts: &three,
		Fallback: &pb.FallbackSettings{Targets: []string{"geo-a", "geo-b"}, AfterAttempts: 1}}}); err != nil {
		t.Fatalf("tenant-wide fallback: %v, want accepted", err)
	}
}

// TestFallbackMetrics: policyd_fallbacks_total counts the attempts moved
// to another target, by NextDelay (after_attempts) and by Admit (an open
// breaker with on_circuit_open); the decisions are labelled by the failed
// attempt's target.
func TestFallbackMetrics(t *testing.T) {
	opt, reg := withMetrics(t, server.MetricsOptions{})
	h := newHarness(t, opt)
	ctx := context.Background()
	escalating(t, h, 3, &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1, OnCircuitOpen: true}, 0)
	for _, id := range []string{"doc-1", "doc-2"} {
		if _, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo-a", id), Attempt: 1, Failure: http(503)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo-a", "doc-1"), Attempt: 2,
		Failure: http(503), AttemptTarget: "geo-b"}); err != nil {
		t.Fatal(err)
	}
	force(t, h, "geo-a", pb.BreakerState_BREAKER_STATE_OPEN)
	if a, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "geo-a", "doc-3"), Attempt: 1}); err != nil || a.GetTarget() != "geo-b" {
		t.Fatalf("Admit: %v, %v; want admitted on geo-b", a, err)
	}
	if got, _ := sample(t, reg, "policyd_fallbacks_total", "from=geo-a", "to=geo-b"); got != 3 {
		t.Fatalf("policyd_fallbacks_total{from=geo-a,to=geo-b} = %v, want 3 (two NextDelay, one Admit)", got)
	}
	if _, ok := sample(t, reg, "policyd_fallbacks_total", "from=geo-b", "to=geo-b"); ok {
		t.Fatalf("policyd_fallbacks_total{from=geo-b,to=geo-b} exists: an attempt that stays is not moved")
	}
	if got, _ := sample(t, reg, "policyd_decisions_total", "decision=RETRY", "stop_reason=NONE", "disposition=NONE", "target=geo-b"); got != 1 {
		t.Fatalf("policyd_decisions_total RETRY on geo-b = %v, want 1", got)
	}
}

// TestEscalationPastAFullCeiling: with on_circuit_open, an Admit that the
// primary's full concurrency ceiling refuses is admitted on the fallback,
// whose own policy has no ceiling; the primary's lease stays its own.
func TestEscalationPastAFullCeiling(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	one, three := uint32(1), uint32(3)
	if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "geo-a", Policy: &pb.Policy{
		MaxAttempts: &three, Flow: &pb.FlowSettings{MaxInFlight: &one},
		Fallback: &pb.FallbackSettings{Targets: []string{"geo-b"}, OnCircuitOpen: true}}}); err != nil {
		t.Fatal(err)
	}
	first, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "geo-a", "doc-1"), Attempt: 1})
	if err != nil || !first.GetAdmitted() || first.GetTarget() != "geo-a" || first.GetLeaseId() == "" {
		t.Fatalf("first Admit: %v, %v; want admitted on geo-a with a lease", first, err)
	}
	second, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "geo-a", "doc-2"), Attempt: 1})
	if err != nil || !second.GetAdmitted() || second.GetTarget() != "geo-b" || second.GetLeaseId() != "" {
		t.Fatalf("second Admit, geo-a's ceiling full: %v, %v; want admitted on geo-b without a lease", second, err)
	}
	rel, err := h.workers.ReleaseLease(ctx, &pb.ReleaseLeaseRequest{Call: call("acme", "geo-a", "doc-1"), LeaseId: first.GetLeaseId()})
	if err != nil || !rel.GetReleased() {
		t.Fatalf("ReleaseLease of geo-a's lease: %v, %v; want released", rel, err)
	}
}

// TestWatchSnapshotTellsTheFallbackChains: the message that completes a
// watch's snapshot lists each target a policy names whose effective
// policy for the watched tenant has a fallback, with it, and the tenant's
// policy's fallback for every other target; a named target whose
// effective policy has none (here one overriding the tenant's) is not
// listed, and another tenant's policies are not followed.
func TestWatchSnapshotTellsTheFallbackChains(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	set := func(tenant, target string, fb *pb.FallbackSettings) {
		t.Helper()
		three := uint32(3)
		if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: tenant, Target: target,
			Policy: &pb.Policy{MaxAttempts: &three, Fallback: fb}}); err != nil {
			t.Fatalf("SetPolicy(%s/%s): %v", tenant, target, err)
		}
	}
	set("acme", "geo-a", &pb.FallbackSettings{Targets: []string{"geo-b"}, OnCircuitOpen: true})
	set("", "geo-c", &pb.FallbackSettings{Targets: []string{"geo-d", "geo-e"}, AfterAttempts: 1})
	set("acme", "geo-f", nil)
	set("acme", "", &pb.FallbackSettings{Targets: []string{"geo-z"}, AfterAttempts: 2})
	set("other", "geo-g", &pb.FallbackSettings{Targets: []string{"geo-h"}, OnCircuitOpen: true})
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := h.workers.WatchBreakers(sctx, &pb.WatchBreakersRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	var done *pb.WatchBreakersResponse
	for done == nil {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if msg.GetSnapshotComplete() {
			done = msg
		}
	}
	var got []string
	for _, c := range done.GetFallbackChains() {
		f := c.GetFallback()
		got = append(got, fmt.Sprintf("%s:%s/%d/%v", c.GetTarget(), strings.Join(f.GetTargets(), ","), f.GetAfterAttempts(), f.GetOnCircuitOpen()))
	}
	slices.Sort(got)
	if s, want := strings.Join(got, " "), "geo-a:geo-b/0/true geo-c:geo-d,geo-e/1/false"; s != want {
		t.Errorf("fallback_chains: %s, want %s", s, want)
	}
	if o := done.GetOtherTargetsFallback(); strings.Join(o.GetTargets(), ",") != "geo-z" || o.GetAfterAttempts() != 2 || o.GetOnCircuitOpen() {
		t.Errorf("other_targets_fallback: %v, want the tenant's: geo-z after 2 attempts", o)
	}
	named := append(done.GetFlowControlledTargets(), done.GetUncontrolledTargets()...)
	if !slices.Contains(named, "geo-f") {
		t.Errorf("named targets %v, want geo-f among them (so its lack of a chain is told)", named)
	}
}

// TestReportOutcomeTellsTheFallbackChains: a report lists, once each, the
// batch's primaries whose policy has a fallback, with it: not a target
// without one, and not a fallback target an attempt was sent to.
func TestReportOutcomeTellsTheFallbackChains(t *testing.T) {
	h := newHarness(t)
	escalating(t, h, 3, &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1}, 0)
	rep, err := h.workers.ReportOutcome(context.Background(), &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("acme", "geo-a", "doc-1"), Attempt: 1, Success: true},
		{Call: call("acme", "geo-a", "doc-2"), Attempt: 2, Success: true, AttemptTarget: "geo-b"},
		{Call: call("acme", "geo-a", "doc-3"), Attempt: 1, Success: true},
		{Call: call("acme", "elsewhere", "doc-4"), Attempt: 1, Success: true},
	}})
	if err != nil {
		t.Fatalf("ReportOutcome: %v", err)
	}
	var got []string
	for _, c := range rep.GetFallbackChains() {
		got = append(got, c.GetTarget()+":"+strings.Join(c.GetFallback().GetTargets(), ",")+"/"+fmt.Sprint(c.GetFallback().GetAfterAttempts()))
	}
	if s := strings.Join(got, " "); s != "geo-a:geo-b/1" {
		t.Fatalf("fallback_chains: %s, want geo-a:geo-b/1", s)
	}
}
