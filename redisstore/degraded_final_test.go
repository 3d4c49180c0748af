package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
)

// TestDegradedStopsReachTheLedgerAndCallTable: nothing a replica decided
// while its store was out of reach is lost from the run. Redis stopped
// (SIGSTOP) under a replica, NextDelays of calls of a run spend its share
// of the pool until one is answered STOP (BUDGET_EXHAUSTED), flagged
// degraded;
// the engine never stores that answer, yet the worker's final DEAD_LETTER
// (BUDGET_EXHAUSTED) reported after SIGCONT is taken: the run's ledger
// counts it and its call table lists it. A success reported while Redis
// was stopped is queued, replayed, counted and listed too.
func TestDegradedStopsReachTheLedgerAndCallTable(t *testing.T) {
	srv := redistest.Standalone(t)
	r := boundedReplica(t, srv.Addr)
	ctx := context.Background()
	if _, err := r.store.OpenRun(policy.Run{ID: "batch-1", Tenant: "acme", Pool: 2, Cutoff: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	call := func(id string) *pb.CallRef {
		return &pb.CallRef{Tenant: "acme", Target: "grants", CallId: id, Idempotent: true, RunId: "batch-1"}
	}
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	// One retry spent while Redis answers: the replica knows the run and
	// what is left of its pool (its share while the engine is down).
	if resp, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("warm"), Attempt: 1, Failure: fail503}); err != nil ||
		resp.GetDecision() != pb.Decision_DECISION_RETRY || resp.GetDegraded() {
		t.Fatalf("NextDelay before the pause = %v, %v; want RETRY, not degraded", resp, err)
	}

	srv.Pause(t)
	var stopped string // a call a degraded answer stopped (BUDGET_EXHAUSTED)
	n := 0
	eventually(t, "a degraded STOP (BUDGET_EXHAUSTED)", func() bool {
		n++
		id := "doc-" + strconv.Itoa(n)
		resp, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call(id), Attempt: 1, Failure: fail503})
		if err != nil {
			t.Fatalf("NextDelay with Redis stopped: %v (want an answer)", err)
		}
		if resp.GetDecision() == pb.Decision_DECISION_STOP && resp.GetStopReason() == pb.StopReason_STOP_REASON_BUDGET_EXHAUSTED {
			if !resp.GetDegraded() {
				t.Fatalf("NextDelay = %v: a stop the budget could not be consulted for is not flagged degraded", resp)
			}
			stopped = id
			return true
		}
		return false
	})
	ok := &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: call("queued-ok"), Attempt: 1, Success: true,
		FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}}}
	if _, err := r.workers.ReportOutcome(ctx, ok); err != nil {
		t.Fatalf("ReportOutcome with Redis stopped: %v", err)
	}

	srv.Resume(t)
	eventually(t, "the engine up and the queue replayed", func() bool { return r.store.Up() && r.store.Queued() == 0 })
	// The worker ends the call as policyd told it: the failure was told to
	// NextDelay, the final disposition is the stop it answered.
	dead := &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: call(stopped), Attempt: 1, AlreadyRecorded: true,
		FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER, FinalStopReason: pb.StopReason_STOP_REASON_BUDGET_EXHAUSTED}}}
	if _, err := r.workers.ReportOutcome(ctx, dead); err != nil {
		t.Fatalf("ReportOutcome of %s's DEAD_LETTER (BUDGET_EXHAUSTED) after a degraded STOP: %v (want it taken)", stopped, err)
	}

	run, err := r.admin.GetRun(ctx, &pb.GetRunRequest{RunId: "batch-1"})
	if err != nil {
		t.Fatal(err)
	}
	if l := run.GetRun().GetLedger(); l.GetDeadLetterBudget() != 1 || l.GetSucceeded() != 1 {
		t.Errorf("ledger %v, want dead_letter_budget 1 (%s) and succeeded 1 (queued-ok)", l, stopped)
	}
	calls, err := r.admin.ListRunCalls(ctx, &pb.ListRunCallsRequest{RunId: "batch-1", Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]pb.Disposition{}
	for _, c := range calls.GetCalls() {
		got[c.GetCallId()] = c.GetDisposition()
	}
	for id, want := range map[string]pb.Disposition{stopped: pb.Disposition_DISPOSITION_DEAD_LETTER,
		"queued-ok": pb.Disposition_DISPOSITION_SUCCEEDED} {
		if got[id] != want {
			t.Errorf("call table lists %s as %v, want %v (listed: %v)", id, got[id], want, got)
		}
	}
}

