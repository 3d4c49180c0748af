package server_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// twoTenants is a harness whose workers authenticate as tenant-a (token
// tok-a) or tenant-b (tok-b), as with --tenant-tokens-file.
func twoTenants(t *testing.T) *harness {
	t.Helper()
	return newHarness(t, func(c *server.Config, _ *breakerstore.Options) {
		c.Auth = server.NewAuth(server.AuthConfig{
			AdminTokens:  []string{"admin-secret"},
			TenantTokens: map[string]string{"tok-a": "tenant-a", "tok-b": "tenant-b"},
		})
	})
}

// halfOpenTargetBreaker puts target's breaker, shared by every tenant, in
// HALF_OPEN with one probe permit, handed to tenant-a, and returns it.
func halfOpenTargetBreaker(t *testing.T, h *harness, target string) string {
	t.Helper()
	one := uint32(1)
	if _, err := h.admin.SetPolicy(withToken("admin-secret"), &pb.SetPolicyRequest{Target: target, Policy: &pb.Policy{
		Breaker: &pb.BreakerSettings{Scope: pb.BreakerScope_BREAKER_SCOPE_TARGET, ConsecutiveFailures: &one,
			HalfOpenProbes: &one, Cooldown: durationpb.New(time.Minute), ProbeTimeout: durationpb.New(10 * time.Minute)},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.workers.NextDelay(withToken("tok-a"), &pb.NextDelayRequest{Call: call("tenant-a", target, "trip-"+target),
		Attempt: 1, Failure: http(503)}); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(61 * time.Second)
	a, err := h.workers.Admit(withToken("tok-a"), &pb.AdmitRequest{Call: call("tenant-a", target, "probe"), Attempt: 1})
	if err != nil || !a.GetAdmitted() || a.GetPermitId() == "" {
		t.Fatalf("Admit after the cooldown: %v, %v; want a probe permit", a, err)
	}
	return a.GetPermitId()
}

func breakerState(t *testing.T, h *harness, target string) pb.BreakerState {
	t.Helper()
	b, err := h.admin.GetBreaker(withToken("admin-secret"), &pb.GetBreakerRequest{Key: &pb.BreakerKey{Target: target}})
	if err != nil {
		t.Fatal(err)
	}
	return b.GetBreaker().GetState()
}

// TestForgedPermitCannotSettleAProbe: tenant-b cannot close (or reopen) the
// target-scoped breaker tenant-a is probing, neither with an invented
// permit nor with the permit of another breaker; the refusal is
// FAILED_PRECONDITION naming permit_id, and in a batch the other outcomes
// still apply. Before permits were checked, tenant-b's made-up permit
// closed the breaker.
func TestForgedPermitCannotSettleAProbe(t *testing.T) {
	h := twoTenants(t)
	probe := halfOpenTargetBreaker(t, h, "geo")
	otherPermit := halfOpenTargetBreaker(t, h, "maps")
	b := withToken("tok-b")

	invented := strings.Repeat("ab", 16)
	for _, forged := range []string{invented, "1", otherPermit} {
		resp, err := h.workers.ReportOutcome(b, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
			{Call: call("tenant-b", "elsewhere", "fine"), Attempt: 1, Success: true},
			{Call: call("tenant-b", "geo", "forger"), Attempt: 1, Success: true, PermitId: forged},
		}})
		if err != nil {
			t.Fatalf("ReportOutcome with permit %q: %v", forged, err)
		}
		if resp.GetAccepted() != 1 || len(resp.GetRefused()) != 1 {
			t.Fatalf("permit %q: accepted %d, refused %v; want 1 and the second outcome", forged, resp.GetAccepted(), resp.GetRefused())
		}
		r := resp.GetRefused()[0]
		if r.GetIndex() != 1 || codes.Code(r.GetCode()) != codes.FailedPrecondition || r.GetField() != "outcomes[1].permit_id" ||
			!strings.HasPrefix(r.GetMessage(), "outcomes[1].permit_id: ") {
			t.Fatalf("permit %q: refusal %v; want outcome 1, FAILED_PRECONDITION, outcomes[1].permit_id", forged, r)
		}
		if got := breakerState(t, h, "geo"); got != pb.BreakerState_BREAKER_STATE_HALF_OPEN {
			t.Fatalf("after a success with permit %q from tenant-b: %v, want HALF_OPEN", forged, got)
		}

		_, err = h.workers.NextDelay(b, &pb.NextDelayRequest{Call: call("tenant-b", "geo", "forger-"+forged),
			Attempt: 1, Failure: http(503), PermitId: forged})
		if msg := wantCode(t, err, codes.FailedPrecondition); !strings.Contains(msg, "permit_id") {
			t.Fatalf("NextDelay with permit %q: %q, want it to name permit_id", forged, msg)
		}
		if got := breakerState(t, h, "geo"); got != pb.BreakerState_BREAKER_STATE_HALF_OPEN {
			t.Fatalf("after a failure with permit %q from tenant-b: %v, want HALF_OPEN", forged, got)
		}
	}
	// A failure reported without any permit does not reopen it either.
	if _, err := h.workers.ReportOutcome(b, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("tenant-b", "geo", "no-permit"), Attempt: 1, Failure: http(503)}}}); err != nil {
		t.Fatal(err)
	}
	if got := breakerState(t, h, "geo"); got != pb.BreakerState_BREAKER_STATE_HALF_OPEN {
		t.Fatalf("after a failure without a permit: %v, want HALF_OPEN", got)
	}

	// The real probe settles it.
	if _, err := h.workers.ReportOutcome(withToken("tok-a"), &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("tenant-a", "geo", "probe"), Attempt: 1, Success: true, PermitId: probe}}}); err != nil {
		t.Fatal(err)
	}
	if got := breakerState(t, h, "geo"); got != pb.BreakerState_BREAKER_STATE_CLOSED {
		t.Fatalf("after the probe's success: %v, want CLOSED", got)
	}
	// Its permit is spent: presented again (now CLOSED) it is ignored.
	if _, err := h.workers.ReportOutcome(withToken("tok-a"), &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("tenant-a", "geo", "probe"), Attempt: 1, Success: true, PermitId: probe}}}); err != nil {
		t.Fatal(err)
	}
}

