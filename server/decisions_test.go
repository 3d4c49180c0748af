package server_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

func TestClassify(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	nonIdem := &pb.CallRef{Tenant: "acme", Target: "portal"}
	withKey := &pb.CallRef{Tenant: "acme", Target: "portal", IdempotencyKey: "k1"}
	tests := []struct {
		name      string
		call      *pb.CallRef
		failure   *pb.Failure
		retryable bool
		category  pb.Category
		reason    string
	}{
		{"503 transient", call("acme", "portal", ""), http(503), true, pb.Category_CATEGORY_TRANSIENT, "transient:503"},
		{"429 transient", call("acme", "portal", ""), http(429), true, pb.Category_CATEGORY_TRANSIENT, "transient:429"},
		{"422 terminal", call("acme", "portal", ""), http(422), false, pb.Category_CATEGORY_TERMINAL, "terminal:422"},
		{"418 unclassified", call("acme", "portal", ""), http(418), false, pb.Category_CATEGORY_UNCLASSIFIED, "unclassified:418"},
		{"timeout", call("acme", "portal", ""), transport(pb.TransportError_TRANSPORT_ERROR_TIMEOUT), true, pb.Category_CATEGORY_TRANSIENT, "transport:timeout"},
		{"grpc unavailable", call("acme", "portal", ""), &pb.Failure{Kind: &pb.Failure_GrpcCode{GrpcCode: 14}}, true, pb.Category_CATEGORY_TRANSIENT, "transient:grpc_unavailable"},
		{"parse", call("acme", "portal", ""), &pb.Failure{Kind: &pb.Failure_LocalError{LocalError: pb.LocalError_LOCAL_ERROR_PARSE}}, false, pb.Category_CATEGORY_TERMINAL, "local:parse"},
		{"non-idempotent 503", nonIdem, http(503), false, pb.Category_CATEGORY_TRANSIENT, "unsafe:not_idempotent"},
		{"non-idempotent with key", withKey, http(503), true, pb.Category_CATEGORY_TRANSIENT, "transient:503"},
		{"non-idempotent refused is safe", nonIdem, transport(pb.TransportError_TRANSPORT_ERROR_CONNECTION_REFUSED), true, pb.Category_CATEGORY_TRANSIENT, "transport:connection_refused"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := h.workers.Classify(ctx, &pb.ClassifyRequest{Call: tc.call, Failure: tc.failure})
			if err != nil {
				t.Fatalf("Classify: %v", err)
			}
			if resp.GetRetryable() != tc.retryable || resp.GetCategory() != tc.category || resp.GetReason() != tc.reason {
				t.Errorf("got (%v, %v, %q), want (%v, %v, %q)", resp.GetRetryable(), resp.GetCategory(), resp.GetReason(),
					tc.retryable, tc.category, tc.reason)
			}
		})
	}
}

func TestClassifyFollowsPolicyOverride(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	// This portal answers 409 while it is still processing: retry it.
	_, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "portal", Policy: &pb.Policy{
		TransientHttpStatuses: []uint32{409, 503},
	}})
	if err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	for _, tc := range []struct {
		target string
		code   uint32
		want   string
	}{
		{"portal", 409, "transient:409"},
		{"portal", 500, "unclassified:500"}, // the table was replaced
		{"other", 409, "unclassified:409"},
	} {
		resp, err := h.workers.Classify(ctx, &pb.ClassifyRequest{Call: call("acme", tc.target, ""), Failure: http(tc.code)})
		if err != nil {
			t.Fatalf("Classify: %v", err)
		}
		if resp.GetReason() != tc.want {
			t.Errorf("%s %d: got %q, want %q", tc.target, tc.code, resp.GetReason(), tc.want)
		}
	}
}

func nextDelay(t *testing.T, h *harness, req *pb.NextDelayRequest) *pb.NextDelayResponse {
	t.Helper()
	resp, err := h.workers.NextDelay(context.Background(), req)
	if err != nil {
		t.Fatalf("NextDelay: %v", err)
	}
	return resp
}

