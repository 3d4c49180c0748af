package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
)

// The behaviours of this file are the idempotency ledger, the run call
// tables and the run ledger's new counters, written against a constructor
// (openOnce) so they can move into the contract suite once it has cases
// for keys and call tables; they run on a standalone server and on a
// Cluster.

// openOnce opens a Store with the given caps over fresh state for t, and
// returns it with a function that waits until the engine's clock is past
// a time.
type openOnce func(t *testing.T, maxKeys, maxCalls int) (*redisstore.Store, func(time.Time))

func onceOver(c func(t *testing.T) redis.UniversalClient) openOnce {
	return func(t *testing.T, maxKeys, maxCalls int) (*redisstore.Store, func(time.Time)) {
		cl := c(t)
		t.Cleanup(func() { _ = cl.Close() })
		s, err := redisstore.Open(context.Background(), redisstore.Options{Client: cl, Timeout: 2 * time.Second,
			MaxKeysPerTenant: maxKeys, MaxRunCalls: maxCalls})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s, func(tm time.Time) {
			t.Helper()
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				now, err := cl.Time(context.Background()).Result()
				if err != nil {
					t.Fatalf("TIME: %v", err)
				}
				if now.After(tm) {
					return
				}
			}
			t.Fatalf("the server's clock did not pass %v", tm)
		}
	}
}

func TestOnceStandalone(t *testing.T) {
	runOnce(t, onceOver(func(t *testing.T) redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: redistest.Standalone(t).Addr})
	}))
}

func TestOnceCluster(t *testing.T) {
	addrs := redistest.Cluster(t)
	runOnce(t, func(t *testing.T, maxKeys, maxCalls int) (*redisstore.Store, func(time.Time)) {
		// One cluster for every case: each gets tenants of its own.
		return onceOver(func(*testing.T) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
		})(t, maxKeys, maxCalls)
	})
}

// tenant names a tenant of one case: unique across the cases sharing a
// Cluster.
func tenant(t *testing.T, name string) string {
	return name + "-" + t.Name()
}

func runOnce(t *testing.T, open openOnce) {
	for _, tt := range []struct {
		name string
		run  func(t *testing.T, open openOnce)
	}{
		{"claim and complete", testClaimComplete},
		{"keys expire", testKeysExpire},
		{"keys per tenant cap", testKeysCap},
		{"call table", testCallTable},
		{"ledger counters", testLedgerCounters},
		{"redrive of", testRedriveOf},
		{"a refused outcome notes nothing", testRefusedNotes},
	} {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, open) })
	}
}

func failedPrecondition(err error) bool {
	var e interface{ FailedPrecondition() bool }
	return errors.As(err, &e) && e.FailedPrecondition()
}

func notFound(err error) bool {
	var e interface{ NotFound() bool }
	return errors.As(err, &e) && e.NotFound()
}

func overCapacity(err error) bool {
	var e interface{ OverCapacity() bool }
	return errors.As(err, &e) && e.OverCapacity()
}

func testClaimComplete(t *testing.T, open openOnce) {
	s, _ := open(t, 0, 0)
	ref := policy.KeyRef{Tenant: tenant(t, "acme"), Key: "doc-1"}
	claim := policy.KeyClaim{LeaseUntil: time.Now().Add(time.Minute), Expires: time.Now().Add(time.Hour)}
	a, err := s.ClaimKey(ref, claim)
	if err != nil || a.State != policy.KeyNew || a.LeaseID == "" || a.Reason != "idempotency:new" {
		t.Fatalf("first ClaimKey = %+v, %v; want NEW with a lease", a, err)
	}
	b, err := s.ClaimKey(ref, claim)
	if err != nil || b.State != policy.KeyInFlight || b.LeaseID != "" || b.RetryAfter <= 0 || b.RetryAfter > time.Minute {
		t.Fatalf("second ClaimKey = %+v, %v; want IN_FLIGHT, no lease, retry within the minute", b, err)
	}
	if _, err := s.CompleteKey(ref, "beef", policy.KeyOutcomeSucceeded, "r", time.Time{}); !failedPrecondition(err) || err != fleet.ErrLease {
		t.Errorf("CompleteKey with another lease = %v, want fleet.ErrLease (FailedPrecondition)", err)
	}
	other := policy.KeyRef{Tenant: tenant(t, "beta"), Key: "doc-1"}
	if _, err := s.CompleteKey(other, a.LeaseID, policy.KeyOutcomeSucceeded, "r", time.Time{}); !notFound(err) {
		t.Errorf("CompleteKey of another tenant's key = %v, want NotFound", err)
	}
	if _, err := s.Key(other); !notFound(err) {
		t.Errorf("Key of another tenant's key = %v, want NotFound", err)
	}
	v, err := s.CompleteKey(ref, a.LeaseID, policy.KeyOutcomeSucceeded, "upstream-42", time.Time{})
	if err != nil || v.State != policy.KeySucceeded || v.ResultRef != "upstream-42" || !v.LeaseUntil.IsZero() {
		t.Fatalf("CompleteKey = %+v, %v; want SUCCEEDED upstream-42, no lease", v, err)
	}
	if _, err := s.CompleteKey(ref, a.LeaseID, policy.KeyOutcomeSucceeded, "again", time.Time{}); !failedPrecondition(err) {
		t.Errorf("CompleteKey twice = %v, want FailedPrecondition", err)
	}
	c, err := s.ClaimKey(ref, claim)
	if err != nil || c.State != policy.KeySucceeded || c.ResultRef != "upstream-42" || c.LeaseID != "" {
		t.Errorf("ClaimKey of a success = %+v, %v; want SUCCEEDED upstream-42", c, err)
	}
	got, err := s.Key(ref)
	if err != nil || got.State != policy.KeySucceeded || got.Expires.Before(claim.Expires.Truncate(time.Microsecond)) {
		t.Errorf("Key = %+v, %v; want SUCCEEDED until %v", got, err, claim.Expires)
	}
	if _, err := s.CompleteKey(ref, "1", policy.KeyOutcomeSucceeded, string(make([]byte, policy.MaxResultRefLen+1)), time.Time{}); err == nil {
		t.Errorf("CompleteKey with a 1025-byte result = nil, want an invalid result_ref")
	}
}

