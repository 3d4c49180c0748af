package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
)

// TestDegradedAnswersAreRemembered: a NextDelay a replica answered while
// Redis was stopped (SIGSTOP) is remembered as any answer is. Asked again
// on that replica, while Redis is stopped and after SIGCONT, it gets the
// same answer (the retry is not granted twice: the budget left it names
// is the same); once the engine answers, the replica writes its record
// there, so another replica replays it too and refuses an attempt after
// a STOP the first one answered alone.
func TestDegradedAnswersAreRemembered(t *testing.T) {
	srv := redistest.Standalone(t)
	r := boundedPair(t, srv.Addr)
	ctx := context.Background()
	call := func(id string) *pb.CallRef {
		return &pb.CallRef{Tenant: "acme", Target: "pay", CallId: id, Idempotent: true}
	}
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	fail422 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 422}}
	// A retry granted while Redis answers: replica 0 holds a share of
	// acme's budget to grant from alone.
	if resp, err := r[0].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("warm"), Attempt: 1, Failure: fail503}); err != nil ||
		resp.GetDecision() != pb.Decision_DECISION_RETRY || resp.GetDegraded() {
		t.Fatalf("NextDelay before the pause = %v, %v; want RETRY, not degraded", resp, err)
	}

	srv.Pause(t)
	r[0].until(t, "the engine down", func() bool { return !r[0].store.Up() })
	retried := &pb.NextDelayRequest{Call: call("retried"), Attempt: 1, Failure: fail503}
	first, err := r[0].workers.NextDelay(ctx, retried)
	if err != nil || first.GetDecision() != pb.Decision_DECISION_RETRY || !first.GetDegraded() {
		t.Fatalf("NextDelay with Redis stopped = %v, %v; want RETRY from the replica's share, flagged degraded", first, err)
	}
	stopped := &pb.NextDelayRequest{Call: call("stopped"), Attempt: 1, Failure: fail422}
	stop, err := r[0].workers.NextDelay(ctx, stopped)
	if err != nil || stop.GetDecision() != pb.Decision_DECISION_STOP || !stop.GetDegraded() {
		t.Fatalf("NextDelay of a 422 with Redis stopped = %v, %v; want STOP, flagged degraded", stop, err)
	}
	again, err := r[0].workers.NextDelay(ctx, retried)
	if err != nil || !proto.Equal(again, first) {
		t.Fatalf("the same NextDelay again with Redis stopped = %v, %v; want its first answer %v", again, err, first)
	}
	if n := r[0].store.DegradedAttempts(); n < 2 {
		t.Fatalf("DegradedAttempts = %d with Redis stopped; want the 2 answered (and those of the calls that found it down)", n)
	}
	if n := r[0].store.DegradedAttemptsNotKept(); n != 0 {
		t.Errorf("DegradedAttemptsNotKept = %d, want 0: far fewer than the bound were decided", n)
	}

	srv.Resume(t)
	r[0].until(t, "the engine up", func() bool { return r[0].store.Up() })
	eventually(t, "the degraded answers written to the engine", func() bool { return r[0].store.DegradedAttempts() == 0 })
	for i := range r {
		got, err := r[i].workers.NextDelay(ctx, retried)
		if err != nil || !proto.Equal(got, first) {
			t.Errorf("replica %d: the same NextDelay after SIGCONT = %v, %v; want the answer of the outage %v", i, got, err, first)
		}
	}
	next := &pb.NextDelayRequest{Call: call("stopped"), Attempt: 2, Failure: fail503}
	if resp, err := r[1].workers.NextDelay(ctx, next); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "no attempt follows a STOP") {
		t.Errorf("replica 1: attempt 2 after the STOP replica 0 answered in the outage = %v, %v; want FailedPrecondition, no attempt follows a STOP", resp, err)
	}
}