func TestNextDelayRetriesWithinNominal(t *testing.T) {
	h := newHarness(t)
	resp := nextDelay(t, h, &pb.NextDelayRequest{Call: call("acme", "geo", "c1"), Attempt: 1, Failure: http(503)})
	if resp.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("got %v (%s), want RETRY", resp.GetDecision(), resp.GetDetail())
	}
	// FULL jitter with the harness's draw of 0.5 over the 500ms nominal.
	if got, want := resp.GetDelay().AsDuration(), 250*time.Millisecond; got != want {
		t.Errorf("delay: got %v, want %v", got, want)
	}
	for _, c := range []string{"classification", "idempotency", "attempts", "deadline", "breaker", "tenant_budget"} {
		if !slices.Contains(resp.GetChecks(), c) {
			t.Errorf("checks: got %v, want it to contain %q", resp.GetChecks(), c)
		}
	}
	if resp.GetBreakerState() != pb.BreakerState_BREAKER_STATE_CLOSED {
		t.Errorf("breaker: got %v, want CLOSED", resp.GetBreakerState())
	}
	if resp.GetAttemptTimeout().AsDuration() != 10*time.Second {
		t.Errorf("attempt timeout: got %v, want 10s", resp.GetAttemptTimeout().AsDuration())
	}
}

func TestNextDelayStops(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	now := h.clock.Now()
	// Calls to "dl" must finish within 20s of their origin.
	if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Target: "dl", Policy: &pb.Policy{
		CallDeadline: durationpb.New(20 * time.Second),
		Backoff:      &pb.BackoffSettings{MaxDelay: durationpb.New(5 * time.Second)}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	tests := []struct {
		name        string
		req         *pb.NextDelayRequest
		stop        pb.StopReason
		disposition pb.Disposition
	}{
		{"terminal", &pb.NextDelayRequest{Call: call("acme", "geo", "t"), Attempt: 1, Failure: http(422)},
			pb.StopReason_STOP_REASON_TERMINAL, pb.Disposition_DISPOSITION_FAILED_TERMINAL},
		{"not idempotent", &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "n"}, Attempt: 1, Failure: http(503)},
			pb.StopReason_STOP_REASON_NOT_IDEMPOTENT, pb.Disposition_DISPOSITION_DEAD_LETTER},
		{"attempts exhausted", &pb.NextDelayRequest{Call: call("acme", "geo", "a"), Attempt: 3, Failure: http(503)},
			pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED, pb.Disposition_DISPOSITION_DEAD_LETTER},
		{"server pushback", &pb.NextDelayRequest{Call: call("acme", "geo", "p"), Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_GrpcCode{GrpcCode: 14}},
			Pushback: &pb.Pushback{GrpcRetryPushbackMs: "-1"}},
			pb.StopReason_STOP_REASON_SERVER_PUSHBACK, pb.Disposition_DISPOSITION_DEAD_LETTER},
		// The deadline is anchored to the origin the caller gives, not to
		// the first time policyd saw the call: 15s after the origin, a
		// wait plus the 10s attempt timeout cannot end within 20s of it.
		{"deadline from origin", &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "dl", CallId: "d", Idempotent: true,
			OriginTime: timestamppb.New(now.Add(-15 * time.Second))},
			Attempt: 1, Failure: http(503)},
			pb.StopReason_STOP_REASON_DEADLINE, pb.Disposition_DISPOSITION_DEAD_LETTER},
		{"explicit deadline", &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "e", Idempotent: true,
			DeadlineTime: timestamppb.New(now.Add(5 * time.Second))},
			Attempt: 1, Failure: http(503)},
			pb.StopReason_STOP_REASON_DEADLINE, pb.Disposition_DISPOSITION_DEAD_LETTER},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := nextDelay(t, h, tc.req)
			if resp.GetDecision() != pb.Decision_DECISION_STOP || resp.GetStopReason() != tc.stop || resp.GetDisposition() != tc.disposition {
				t.Errorf("got %v %v %v (%s), want STOP %v %v", resp.GetDecision(), resp.GetStopReason(), resp.GetDisposition(),
					resp.GetDetail(), tc.stop, tc.disposition)
			}
		})
	}
}

