package storetest

import (
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// testOrder: on one replica a breaker takes the outcomes reported through
// ApplyOutcomes and a decision's result (Record, as NextDelay records a
// failure) in the order they were made, however the engine batches the
// outcomes: a failure recorded after a reported success counts from that
// success, and one recorded after reported failures counts after them,
// in the answer of the Record itself; an admin reset of a breaker comes
// after the outcomes reported before it; a run's call table takes an
// outcome's note before the note of the decision after it. Across
// replicas calls made at once have no order, and what one replica
// reports reaches the others within one flush (Engine.Settle); this case
// reads answers, and what outcomes changed only after it settles.
func testOrder(t *testing.T, e *env) {
	key := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	report := func(key policy.BreakerKey, r policy.Result, n int) {
		t.Helper()
		ups := make([]policy.OutcomeUpdate, n)
		for i := range ups {
			ups[i] = policy.OutcomeUpdate{Key: key, Breaker: breaker, Result: r}
		}
		if got, err := e.s.ApplyOutcomes(ups, nil); err != nil || got != n {
			t.Fatalf("ApplyOutcomes(%d × %v) = %d, %v; want %d, nil", n, r, got, err, n)
		}
		for i := range ups {
			if ups[i].Refused != nil {
				t.Fatalf("ApplyOutcomes(%d × %v): update %d refused: %v, want none", n, r, i, ups[i].Refused)
			}
		}
	}
	fail := func(what string, wantState policy.BreakerState, wantInARow int) {
		t.Helper()
		snap, err := e.record(key, policy.ResultTransientFailure, "")
		if err != nil || snap.State != wantState || (wantState == policy.BreakerClosed && snap.ConsecutiveFailures != wantInARow) {
			t.Fatalf("%s: Record(transient failure) = %v with %d in a row, %v; want %v with %d in a row, nil",
				what, snap.State, snap.ConsecutiveFailures, err, wantState, wantInARow)
		}
	}

	report(key, policy.ResultSuccess, 1)
	for i := range breaker.ConsecutiveFailures - 1 {
		fail("a failure after a success", policy.BreakerClosed, i+1)
	}
	// A success reported between the failures ends the run of them.
	report(key, policy.ResultSuccess, 1)
	fail("the first failure after a reported success", policy.BreakerClosed, 1)
	// Reported failures count before the decision that follows them: with
	// the one recorded above they make ConsecutiveFailures in a row with
	// the next recorded one, which opens the breaker.
	report(key, policy.ResultTransientFailure, breaker.ConsecutiveFailures-2)
	fail("the failure after reported failures", policy.BreakerOpen, 0)
	if got := e.snapshot(t, key); got.State != policy.BreakerOpen || got.Generation != 1 {
		t.Errorf("after %d failures in a row: generation %d %v, want generation 1 OPEN", breaker.ConsecutiveFailures, got.Generation, got.State)
	}

	// An admin reset comes after the failures reported before it: they do
	// not open the breaker it reset once they reach the engine.
	reset := policy.BreakerKey{Tenant: "acme", Target: "refunds"}
	report(reset, policy.ResultSuccess, 1)
	report(reset, policy.ResultTransientFailure, breaker.ConsecutiveFailures)
	if snap, err := e.s.ResetBreaker(reset); err != nil || snap.State != policy.BreakerClosed {
		t.Fatalf("ResetBreaker after %d reported failures = %v, %v; want CLOSED, nil", breaker.ConsecutiveFailures, snap.State, err)
	}
	e.settle()
	if got := e.snapshot(t, reset); got.State != policy.BreakerClosed || got.ConsecutiveFailures != 0 {
		t.Errorf("a breaker reset after %d reported failures: %v with %d in a row, want CLOSED with 0 (the reset after them)",
			breaker.ConsecutiveFailures, got.State, got.ConsecutiveFailures)
	}

	// A run's call table takes a reported outcome's note and the note of
	// the decision after it in that order: the call ends on the target
	// the later one names.
	run, err := e.s.OpenRun(policy.Run{Tenant: "acme", Pool: 10, Cutoff: e.clock.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("OpenRun = %v, want nil", err)
	}
	now := e.clock.Now()
	ups := []policy.OutcomeUpdate{{Key: key, Breaker: breaker, Result: policy.ResultTerminal, RunID: run.ID, CallID: "doc-1",
		Note: policy.CallNote{Target: "payments", Attempt: 1, Time: now}}}
	if n, err := e.s.ApplyOutcomes(ups, nil); err != nil || n != 1 || ups[0].Refused != nil {
		t.Fatalf("ApplyOutcomes(a terminal failure of doc-1 on payments) = %d, %v, refused %v; want 1, nil, none", n, err, ups[0].Refused)
	}
	if err := e.s.NoteCall(run.ID, "doc-1", policy.CallNote{Target: "payments-b", PrimaryTarget: "payments", Attempt: 2, Time: now}); err != nil {
		t.Fatalf("NoteCall(doc-1, attempt 2 on payments-b) = %v, want nil", err)
	}
	e.settle()
	calls, _, err := e.s.RunCalls(run.ID, policy.RunCallFilter{}, "", 0)
	if err != nil || len(calls) != 1 || calls[0].Target != "payments-b" || calls[0].PrimaryTarget != "payments" || calls[0].Attempts != 2 {
		t.Errorf("RunCalls after an outcome's note on payments and attempt 2's on payments-b = %+v, %v; want doc-1 on payments-b (primary payments), 2 attempts",
			calls, err)
	}
}
