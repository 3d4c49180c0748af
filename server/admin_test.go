package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

func TestTenantBudgetsCRUD(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	set, err := h.admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "acme", Capacity: 100, DepositRatio: 0.1}})
	if err != nil {
		t.Fatalf("SetTenantBudget: %v", err)
	}
	// Unset numbers take the documented defaults.
	if b := set.GetBudget(); b.GetCapacity() != 100 || b.GetDepositRatio() != 0.1 || b.GetRetryCost() != 1 || b.GetTimeoutCost() != 2 {
		t.Errorf("stored budget: got %v", b)
	}
	for i := range 5 {
		if _, err := h.admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: fmt.Sprintf("t%d", i)}}); err != nil {
			t.Fatalf("SetTenantBudget: %v", err)
		}
	}
	var names []string
	tok := ""
	for {
		page, err := h.admin.ListTenantBudgets(ctx, &pb.ListTenantBudgetsRequest{PageSize: 4, PageToken: tok})
		if err != nil {
			t.Fatalf("ListTenantBudgets: %v", err)
		}
		for _, b := range page.GetBudgets() {
			names = append(names, b.GetBudget().GetTenant())
		}
		if tok = page.GetNextPageToken(); tok == "" {
			break
		}
	}
	if fmt.Sprint(names) != "[acme t0 t1 t2 t3 t4]" {
		t.Errorf("listed: got %v, want [acme t0 t1 t2 t3 t4]", names)
	}
	if _, err := h.admin.DeleteTenantBudget(ctx, &pb.DeleteTenantBudgetRequest{Tenant: "t0"}); err != nil {
		t.Fatalf("DeleteTenantBudget: %v", err)
	}
	_, err = h.admin.DeleteTenantBudget(ctx, &pb.DeleteTenantBudgetRequest{Tenant: "t0"})
	wantCode(t, err, codes.NotFound)
}

func TestPoliciesPrecedence(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	set := func(tenant, target string, attempts uint32) {
		t.Helper()
		if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: tenant, Target: target, Policy: &pb.Policy{MaxAttempts: &attempts}}); err != nil {
			t.Fatalf("SetPolicy(%q, %q): %v", tenant, target, err)
		}
	}
	set("acme", "", 4)
	set("", "geo", 5)
	set("acme", "geo", 6)
	tests := []struct {
		tenant, target string
		want           uint32
	}{
		{"acme", "geo", 6},  // tenant and target
		{"other", "geo", 5}, // target
		{"acme", "mail", 4}, // tenant
		{"other", "mail", 3},
	}
	for _, tc := range tests {
		resp, err := h.admin.GetPolicy(ctx, &pb.GetPolicyRequest{Tenant: tc.tenant, Target: tc.target, Effective: true})
		if err != nil {
			t.Fatalf("GetPolicy: %v", err)
		}
		if got := resp.GetEntry().GetPolicy().GetMaxAttempts(); got != tc.want {
			t.Errorf("%s/%s: got %d attempts, want %d", tc.tenant, tc.target, got, tc.want)
		}
	}
	list, err := h.admin.ListPolicies(ctx, &pb.ListPoliciesRequest{})
	if err != nil || len(list.GetEntries()) != 3 {
		t.Fatalf("ListPolicies: got %d entries, %v; want 3", len(list.GetEntries()), err)
	}
	if _, err := h.admin.DeletePolicy(ctx, &pb.DeletePolicyRequest{Tenant: "acme", Target: "geo"}); err != nil {
		t.Fatalf("DeletePolicy: %v", err)
	}
	resp, err := h.admin.GetPolicy(ctx, &pb.GetPolicyRequest{Tenant: "acme", Target: "geo", Effective: true})
	if err != nil || resp.GetEntry().GetPolicy().GetMaxAttempts() != 5 {
		t.Errorf("after delete: got %d, %v; want 5 (the target policy)", resp.GetEntry().GetPolicy().GetMaxAttempts(), err)
	}
}

