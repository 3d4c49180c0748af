package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
)

// TestCommitOfASpentRequestKeepsItsWrites: a request whose time for the
// engine ran out before its Commit (a slow Redis took it all) still
// answers: its attempt record is kept on the replica until the engine
// answers, its note and tally queued, its audit records left to the
// flush, as when Redis is down, and Commit returns nil, not an error the
// caller would answer UNAVAILABLE with.
func TestCommitOfASpentRequestKeepsItsWrites(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s, err := Open(context.Background(), Options{Client: c, Timeout: 2 * time.Second, BatchOutcomes: true, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.OpenRun(policy.Run{ID: "nightly", Tenant: "acme", Pool: 10, Cutoff: time.Now().Add(time.Hour)}); err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	k := policy.CallKey{Tenant: "acme", CallID: "c1"}
	for _, hold := range []bool{true, false} {
		s.opts.BatchOutcomes = hold
		u := s.Begin().(*changes)
		u.view.bound = time.Now().Add(-time.Millisecond) // spent
		k.CallID = "c-" + map[bool]string{true: "held", false: "sent"}[hold]
		if _, replay, err := u.ClaimAttempt(k, 1); err != nil || replay {
			t.Fatalf("ClaimAttempt with the request's time spent = %v, %v", replay, err)
		}
		if err := u.RecordAttempt(k, 1, policy.Answer{Retry: true, Delay: time.Second}, time.Now().Add(time.Hour)); err != nil {
			t.Fatalf("RecordAttempt: %v", err)
		}
		if err := u.NoteCall("nightly", k.CallID, policy.CallNote{Target: "geo", Attempt: 1}); err != nil {
			t.Fatalf("NoteCall: %v", err)
		}
		u.CountAttempts(policy.AttemptTally{Tenant: "acme", Target: "geo", Attempt: 1})
		u.AppendAudit(policy.AuditRecord{Event: policy.AuditDecision, Tenant: "acme", Target: "geo", CallID: k.CallID, Attempt: 1})
		if err := u.Commit(); err != nil {
			t.Errorf("Commit with the request's time spent (BatchOutcomes %v) = %v; want nil, its writes kept for later", hold, err)
		}
		if ans, replay, err := s.ClaimAttempt(k, 1); err != nil || !replay || !ans.Retry {
			t.Errorf("the same attempt again (BatchOutcomes %v) = %v, %v, %v; want the answer kept, replayed", hold, ans, replay, err)
		}
	}
}

// TestDecidedInOneCallWithinTheRequestsTime: what a one-call NextDelay
// leaves for later (its run's note, its tally) waits for a flush in
// flight within the request's time, not a timeout of its own. While
// Redis is down nothing can be held, so the note goes out now, behind the
// flush; a request whose one call used its time (the engine's call timed
// out) gives up at once. Before, it waited up to a timeout more: the
// stop-redis fault test's NextDelays of a run at 70 ms, their one call
// past the 50 ms bound.
func TestDecidedInOneCallWithinTheRequestsTime(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s, err := Open(context.Background(), Options{Client: c, Timeout: 50 * time.Millisecond, BatchOutcomes: true,
		FlushInterval: time.Hour, DownAfter: 1, DownFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.OpenRun(policy.Run{ID: "nightly", Tenant: "acme", Pool: 10, Cutoff: time.Now().Add(time.Hour)}); err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	srv.Pause(t)
	defer srv.Resume(t)
	s.held.mu.Lock()
	s.held.batches["acme"] = &outcomeBatch{id: "b", tenant: "acme", byKey: map[policy.BreakerKey]*outcomeGroup{},
		runIndex: map[string]int{}, notes: []pendingNote{{tenant: "acme", run: "nightly", call: "c0", n: policy.CallNote{Target: "geo", Attempt: 1}}}}
	s.held.mu.Unlock()
	s.flushHeld() // times out: the engine down from it
	if s.health.up() {
		t.Fatal("the engine still counted up after a flush that timed out with DownAfter 1")
	}
	s.held.lock() // a flush in flight
	defer s.held.unlock()
	var waited []error
	s.held.waitHook = func(ctx context.Context) { waited = append(waited, ctx.Err()) }
	u := s.Begin().(*changes)
	u.view.bound = time.Now().Add(-time.Millisecond) // spent by its one call
	err = s.DecidedInOneCall(u, "nightly", "c1", policy.CallNote{Target: "geo", Attempt: 1},
		policy.AttemptTally{Tenant: "acme", Target: "geo", Attempt: 1})
	if err != nil {
		t.Fatalf("DecidedInOneCall = %v, want nil", err)
	}
	if len(waited) != 1 || waited[0] == nil {
		t.Fatalf("waits for the flush in flight, by their context's error = %v; want one, past the request's bound already", waited)
	}
}
