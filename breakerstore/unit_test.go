package breakerstore_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// decide makes the changes of one NextDelay through a unit: a failure on
// the breaker, a cool-down, a retry from the tenant's budget and the run's
// pool, and the decision's audit record.
func decide(t *testing.T, e *env, u breakerstore.Changes, run string) {
	t.Helper()
	key := policy.BreakerKey{Tenant: "t", Target: "target-1"}
	must(u.Record(key, consecutive, policy.ResultTransientFailure, "")).get(t)
	must(u.ExtendCooldown(key, consecutive, e.clock.Now().Add(time.Minute))).get(t)
	if sp := must(u.SpendRetry(policy.SpendRequest{Tenant: "t", RunID: run})).get(t); !sp.Granted {
		t.Fatalf("SpendRetry: got %+v, want granted", sp)
	}
	u.AppendAudit(policy.AuditRecord{Event: policy.AuditDecision, Tenant: "t", Target: "target-1", CallID: "c1", Attempt: 1})
}

// TestUnitIsOneCommitWithSyncAlways: the changes of one decision are one
// SyncAlways commit, made at Commit and durable from then on (the flusher
// never runs before the crash).
func TestUnitIsOneCommitWithSyncAlways(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.Sync, o.MaxBatchDelay = breakerstore.SyncAlways, time.Millisecond })
	s, run := prepare(t, e)
	before := s.Stats()
	u := s.Begin()
	decide(t, e, u, run)
	if got := s.Stats().SyncCommits - before.SyncCommits; got != 0 {
		t.Fatalf("SyncAlways commits before Commit: got %d, want 0", got)
	}
	if err := u.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	after := s.Stats()
	if got := after.SyncCommits - before.SyncCommits; got != 1 {
		t.Errorf("SyncAlways commits for one decision: got %d, want 1", got)
	}
	if got := after.SyncMutations - before.SyncMutations; got < 4 {
		t.Errorf("synced mutations: got %d, want at least 4 (failure, cool-down, spend, audit)", got)
	}
	want := stateOf(t, s, run)
	s = e.crashAndReopen(s)
	if got := stateOf(t, s, run); !reflect.DeepEqual(got, want) {
		t.Errorf("state after a crash:\n got %+v\nwant %+v (as answered)", got, want)
	}
	if err := s.Begin().Commit(); err != nil {
		t.Errorf("Commit of an empty unit: %v", err)
	}
}

// TestUnitWithSyncGroupIsTheStore: with SyncGroup a unit commits nothing
// itself; its changes are the store's, flushed by the group commit.
func TestUnitWithSyncGroupIsTheStore(t *testing.T) {
	e := newEnv(t)
	s, run := prepare(t, e)
	before := s.Stats()
	u := s.Begin()
	decide(t, e, u, run)
	if err := u.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	if got := s.Stats().Commits - before.Commits; got != 0 {
		t.Errorf("commits made by a SyncGroup unit: got %d, want 0", got)
	}
	b := must(s.Breaker(policy.BreakerKey{Tenant: "t", Target: "target-1"})).get(t)
	if b.ConsecutiveFailures != 1 || !b.CooldownUntil.After(e.clock.Now()) {
		t.Errorf("breaker: got %+v, want one failure and a cool-down", b)
	}
	want := stateOf(t, s, run)
	s = e.reopen(s) // a clean close flushes
	if got := stateOf(t, s, run); !reflect.DeepEqual(got, want) {
		t.Errorf("state after a restart:\n got %+v\nwant %+v", got, want)
	}
}