// TestDegradedDeadlineStopIsTakenOnAnotherReplica: a replica that could
// not reach Redis answers a retry whose wait would end past the call's
// deadline STOP (DEADLINE), flagged degraded, and is killed before it
// writes that answer to the engine. The worker's final DEAD_LETTER
// (DEADLINE), sent to another replica, is taken: that replica remembers
// no answer and the deadline is 30 s away, more than the attempt timeout
// (10 s), but the failure was told to NextDelay, whose wait (the 60 s
// the upstream asked for) no longer fit. Refusing it would lose the dead
// letter.
func TestDegradedDeadlineStopIsTakenOnAnotherReplica(t *testing.T) {
	srv := redistest.Standalone(t)
	a := boundedReplica(t, srv.Addr)
	b := boundedReplica(t, srv.Addr)
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	call := &pb.CallRef{Tenant: "acme", Target: "grants", CallId: "doc-1", Idempotent: true, DeadlineTime: timestamppb.New(deadline)}

	srv.Pause(t)
	a.until(t, "the engine seen down", func() bool { return !a.store.Up() })
	resp, err := a.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call, Attempt: 1,
		Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}, Pushback: &pb.Pushback{RetryAfter: "60"}})
	if err != nil || resp.GetDecision() != pb.Decision_DECISION_STOP || resp.GetStopReason() != pb.StopReason_STOP_REASON_DEADLINE || !resp.GetDegraded() {
		t.Fatalf("NextDelay with Redis stopped = %v, %v; want STOP (DEADLINE), flagged degraded", resp, err)
	}
	a.stop() // killed before its next flush: the engine never gets the answer
	srv.Resume(t)
	eventually(t, "the other replica's engine up", b.store.Up)

	dead := &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: call, Attempt: 1, AlreadyRecorded: true,
		FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER, FinalStopReason: pb.StopReason_STOP_REASON_DEADLINE}}}
	if _, err := b.workers.ReportOutcome(ctx, dead); err != nil {
		t.Fatalf("ReportOutcome of the DEAD_LETTER (DEADLINE) a killed replica decided in degraded mode: %v (want it taken)", err)
	}
}

// TestDegradedTerminalStopIsTakenOnAnotherReplica: a call's first failure
// is answered RETRY while Redis answers; its second, a 422, is answered
// STOP (TERMINAL) by a replica that cannot reach Redis, killed before it
// writes that answer. The worker's final FAILED_TERMINAL of attempt 2,
// sent to another replica, is taken: the answer that replica reads is
// attempt 1's RETRY of a transient failure, an earlier attempt than the
// one reported, whose failure was told to NextDelay. Refused before
// ("policyd classified this call's failure transient and answered RETRY"),
// as in a stop-redis fault test, which lost the call from the ledger.
func TestDegradedTerminalStopIsTakenOnAnotherReplica(t *testing.T) {
	srv := redistest.Standalone(t)
	a := boundedReplica(t, srv.Addr)
	b := boundedReplica(t, srv.Addr)
	ctx := context.Background()
	call := &pb.CallRef{Tenant: "acme", Target: "grants", CallId: "doc-1", Idempotent: true}
	if resp, err := a.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call, Attempt: 1,
		Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}}); err != nil || resp.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("NextDelay of attempt 1 = %v, %v; want RETRY", resp, err)
	}

	srv.Pause(t)
	a.until(t, "the engine seen down", func() bool { return !a.store.Up() })
	resp, err := a.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call, Attempt: 2,
		Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 422}}})
	if err != nil || resp.GetDecision() != pb.Decision_DECISION_STOP || resp.GetStopReason() != pb.StopReason_STOP_REASON_TERMINAL {
		t.Fatalf("NextDelay of attempt 2 with Redis stopped = %v, %v; want STOP (TERMINAL)", resp, err)
	}
	a.stop() // killed before its next flush: the engine never gets the answer
	srv.Resume(t)
	eventually(t, "the other replica's engine up", b.store.Up)

	final := &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: call, Attempt: 2, AlreadyRecorded: true,
		FinalDisposition: pb.Disposition_DISPOSITION_FAILED_TERMINAL}}}
	if _, err := b.workers.ReportOutcome(ctx, final); err != nil {
		t.Fatalf("ReportOutcome of the FAILED_TERMINAL a killed replica decided in degraded mode: %v (want it taken)", err)
	}
	// The same final of attempt 1, whose answer (RETRY) is remembered, is
	// still refused: policyd told that attempt to retry.
	final.Outcomes[0].Attempt = 1
	final.Outcomes[0].Call = &pb.CallRef{Tenant: "acme", Target: "grants", CallId: "doc-1", Idempotent: true}
	if _, err := b.workers.ReportOutcome(ctx, final); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ReportOutcome of FAILED_TERMINAL for attempt 1, answered RETRY: %v; want INVALID_ARGUMENT", err)
	}
}