func TestPolicyChangesDecisionsAtRuntime(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	req := &pb.NextDelayRequest{Call: call("acme", "geo", "c"), Attempt: 3, Failure: http(503)}
	if resp := nextDelay(t, h, req); resp.GetStopReason() != pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED {
		t.Fatalf("default policy: got %v, want ATTEMPTS_EXHAUSTED at attempt 3", resp.GetStopReason())
	}
	five := uint32(5)
	if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Policy: &pb.Policy{MaxAttempts: &five,
		Backoff: &pb.BackoffSettings{Jitter: pb.Jitter_JITTER_NONE}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	req.Call.CallId = "c2" // another call: "c" was stopped, and its attempt 3 answered
	resp := nextDelay(t, h, req)
	if resp.GetDecision() != pb.Decision_DECISION_RETRY || resp.GetDelay().AsDuration() != 2*time.Second {
		t.Errorf("after SetPolicy: got %v after %v, want RETRY after 2s (0.5s x 2^2, no jitter)", resp.GetDecision(), resp.GetDelay().AsDuration())
	}
}

func TestBreakersAdminAndWatch(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := &pb.BreakerKey{Tenant: "acme", Target: "geo"}

	// A breaker exists once traffic reached it.
	adm, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "geo", "c"), Attempt: 1})
	if err != nil || !adm.GetAdmitted() {
		t.Fatalf("Admit: %v, %v", adm, err)
	}
	stream, err := h.workers.WatchBreakers(ctx, &pb.WatchBreakersRequest{Tenant: "acme"})
	if err != nil {
		t.Fatalf("WatchBreakers: %v", err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	if !first.GetSnapshot() || first.GetBreaker().GetState() != pb.BreakerState_BREAKER_STATE_CLOSED {
		t.Errorf("first message: got snapshot=%v state=%v, want the CLOSED snapshot", first.GetSnapshot(), first.GetBreaker().GetState())
	}
	done, err := stream.Recv()
	if err != nil || !done.GetSnapshotComplete() || done.GetBreaker() != nil {
		t.Fatalf("second message: got %v, %v; want the end of the snapshot", done, err)
	}

	forced, err := h.admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: key, State: pb.BreakerState_BREAKER_STATE_OPEN})
	if err != nil {
		t.Fatalf("ForceBreaker: %v", err)
	}
	if !forced.GetBreaker().GetForced() || forced.GetBreaker().GetState() != pb.BreakerState_BREAKER_STATE_OPEN {
		t.Errorf("forced: got %v", forced.GetBreaker())
	}
	change, err := stream.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	if change.GetSnapshot() || change.GetBreaker().GetState() != pb.BreakerState_BREAKER_STATE_OPEN {
		t.Errorf("change: got snapshot=%v state=%v, want an OPEN change", change.GetSnapshot(), change.GetBreaker().GetState())
	}
	adm, err = h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "geo", "c"), Attempt: 1})
	if err != nil || adm.GetAdmitted() {
		t.Errorf("Admit while forced open: got %v, %v, want refused", adm.GetAdmitted(), err)
	}
	list, err := h.admin.ListBreakers(ctx, &pb.ListBreakersRequest{State: pb.BreakerState_BREAKER_STATE_OPEN})
	if err != nil || len(list.GetBreakers()) != 1 {
		t.Fatalf("ListBreakers(OPEN): got %d, %v; want 1", len(list.GetBreakers()), err)
	}
	reset, err := h.admin.ResetBreaker(ctx, &pb.ResetBreakerRequest{Key: key})
	if err != nil || reset.GetBreaker().GetState() != pb.BreakerState_BREAKER_STATE_CLOSED || reset.GetBreaker().GetForced() {
		t.Fatalf("ResetBreaker: got %v, %v; want CLOSED, unforced", reset.GetBreaker(), err)
	}
	change, err = stream.Recv()
	if err != nil || change.GetBreaker().GetState() != pb.BreakerState_BREAKER_STATE_CLOSED {
		t.Errorf("change after reset: got %v, %v; want CLOSED", change.GetBreaker().GetState(), err)
	}
}