// TestRewoundAttemptIsRefused: the same attempt asked again gets the same
// answer and spends nothing twice; a lower attempt, or any attempt after a
// STOP, is FAILED_PRECONDITION naming attempt; call ids are scoped by
// tenant. Before attempts were remembered, attempt 1 sent after a STOP at
// attempt 3 got RETRY again, and every repeat spent a token.
func TestRewoundAttemptIsRefused(t *testing.T) {
	h := twoTenants(t)
	if _, err := h.admin.SetTenantBudget(withToken("admin-secret"), &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{
		Tenant: "tenant-b", Capacity: 1, MinRetriesPerSecond: 0.0001}}); err != nil {
		t.Fatal(err)
	}
	a, b := withToken("tok-a"), withToken("tok-b")
	nd := func(ctx context.Context, tenant, id string, attempt uint32) (*pb.NextDelayResponse, error) {
		return h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call(tenant, "geo", id), Attempt: attempt, Failure: http(503)})
	}
	first, err := nd(a, "tenant-a", "job", 1)
	if err != nil || first.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("attempt 1: %v, %v; want RETRY", first, err)
	}
	again, err := nd(a, "tenant-a", "job", 1)
	if err != nil || !proto.Equal(first, again) {
		t.Fatalf("attempt 1 again: %v, %v; want the same answer %v", again, err, first)
	}
	if r, err := nd(a, "tenant-a", "job", 2); err != nil || r.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("attempt 2: %v, %v; want RETRY", r, err)
	}
	if _, err := nd(a, "tenant-a", "job", 1); !strings.Contains(wantCode(t, err, codes.FailedPrecondition), "attempt: must be 3") {
		t.Fatalf("attempt 1 after 2: %v, want it to name attempt and expect 3", err)
	}
	stop, err := nd(a, "tenant-a", "job", 3)
	if err != nil || stop.GetStopReason() != pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED {
		t.Fatalf("attempt 3: %v, %v; want STOP ATTEMPTS_EXHAUSTED", stop, err)
	}
	for _, n := range []uint32{1, 2, 4} {
		_, err := nd(a, "tenant-a", "job", n)
		if msg := wantCode(t, err, codes.FailedPrecondition); !strings.HasPrefix(msg, "attempt: ") || !strings.Contains(msg, "STOP") {
			t.Fatalf("attempt %d after the STOP: %q, want it to name attempt and the STOP", n, msg)
		}
	}
	if r, err := nd(a, "tenant-a", "job", 3); err != nil || !proto.Equal(r, stop) {
		t.Fatalf("attempt 3 again: %v, %v; want the STOP again", r, err)
	}

	// tenant-b's call "job" is another call; its budget holds one retry,
	// which the repeated attempt does not spend again.
	if r, err := nd(b, "tenant-b", "job", 1); err != nil || r.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("tenant-b's job, attempt 1: %v, %v; want RETRY", r, err)
	}
	if r, err := nd(b, "tenant-b", "job", 1); err != nil || r.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("tenant-b's job, attempt 1 again: %v, %v; want RETRY replayed", r, err)
	}
	if r, err := nd(b, "tenant-b", "other", 1); err != nil || r.GetStopReason() != pb.StopReason_STOP_REASON_BUDGET_EXHAUSTED {
		t.Fatalf("tenant-b's next call: %v, %v; want BUDGET_EXHAUSTED (one token, spent once)", r, err)
	}
}