func testKeysExpire(t *testing.T, open openOnce) {
	s, waitPast := open(t, 0, 0)
	ref := policy.KeyRef{Tenant: tenant(t, "acme"), Key: "short"}
	now := time.Now()
	// Redis expires the key on its own clock, so the window is real time:
	// wide enough that the Key right after the claim is inside it on a
	// loaded machine (5 ms was not, once).
	a, err := s.ClaimKey(ref, policy.KeyClaim{LeaseUntil: now.Add(50 * time.Millisecond), Expires: now.Add(250 * time.Millisecond)})
	if err != nil || a.State != policy.KeyNew {
		t.Fatalf("ClaimKey = %+v, %v", a, err)
	}
	v, err := s.Key(ref)
	if err != nil {
		t.Fatalf("Key before expiry: %v", err)
	}
	waitPast(v.Expires)
	if _, err := s.Key(ref); !notFound(err) {
		t.Errorf("Key past expiry = %v, want NotFound", err)
	}
	if _, err := s.CompleteKey(ref, a.LeaseID, policy.KeyOutcomeSucceeded, "", time.Time{}); !notFound(err) {
		t.Errorf("CompleteKey past expiry = %v, want NotFound", err)
	}
	b, err := s.ClaimKey(ref, policy.KeyClaim{LeaseUntil: time.Now().Add(time.Minute), Expires: time.Now().Add(time.Hour)})
	if err != nil || b.State != policy.KeyNew || b.LeaseID == a.LeaseID {
		t.Errorf("ClaimKey past expiry = %+v, %v; want NEW with a new lease", b, err)
	}
}

func testKeysCap(t *testing.T, open openOnce) {
	s, waitPast := open(t, 2, 0)
	acme := tenant(t, "acme")
	now := time.Now()
	long := policy.KeyClaim{LeaseUntil: now.Add(time.Minute), Expires: now.Add(time.Hour)}
	short := policy.KeyClaim{LeaseUntil: now.Add(time.Millisecond), Expires: now.Add(300 * time.Millisecond)}
	if _, err := s.ClaimKey(policy.KeyRef{Tenant: acme, Key: "k1"}, long); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimKey(policy.KeyRef{Tenant: acme, Key: "k2"}, short); err != nil {
		t.Fatal(err)
	}
	_, err := s.ClaimKey(policy.KeyRef{Tenant: acme, Key: "k3"}, long)
	if !overCapacity(err) || !errors.Is(err, redisstore.ErrTooManyKeys) {
		t.Fatalf("third key of a tenant capped at 2 = %v, want ErrTooManyKeys (OverCapacity)", err)
	}
	if a, err := s.ClaimKey(policy.KeyRef{Tenant: acme, Key: "k1"}, long); err != nil || a.State != policy.KeyInFlight {
		t.Errorf("claim of a kept key at the cap = %+v, %v; want IN_FLIGHT", a, err)
	}
	if _, err := s.ClaimKey(policy.KeyRef{Tenant: tenant(t, "beta"), Key: "k3"}, long); err != nil {
		t.Errorf("another tenant's key = %v, want nil: the cap is per tenant", err)
	}
	waitPast(now.Add(300 * time.Millisecond))
	if a, err := s.ClaimKey(policy.KeyRef{Tenant: acme, Key: "k3"}, long); err != nil || a.State != policy.KeyNew {
		t.Errorf("third key once one expired = %+v, %v; want NEW", a, err)
	}
}