func TestRunLedgerThroughReportOutcome(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "nightly", Tenant: "acme", RetryPool: 10,
		CutoffTime: timestampIn(h, time.Hour)}); err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	// Each final disposition comes with what justifies it (a ledger cannot
	// be told lies): the failure, an open breaker, a deadline passed.
	if _, err := h.admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "down"},
		State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
		t.Fatalf("ForceBreaker: %v", err)
	}
	out := func(id string, f *pb.Failure, d pb.Disposition, r pb.StopReason) *pb.Outcome {
		c := call("acme", "geo", id)
		c.RunId = "nightly"
		o := &pb.Outcome{Call: c, Attempt: 1, Success: f == nil, FinalDisposition: d, FinalStopReason: r,
			Latency: durationpb.New(time.Millisecond), Failure: f}
		return o
	}
	cut := out("g", http(503), pb.Disposition_DISPOSITION_DEAD_LETTER, pb.StopReason_STOP_REASON_DEADLINE)
	cut.Call.DeadlineTime = timestampIn(h, -time.Second)
	open := out("f", nil, pb.Disposition_DISPOSITION_CIRCUIT_OPEN, pb.StopReason_STOP_REASON_CIRCUIT_OPEN)
	open.Success, open.AlreadyRecorded, open.Call.Target = false, true, "down"
	batch := []*pb.Outcome{
		out("a", nil, pb.Disposition_DISPOSITION_SUCCEEDED, 0),
		out("b", nil, pb.Disposition_DISPOSITION_SUCCEEDED, 0),
		out("c", http(422), pb.Disposition_DISPOSITION_FAILED_TERMINAL, pb.StopReason_STOP_REASON_TERMINAL),
		out("d", http(503), pb.Disposition_DISPOSITION_DEAD_LETTER, pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED),
		out("e", http(503), pb.Disposition_DISPOSITION_DEAD_LETTER, pb.StopReason_STOP_REASON_BUDGET_EXHAUSTED),
		open,
		cut,
		out("a", nil, pb.Disposition_DISPOSITION_SUCCEEDED, 0), // reported twice: counted once
	}
	resp, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: batch})
	if err != nil || resp.GetAccepted() != uint32(len(batch)) {
		t.Fatalf("ReportOutcome: %v, %v", resp, err)
	}
	run, err := h.admin.GetRun(ctx, &pb.GetRunRequest{RunId: "nightly"})
	if err != nil {
		t.Fatalf("GetRun: %v", err)
	}
	l := run.GetRun().GetLedger()
	got := []uint64{l.GetSucceeded(), l.GetFailedTerminal(), l.GetDeadLetterExhausted(), l.GetDeadLetterBudget(), l.GetCircuitOpen(), l.GetDeadLetterDeadline()}
	if fmt.Sprint(got) != "[2 1 1 1 1 1]" {
		t.Errorf("ledger: got %v, want [2 1 1 1 1 1]", got)
	}
}

func timestampIn(h *harness, d time.Duration) *timestamppb.Timestamp {
	return timestamppb.New(h.clock.Now().Add(d))
}

// panicStore panics in Resolve, standing in for a handler bug.
type panicStore struct{ server.Store }

func (panicStore) Resolve(string, string) (policy.Policy, policy.PolicyEntry) { panic("bug") }

func TestRecoveryInterceptorKeepsServing(t *testing.T) {
	h := newHarnessWrapped(t, func(s server.Store) server.Store { return panicStore{s} })
	ctx := context.Background()
	_, err := h.workers.Classify(ctx, &pb.ClassifyRequest{Call: call("a", "t", ""), Failure: http(503)})
	msg := wantCode(t, err, codes.Internal)
	if msg == "bug" {
		t.Errorf("the panic value leaked to the client: %q", msg)
	}
	// The daemon is still up: an RPC that does not hit the bug answers.
	if _, err := h.workers.PlanBudget(ctx, &pb.PlanBudgetRequest{Window: durationpb.New(time.Minute)}); err != nil {
		t.Errorf("PlanBudget after a panic: %v", err)
	}
}