// TestDuplicateAttemptsAreDecidedOnce: 64 concurrent NextDelays of one
// attempt of one call (a client retrying the RPC while the first is in
// flight) get one answer, and the retry is spent once. Before the attempt
// check and its record were one claim, several could be decided, each
// with its own jittered delay and its own spend.
func TestDuplicateAttemptsAreDecidedOnce(t *testing.T) {
	h := twoTenants(t)
	a := withToken("tok-a")
	const n = 64
	answers := make([]*pb.NextDelayResponse, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r, err := h.workers.NextDelay(a, &pb.NextDelayRequest{Call: call("tenant-a", "geo", "dup"), Attempt: 1, Failure: http(503)})
			if err != nil {
				t.Errorf("NextDelay %d: %v", i, err)
			}
			answers[i] = r
		})
	}
	wg.Wait()
	for i, r := range answers {
		if !proto.Equal(r, answers[0]) {
			t.Fatalf("answer %d: %v, want the same as answer 0: %v", i, r, answers[0])
		}
	}
	if st, err := h.store.Budget("tenant-a"); err != nil || st.Granted != 1 {
		t.Errorf("tenant-a's budget: %d granted, %v; want the one retry spent once", st.Granted, err)
	}
}

// TestFailedDecisionLetsGoOfTheAttempt: a NextDelay refused after it
// claimed its attempt (its run does not exist) lets go of the claim, so the
// same attempt asked again is decided, not left waiting.
func TestFailedDecisionLetsGoOfTheAttempt(t *testing.T) {
	h := twoTenants(t)
	ref := call("tenant-a", "geo", "lost-run")
	ref.RunId = "no-such-run"
	_, err := h.workers.NextDelay(withToken("tok-a"), &pb.NextDelayRequest{Call: ref, Attempt: 1, Failure: http(503)})
	wantCode(t, err, codes.NotFound)
	ctx, cancel := context.WithTimeout(withToken("tok-a"), 10*time.Second)
	defer cancel()
	r, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("tenant-a", "geo", "lost-run"), Attempt: 1, Failure: http(503)})
	if err != nil || r.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("the attempt again, without the run: %v, %v; want RETRY", r, err)
	}
}