func TestNextDelayHonoursRetryAfterAcrossTheFleet(t *testing.T) {
	h := newHarness(t)
	first := nextDelay(t, h, &pb.NextDelayRequest{Call: call("acme", "geo", "w1"), Attempt: 1, Failure: http(429),
		Pushback: &pb.Pushback{RetryAfter: "120"}})
	if first.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("got %v (%s), want RETRY", first.GetDecision(), first.GetDetail())
	}
	// The 10s attempt timeout needs no deadline here; the hint must never
	// be undercut.
	if got := first.GetDelay().AsDuration(); got < 120*time.Second {
		t.Errorf("delay: got %v, want >= 120s (the server's Retry-After)", got)
	}
	// Another worker of the same tenant and target, failing with a plain
	// 503 and no hint, waits for the cool-down too.
	other := nextDelay(t, h, &pb.NextDelayRequest{Call: call("acme", "geo", "w2"), Attempt: 1, Failure: http(503)})
	if got := other.GetDelay().AsDuration(); got < 119*time.Second {
		t.Errorf("second worker delay: got %v, want the fleet cool-down (~120s)", got)
	}
	if !strings.Contains(other.GetPushbackNote(), "cooldown:fleet") {
		t.Errorf("pushback note: got %q, want it to mention cooldown:fleet", other.GetPushbackNote())
	}
	// Admit refuses new attempts of that key until the hint passes.
	adm, err := h.workers.Admit(context.Background(), &pb.AdmitRequest{Call: call("acme", "geo", "w3"), Attempt: 1})
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	if adm.GetAdmitted() || adm.GetReason() != "cooldown:pushback" {
		t.Errorf("Admit: got admitted=%v reason=%q, want refused with cooldown:pushback", adm.GetAdmitted(), adm.GetReason())
	}
	// A different tenant is not held back.
	adm, err = h.workers.Admit(context.Background(), &pb.AdmitRequest{Call: call("globex", "geo", "x"), Attempt: 1})
	if err != nil || !adm.GetAdmitted() {
		t.Errorf("Admit for another tenant: got %v, %v, want admitted", adm.GetAdmitted(), err)
	}
	h.clock.Advance(121 * time.Second)
	adm, err = h.workers.Admit(context.Background(), &pb.AdmitRequest{Call: call("acme", "geo", "w3"), Attempt: 1})
	if err != nil || !adm.GetAdmitted() {
		t.Errorf("Admit after the hint: got %v (%s), %v, want admitted", adm.GetAdmitted(), adm.GetReason(), err)
	}
}

func TestNextDelayOpensTheBreaker(t *testing.T) {
	h := newHarness(t)
	var last *pb.NextDelayResponse
	for i := range 5 {
		last = nextDelay(t, h, &pb.NextDelayRequest{Call: call("acme", "geo", "c"+string(rune('a'+i))), Attempt: 1, Failure: http(503)})
	}
	if last.GetBreakerState() != pb.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("breaker after 5 transient failures: got %v, want OPEN", last.GetBreakerState())
	}
	if last.GetStopReason() != pb.StopReason_STOP_REASON_CIRCUIT_OPEN || last.GetDisposition() != pb.Disposition_DISPOSITION_CIRCUIT_OPEN {
		t.Errorf("got %v / %v, want CIRCUIT_OPEN / CIRCUIT_OPEN", last.GetStopReason(), last.GetDisposition())
	}
	st, err := h.admin.GetTenantBudget(context.Background(), &pb.GetTenantBudgetRequest{Tenant: "acme"})
	if err != nil {
		t.Fatalf("GetTenantBudget: %v", err)
	}
	// Four retries were granted; the circuit-open stop spent nothing.
	if got := st.GetStatus().GetRetriesGranted(); got != 4 {
		t.Errorf("retries granted: got %d, want 4", got)
	}
	adm, err := h.workers.Admit(context.Background(), &pb.AdmitRequest{Call: call("acme", "geo", "z"), Attempt: 1})
	if err != nil || adm.GetAdmitted() {
		t.Fatalf("Admit while OPEN: got %v, %v, want refused", adm.GetAdmitted(), err)
	}
	if adm.GetRetryAfter().AsDuration() <= 0 {
		t.Errorf("Admit retry_after: got %v, want the rest of the cooldown", adm.GetRetryAfter().AsDuration())
	}
}

func TestNextDelayTenantBudget(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{
		Tenant: "noisy", Capacity: 2, MinRetriesPerSecond: 0.0001}}); err != nil {
		t.Fatalf("SetTenantBudget: %v", err)
	}
	var stops int
	for i := range 4 {
		// Different targets, so no breaker trips.
		resp := nextDelay(t, h, &pb.NextDelayRequest{Call: call("noisy", "t"+string(rune('a'+i)), "c"+string(rune('a'+i))), Attempt: 1, Failure: http(503)})
		if resp.GetDecision() == pb.Decision_DECISION_STOP {
			stops++
			if resp.GetStopReason() != pb.StopReason_STOP_REASON_BUDGET_EXHAUSTED || resp.GetDisposition() != pb.Disposition_DISPOSITION_DEAD_LETTER {
				t.Errorf("got %v / %v, want BUDGET_EXHAUSTED / DEAD_LETTER", resp.GetStopReason(), resp.GetDisposition())
			}
		}
	}
	if stops != 2 {
		t.Errorf("stops: got %d, want 2 (capacity 2, cost 1)", stops)
	}
	// Another tenant is untouched.
	resp := nextDelay(t, h, &pb.NextDelayRequest{Call: call("quiet", "ta", "c"), Attempt: 1, Failure: http(503)})
	if resp.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Errorf("quiet tenant: got %v (%s), want RETRY", resp.GetDecision(), resp.GetDetail())
	}
}