func testCallTable(t *testing.T, open openOnce) {
	s, _ := open(t, 0, 4)
	acme := tenant(t, "acme")
	run, err := s.OpenRun(policy.Run{Tenant: acme, Pool: 10, Cutoff: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Truncate(time.Microsecond)
	// Through a batch (NextDelay's path) and directly (ApplyOutcomes').
	u := s.Begin()
	for i, id := range []string{"c3", "c1", "c2"} {
		n := policy.CallNote{Target: "pay", TriageRef: "doc://" + id, Attempt: 1, Classification: "transient:503",
			Detail: "retry", Time: at.Add(time.Duration(i) * time.Second)}
		if err := u.NoteCall(run.ID, id, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := u.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	final := policy.CallNote{Attempt: 2, Detail: "stopped: deadline", Disposition: policy.DispositionDeadLetter,
		Stop: policy.StopDeadline, Time: at.Add(5 * time.Second)}
	if err := s.NoteCall(run.ID, "c1", final); err != nil {
		t.Fatal(err)
	}
	if err := s.NoteCall(run.ID, "c0", policy.CallNote{Attempt: 1, Disposition: policy.DispositionSucceeded, Detail: "attempt succeeded"}); err != nil {
		t.Fatal(err)
	}
	if err := s.NoteCall(run.ID, "c9", policy.CallNote{Attempt: 1}); err != nil {
		t.Fatalf("NoteCall beyond the cap = %v, want nil (counted)", err)
	}
	if err := s.NoteCall("no-such-run", "c1", final); !notFound(err) {
		t.Errorf("NoteCall of an unknown run = %v, want NotFound", err)
	}
	all, untracked, err := s.RunCalls(run.ID, policy.RunCallFilter{}, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range all {
		ids = append(ids, c.CallID)
	}
	if fmt.Sprint(ids) != "[c0 c1 c2 c3]" || untracked != 1 {
		t.Errorf("RunCalls = %v untracked %d, want [c0 c1 c2 c3] and 1", ids, untracked)
	}
	c1 := all[1]
	want := policy.RunCall{CallID: "c1", Disposition: policy.DispositionDeadLetter, Stop: policy.StopDeadline, Attempts: 2,
		Classification: "transient:503", Detail: "stopped: deadline", First: at.Add(time.Second), Last: at.Add(5 * time.Second),
		Target: "pay", TriageRef: "doc://c1"}
	if !c1.First.Equal(want.First) || !c1.Last.Equal(want.Last) {
		t.Errorf("c1 times %v..%v, want %v..%v", c1.First, c1.Last, want.First, want.Last)
	}
	c1.First, c1.Last, want.First, want.Last = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if c1 != want {
		t.Errorf("c1 = %+v, want %+v", c1, want)
	}
	dl, _, err := s.RunCalls(run.ID, policy.RunCallFilter{Dispositions: []policy.Disposition{policy.DispositionDeadLetter}}, "", 0)
	if err != nil || len(dl) != 1 || dl[0].CallID != "c1" {
		t.Errorf("RunCalls(dead letters) = %+v, %v; want c1 only", dl, err)
	}
	page, _, err := s.RunCalls(run.ID, policy.RunCallFilter{}, "c1", 1)
	if err != nil || len(page) != 1 || page[0].CallID != "c2" {
		t.Errorf("RunCalls(after c1, limit 1) = %+v, %v; want c2", page, err)
	}
	if _, _, err := s.RunCalls("no-such-run", policy.RunCallFilter{}, "", 0); !notFound(err) {
		t.Errorf("RunCalls of an unknown run = %v, want NotFound", err)
	}
}

func testLedgerCounters(t *testing.T, open openOnce) {
	s, _ := open(t, 0, 0)
	acme := tenant(t, "acme")
	run, err := s.OpenRun(policy.Run{Tenant: acme, Pool: 10, Cutoff: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	note := policy.CallNote{Attempt: 1, Detail: "attempt succeeded", Disposition: policy.DispositionSucceeded}
	ups := []policy.OutcomeUpdate{
		{RunID: run.ID, CallID: "a", Final: policy.DispositionSucceeded, Deduplicated: true, Note: note},
		{RunID: run.ID, CallID: "b", Final: policy.DispositionSucceeded},
		{RunID: run.ID, CallID: "c", Final: policy.DispositionDeadLetter, Stop: policy.StopDeadline},
		{RunID: run.ID, CallID: "a", Final: policy.DispositionSucceeded, Deduplicated: true},
	}
	if n, err := s.ApplyOutcomes(ups, nil); err != nil || n != len(ups) {
		t.Fatalf("ApplyOutcomes = %d, %v", n, err)
	}
	got, err := s.Run(run.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := policy.Ledger{Succeeded: 2, Deduplicated: 1, DeadLetterDeadline: 1}
	if got.Ledger != want {
		t.Errorf("ledger %+v, want %+v", got.Ledger, want)
	}
	calls, _, err := s.RunCalls(run.ID, policy.RunCallFilter{}, "", 0)
	if err != nil || len(calls) != 1 || calls[0].CallID != "a" || calls[0].Disposition != policy.DispositionSucceeded {
		t.Errorf("RunCalls after ApplyOutcomes = %+v, %v; want a, SUCCEEDED (the one note)", calls, err)
	}
}

func testRedriveOf(t *testing.T, open openOnce) {
	s, _ := open(t, 0, 0)
	acme := tenant(t, "acme")
	old, err := s.OpenRun(policy.Run{Tenant: acme, Pool: 10, Cutoff: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.OpenRun(policy.Run{Tenant: acme, Pool: 10, Cutoff: time.Now().Add(time.Hour), RedriveOf: old.ID})
	if err != nil || r.RedriveOf != old.ID {
		t.Fatalf("OpenRun(redrive of %s) = %+v, %v", old.ID, r, err)
	}
	if got, err := s.Run(r.ID); err != nil || got.RedriveOf != old.ID {
		t.Errorf("Run = %+v, %v; want RedriveOf %s", got, err, old.ID)
	}
	if _, err := s.OpenRun(policy.Run{Tenant: tenant(t, "beta"), Pool: 1, Cutoff: time.Now().Add(time.Hour), RedriveOf: old.ID}); !notFound(err) {
		t.Errorf("OpenRun re-driving another tenant's run = %v, want NotFound", err)
	}
	if _, err := s.OpenRun(policy.Run{Tenant: acme, Pool: 1, Cutoff: time.Now().Add(time.Hour), RedriveOf: "nope"}); !notFound(err) {
		t.Errorf("OpenRun re-driving an unknown run = %v, want NotFound", err)
	}
}

func testRefusedNotes(t *testing.T, open openOnce) {
	s, waitPast := open(t, 0, 0)
	acme := tenant(t, "acme")
	run, err := s.OpenRun(policy.Run{Tenant: acme, Pool: 10, Cutoff: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	key := policy.BreakerKey{Tenant: acme, Target: "pay"}
	cfg := policy.BreakerConfig{ConsecutiveFailures: 1, Cooldown: time.Microsecond, HalfOpenProbes: 1, ProbeTimeout: time.Minute}
	snap, err := s.Record(key, cfg, policy.ResultTransientFailure, "")
	if err != nil || snap.State != policy.BreakerOpen {
		t.Fatalf("Record = %+v, %v; want OPEN", snap, err)
	}
	waitPast(snap.OpenUntil)
	a, err := s.Admit(key, cfg)
	if err != nil || a.PermitID == "" {
		t.Fatalf("Admit = %+v, %v; want a probe permit", a, err)
	}
	note := policy.CallNote{Attempt: 1, Detail: "attempt succeeded", Disposition: policy.DispositionSucceeded}
	ups := []policy.OutcomeUpdate{
		{Key: key, Breaker: cfg, Result: policy.ResultSuccess, PermitID: "0123456789abcdef0123456789abcdef",
			RunID: run.ID, CallID: "forged", Final: policy.DispositionSucceeded, Note: note},
		{Key: key, Breaker: cfg, Result: policy.ResultSuccess, PermitID: a.PermitID,
			RunID: run.ID, CallID: "probe", Final: policy.DispositionSucceeded, Note: note},
	}
	if n, err := s.ApplyOutcomes(ups, nil); err != nil || n != 2 {
		t.Fatalf("ApplyOutcomes = %d, %v", n, err)
	}
	if ups[0].Refused == nil || ups[1].Refused != nil {
		t.Fatalf("refused %v and %v, want the forged permit refused only", ups[0].Refused, ups[1].Refused)
	}
	calls, _, err := s.RunCalls(run.ID, policy.RunCallFilter{}, "", 0)
	if err != nil || len(calls) != 1 || calls[0].CallID != "probe" {
		t.Errorf("RunCalls = %+v, %v; want the probe's call only", calls, err)
	}
}