// TestLyingLedgerIsRefused: a final disposition that contradicts the
// outcome or what policyd decided for the call is INVALID_ARGUMENT naming
// outcomes[i].final_disposition, and the ledger is unchanged; the truth is
// counted. Before, success=false with a 503 and SUCCEEDED counted as
// succeeded, and DEADLINE_CUT before the deadline, FAILED_TERMINAL for a
// 503 and a DEAD_LETTER policyd never decided were all accepted.
func TestLyingLedgerIsRefused(t *testing.T) {
	h := twoTenants(t)
	admin, a, b := withToken("admin-secret"), withToken("tok-a"), withToken("tok-b")
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		if _, err := h.admin.OpenRun(admin, &pb.OpenRunRequest{RunId: "run-" + tenant, Tenant: tenant, RetryPool: 10,
			CutoffTime: timestampIn(h, time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	ref := func(tenant, id string) *pb.CallRef {
		c := call(tenant, "geo", id)
		c.RunId = "run-" + tenant
		return c
	}
	// tenant-a's call "x" is stopped by policyd: attempts exhausted.
	stop, err := h.workers.NextDelay(a, &pb.NextDelayRequest{Call: ref("tenant-a", "x"), Attempt: 3, Failure: http(503)})
	if err != nil || stop.GetDisposition() != pb.Disposition_DISPOSITION_DEAD_LETTER {
		t.Fatalf("NextDelay: %v, %v; want STOP DEAD_LETTER", stop, err)
	}
	// tenant-b's call "y" is told to retry.
	if _, err := h.workers.NextDelay(b, &pb.NextDelayRequest{Call: ref("tenant-b", "y"), Attempt: 1, Failure: http(503)}); err != nil {
		t.Fatal(err)
	}
	deadline := ref("tenant-b", "z")
	deadline.DeadlineTime = timestampIn(h, time.Minute)

	lies := []struct {
		name string
		ctx  context.Context
		o    *pb.Outcome
		rule string
	}{
		{"SUCCEEDED for a failed attempt", b, &pb.Outcome{Call: ref("tenant-b", "s"), Attempt: 1, Failure: http(503),
			FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}, "SUCCEEDED needs success"},
		{"FAILED_TERMINAL for a 503", b, &pb.Outcome{Call: ref("tenant-b", "t"), Attempt: 1, Failure: http(503),
			FinalDisposition: pb.Disposition_DISPOSITION_FAILED_TERMINAL, FinalStopReason: pb.StopReason_STOP_REASON_TERMINAL}, "terminal classification"},
		{"FAILED_TERMINAL after policyd said RETRY", b, &pb.Outcome{Call: ref("tenant-b", "y"), Attempt: 1, AlreadyRecorded: true,
			FinalDisposition: pb.Disposition_DISPOSITION_FAILED_TERMINAL}, "answered RETRY"},
		{"another stop than policyd decided", a, &pb.Outcome{Call: ref("tenant-a", "x"), Attempt: 3, AlreadyRecorded: true,
			FinalDisposition: pb.Disposition_DISPOSITION_FAILED_TERMINAL}, "must be DEAD_LETTER"},
		{"DEAD_LETTER for a call policyd never saw fail", b, &pb.Outcome{Call: ref("tenant-b", "x"), Attempt: 3, AlreadyRecorded: true,
			FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER, FinalStopReason: pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED}, "DEAD_LETTER needs"},
		{"CIRCUIT_OPEN with the breaker CLOSED", b, &pb.Outcome{Call: ref("tenant-b", "y"), Attempt: 1, AlreadyRecorded: true,
			FinalDisposition: pb.Disposition_DISPOSITION_CIRCUIT_OPEN}, "CIRCUIT_OPEN needs"},
		{"DEADLINE_CUT before the cut-off", b, &pb.Outcome{Call: deadline, Attempt: 1, Failure: http(503),
			FinalDisposition: pb.Disposition_DISPOSITION_DEADLINE_CUT}, "DEADLINE_CUT needs"},
		{"DEAD_LETTER (DEADLINE) before the deadline", b, &pb.Outcome{Call: deadline, Attempt: 1, Failure: http(503),
			FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER, FinalStopReason: pb.StopReason_STOP_REASON_DEADLINE}, "DEAD_LETTER (DEADLINE) needs"},
	}
	for _, lie := range lies {
		fine := &pb.Outcome{Call: lie.o.GetCall(), Attempt: 1, Success: true}
		fine.Call = call(lie.o.GetCall().GetTenant(), "geo", "fine")
		_, err := h.workers.ReportOutcome(lie.ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{fine, lie.o}})
		msg := wantCode(t, err, codes.InvalidArgument)
		if !strings.HasPrefix(msg, "outcomes[1].final_disposition: ") || !strings.Contains(msg, lie.rule) {
			t.Errorf("%s: %q, want outcomes[1].final_disposition and %q", lie.name, msg, lie.rule)
		}
	}
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		run, err := h.admin.GetRun(admin, &pb.GetRunRequest{RunId: "run-" + tenant})
		if err != nil {
			t.Fatal(err)
		}
		if l := run.GetRun().GetLedger(); proto.Size(l) != 0 {
			t.Errorf("%s's ledger after refused lies: %v, want empty", tenant, l)
		}
	}

	// The truth is counted: policyd's stop for "x", tenant-b's past the
	// deadline.
	if _, err := h.workers.ReportOutcome(a, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: ref("tenant-a", "x"), Attempt: 3,
		AlreadyRecorded: true, FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER,
		FinalStopReason: pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED}}}); err != nil {
		t.Fatalf("policyd's own stop: %v", err)
	}
	h.clock.Advance(2 * time.Minute)
	if _, err := h.workers.ReportOutcome(b, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: deadline, Attempt: 1,
		Failure: http(503), FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER,
		FinalStopReason: pb.StopReason_STOP_REASON_DEADLINE}}}); err != nil {
		t.Fatalf("a dead letter past the deadline: %v", err)
	}
	ra, _ := h.admin.GetRun(admin, &pb.GetRunRequest{RunId: "run-tenant-a"})
	rb, _ := h.admin.GetRun(admin, &pb.GetRunRequest{RunId: "run-tenant-b"})
	if ra.GetRun().GetLedger().GetDeadLetterExhausted() != 1 || rb.GetRun().GetLedger().GetDeadLetterDeadline() != 1 {
		t.Errorf("ledgers: %v and %v, want one DEAD_LETTER and one DEAD_LETTER (DEADLINE)", ra.GetRun().GetLedger(), rb.GetRun().GetLedger())
	}
}

