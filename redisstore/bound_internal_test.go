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