// TestAttemptWrittenLateLeavesTheFirst: policyd_attempt with its "first"
// argument, as a replica writes an answer it decided while the engine was
// down, stores an attempt the engine does not hold, and a later one, but
// leaves the same attempt stored before as it is: that answer came first.
func TestAttemptWrittenLateLeavesTheFirst(t *testing.T) {
	srv := redistest.Standalone(t)
	boundedReplica(t, srv.Addr) // loads the library
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	key := "{acme}:attempt:late"
	keep := time.Now().Add(time.Hour).UnixMilli()
	write := func(attempt int, answer string, first bool) int64 {
		t.Helper()
		args := []any{"", attempt, answer, keep}
		if first {
			args = append(args, 1)
		}
		n, err := c.FCall(ctx, "policyd_attempt", []string{key}, args...).Int64()
		if err != nil {
			t.Fatalf("policyd_attempt(%d, %q, first %v): %v", attempt, answer, first, err)
		}
		return n
	}
	stored := func() string { t.Helper(); return c.HGet(ctx, key, "answer").Val() }
	if n := write(1, "late-1", true); n != 1 || stored() != "late-1" {
		t.Fatalf("first write of attempt 1 = %d, answer %q; want it stored", n, stored())
	}
	if n := write(1, "later-1", true); n != 0 || stored() != "late-1" {
		t.Errorf("attempt 1 written again as first = %d, answer %q; want the stored one left (late-1)", n, stored())
	}
	if n := write(1, "decided-1", false); n != 1 || stored() != "decided-1" {
		t.Errorf("attempt 1 written without first = %d, answer %q; want it replaced, as a decision writes it", n, stored())
	}
	if n := write(2, "late-2", true); n != 1 || stored() != "late-2" {
		t.Errorf("a later attempt written as first = %d, answer %q; want it stored", n, stored())
	}
	if n := write(1, "late-1", true); n != 0 || stored() != "late-2" {
		t.Errorf("an earlier attempt written as first = %d, answer %q; want nothing rewound", n, stored())
	}
}

// TestDegradedFinalOfALaterAttemptIsTaken: while Redis is stopped, one
// replica answers attempt 1 of a call RETRY and another answers attempt 2
// STOP (a 422); the worker's FAILED_TERMINAL reported to the first is
// taken, not checked against the RETRY it remembers (the later attempt
// was answered elsewhere), and once both replicas have written their
// records, Redis holds the STOP.
func TestDegradedFinalOfALaterAttemptIsTaken(t *testing.T) {
	srv := redistest.Standalone(t)
	r := boundedPair(t, srv.Addr)
	ctx := context.Background()
	call := &pb.CallRef{Tenant: "acme", Target: "pay", CallId: "split", Idempotent: true}
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	fail422 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 422}}
	warm := &pb.CallRef{Tenant: "acme", Target: "pay", CallId: "warm", Idempotent: true}
	if resp, err := r[0].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: warm, Attempt: 1, Failure: fail503}); err != nil ||
		resp.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("NextDelay before the pause = %v, %v; want RETRY", resp, err)
	}

	srv.Pause(t)
	for i := range r {
		r[i].until(t, "the engine down on replica "+strconv.Itoa(i), func() bool { return !r[i].store.Up() })
	}
	if resp, err := r[0].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call, Attempt: 1, Failure: fail503}); err != nil ||
		resp.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("replica 0: attempt 1 with Redis stopped = %v, %v; want RETRY", resp, err)
	}
	if resp, err := r[1].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call, Attempt: 2, Failure: fail422}); err != nil ||
		resp.GetDisposition() != pb.Disposition_DISPOSITION_FAILED_TERMINAL {
		t.Fatalf("replica 1: attempt 2 (422) with Redis stopped = %v, %v; want STOP, FAILED_TERMINAL", resp, err)
	}
	final := &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: call, Attempt: 2, AlreadyRecorded: true,
		FinalDisposition: pb.Disposition_DISPOSITION_FAILED_TERMINAL, FinalStopReason: pb.StopReason_STOP_REASON_TERMINAL}}}
	if _, err := r[0].workers.ReportOutcome(ctx, final); err != nil {
		t.Fatalf("replica 0: FAILED_TERMINAL of attempt 2 with Redis stopped: %v (want it taken)", err)
	}

	srv.Resume(t)
	for i := range r {
		r[i].until(t, "the engine up on replica "+strconv.Itoa(i), func() bool { return r[i].store.Up() })
		eventually(t, "replica "+strconv.Itoa(i)+"'s degraded answers written", func() bool { return r[i].store.DegradedAttempts() == 0 })
	}
	resp, err := r[0].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call, Attempt: 2, Failure: fail422})
	if err != nil || resp.GetDisposition() != pb.Disposition_DISPOSITION_FAILED_TERMINAL || !resp.GetDegraded() {
		t.Errorf("replica 0: attempt 2 again after SIGCONT = %v, %v; want replica 1's STOP of the outage replayed", resp, err)
	}
}