// TestFirstFinalDispositionWins: once a call's final disposition is in its
// run's ledger, a later different one (each agreeing with its own outcome)
// is refused in the batch, FAILED_PRECONDITION naming
// outcomes[i].final_disposition and the disposition in force, and the
// ledger is unchanged; the same one again is taken and counts once; the
// rest of the batch applies. Before, the later one moved the count.
func TestFirstFinalDispositionWins(t *testing.T) {
	h := twoTenants(t)
	admin, b := withToken("admin-secret"), withToken("tok-b")
	if _, err := h.admin.OpenRun(admin, &pb.OpenRunRequest{RunId: "run-b", Tenant: "tenant-b", RetryPool: 10,
		CutoffTime: timestampIn(h, time.Hour)}); err != nil {
		t.Fatal(err)
	}
	ref := func(id string) *pb.CallRef {
		c := call("tenant-b", "geo", id)
		c.RunId = "run-b"
		return c
	}
	succeeded := &pb.Outcome{Call: ref("q"), Attempt: 1, Success: true, FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}
	if _, err := h.workers.ReportOutcome(b, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{succeeded}}); err != nil {
		t.Fatalf("the first final disposition: %v", err)
	}
	later := &pb.Outcome{Call: ref("q"), Attempt: 2, Failure: http(503), FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER,
		FinalStopReason: pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED}
	other := &pb.Outcome{Call: ref("r"), Attempt: 1, Success: true, FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}
	resp, err := h.workers.ReportOutcome(b, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{other, later, succeeded}})
	if err != nil {
		t.Fatalf("ReportOutcome with a later disposition: %v", err)
	}
	if resp.GetAccepted() != 2 || len(resp.GetRefused()) != 1 {
		t.Fatalf("accepted %d, refused %v; want 2 and the second outcome", resp.GetAccepted(), resp.GetRefused())
	}
	r := resp.GetRefused()[0]
	if r.GetIndex() != 1 || codes.Code(r.GetCode()) != codes.FailedPrecondition || r.GetField() != "outcomes[1].final_disposition" ||
		!strings.HasPrefix(r.GetMessage(), "outcomes[1].final_disposition: already final as SUCCEEDED") {
		t.Fatalf("refusal %v; want outcome 1, FAILED_PRECONDITION, outcomes[1].final_disposition: already final as SUCCEEDED", r)
	}
	run, err := h.admin.GetRun(admin, &pb.GetRunRequest{RunId: "run-b"})
	if err != nil {
		t.Fatal(err)
	}
	if l := run.GetRun().GetLedger(); l.GetSucceeded() != 2 || l.GetDeadLetterExhausted() != 0 {
		t.Errorf("ledger %v, want 2 succeeded (q once, r) and no DEAD_LETTER", l)
	}
}