func TestNextDelayRunPoolAndCutoff(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "r1", Tenant: "acme", RetryPool: 2,
		CutoffTime: timestamppb.New(h.clock.Now().Add(time.Hour))}); err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	in := func(id, target string) *pb.NextDelayRequest {
		c := call("acme", target, id)
		c.RunId = "r1"
		return &pb.NextDelayRequest{Call: c, Attempt: 1, Failure: http(503)}
	}
	got := []pb.StopReason{}
	for i := range 3 {
		got = append(got, nextDelay(t, h, in("c"+string(rune('a'+i)), "t"+string(rune('a'+i)))).GetStopReason())
	}
	want := []pb.StopReason{pb.StopReason_STOP_REASON_UNSPECIFIED, pb.StopReason_STOP_REASON_UNSPECIFIED, pb.StopReason_STOP_REASON_BUDGET_EXHAUSTED}
	if !slices.Equal(got, want) {
		t.Errorf("stop reasons: got %v, want %v", got, want)
	}
	h.clock.Advance(2 * time.Hour)
	resp := nextDelay(t, h, in("late", "tz"))
	if resp.GetDisposition() != pb.Disposition_DISPOSITION_DEADLINE_CUT {
		t.Errorf("after the cut-off: got %v %v, want DEADLINE_CUT", resp.GetStopReason(), resp.GetDisposition())
	}
}

func TestNextDelayUnknownRun(t *testing.T) {
	h := newHarness(t)
	c := call("acme", "geo", "c")
	c.RunId = "nope"
	_, err := h.workers.NextDelay(context.Background(), &pb.NextDelayRequest{Call: c, Attempt: 1, Failure: http(503)})
	wantCode(t, err, codes.NotFound)
}

func TestPlanBudget(t *testing.T) {
	h := newHarness(t)
	f := 2.0
	resp, err := h.workers.PlanBudget(context.Background(), &pb.PlanBudgetRequest{
		Window:         durationpb.New(72 * time.Hour),
		Backoff:        &pb.BackoffSettings{BaseDelay: durationpb.New(2 * time.Second), Factor: &f, MaxDelay: durationpb.New(time.Hour)},
		AttemptTimeout: durationpb.New(30 * time.Second),
		TtlMargin:      durationpb.New(6 * time.Hour),
	})
	if err != nil {
		t.Fatalf("PlanBudget: %v", err)
	}
	p := resp.GetPlan()
	var total time.Duration
	for _, d := range p.GetDelays() {
		total += d.AsDuration()
	}
	total += time.Duration(p.GetMaxAttempts()) * 30 * time.Second
	if total != p.GetWorstCaseTotal().AsDuration() || total > 72*time.Hour {
		t.Errorf("worst case: got %v (sum %v), want the sum and within 72h", p.GetWorstCaseTotal().AsDuration(), total)
	}
	if got, want := p.GetIdempotencyTtl().AsDuration(), 78*time.Hour; got != want {
		t.Errorf("ttl: got %v, want %v", got, want)
	}
	if got := int(p.GetMaxAttempts()); got != len(p.GetDelays())+1 {
		t.Errorf("attempts %d with %d delays", got, len(p.GetDelays()))
	}

	hops, err := h.workers.PlanBudget(context.Background(), &pb.PlanBudgetRequest{
		Window: durationpb.New(time.Minute), AttemptTimeout: durationpb.New(10 * time.Second), Hops: 3,
	})
	if err != nil {
		t.Fatalf("PlanBudget hops: %v", err)
	}
	if len(hops.GetHops()) != 3 {
		t.Fatalf("hops: got %d plans, want 3", len(hops.GetHops()))
	}
	for i := 1; i < 3; i++ {
		outer, inner := hops.GetHops()[i-1].GetWindow().AsDuration(), hops.GetHops()[i].GetWindow().AsDuration()
		if inner >= outer {
			t.Errorf("hop %d window %v is not strictly smaller than hop %d's %v", i+1, inner, i, outer)
		}
	}
}
