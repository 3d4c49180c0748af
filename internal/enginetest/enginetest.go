// Package enginetest is the table of behaviours the handlers rely on from
// a state engine, across replicas, written against Engine and a
// constructor only: every engine's tests run it (breakerstore with one
// store standing for every replica, redisstore with replicas over one
// Redis, standalone and Cluster), so no engine has a copy of its own.
package enginetest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// Engine is the part of the store interface (server.Store) the behaviours
// below drive.
type Engine interface {
	Admit(key policy.BreakerKey, cfg policy.BreakerConfig) (policy.Admission, error)
	Record(key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, permitID string) (policy.BreakerSnapshot, error)
	ExtendCooldown(key policy.BreakerKey, cfg policy.BreakerConfig, until time.Time) (time.Time, error)
	Breaker(key policy.BreakerKey) (policy.BreakerSnapshot, error)
	ForceBreaker(key policy.BreakerKey, st policy.BreakerState) (policy.BreakerSnapshot, error)
	Subscribe(tenant string, buffer int) (<-chan policy.BreakerEvent, func())
	SpendRetry(req policy.SpendRequest) (policy.Spend, error)
	SetBudget(b policy.TenantBudget) (policy.TenantBudget, error)
	Budget(tenant string) (policy.BudgetStatus, error)
	OpenRun(r policy.Run) (policy.Run, error)
	Run(id string) (policy.Run, error)
	RecordFinal(runID, callID string, d policy.Disposition, stop policy.StopReason) error
	SetPolicy(tenant, target string, p policy.Policy) (policy.PolicyEntry, error)
	Resolve(tenant, target string) (policy.Policy, policy.PolicyEntry)
}

// Fleet is n replicas over one fleet state, as a constructor returns them:
// an embedded engine returns the same store n times.
type Fleet struct {
	Replicas []Engine
	// WaitPast returns once the engine's clock is past t.
	WaitPast func(t time.Time)
}

// NewFleet builds a Fleet of n replicas for one test.
type NewFleet func(t *testing.T, n int) Fleet

// Eventually polls cond until it holds, failing t after 5 s; what a
// replica learns from another arrives through the engine's feed.
func Eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		<-tick.C
	}
}

// Run runs every behaviour against fleets newFleet builds, each case as a
// subtest with a fleet of its own (three replicas).
func Run(t *testing.T, newFleet NewFleet) {
	tests := []struct {
		name string
		run  func(t *testing.T, f Fleet)
	}{
		{"exactly N probes across 64 concurrent Admits over 3 replicas", exactlyNProbes},
		{"a transition once per generation", transitionOnce},
		{"run pool never overspent across replicas", poolNeverOverspent},
		{"tenant budget never below zero across replicas", budgetNeverBelowZero},
		{"cool-down only moves later", cooldownOnlyLater},
		{"the same final disposition from every replica counts once", finalCountsOnce},
		{"an admin write is visible on another replica", adminWriteVisible},
		{"a breaker forced on one replica refuses on another", forcedElsewhere},
		{"a subscriber on one replica sees another's transitions in order", subscriberSeesOthers},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, newFleet(t, 3)) })
	}
}

// trip opens key's breaker from replica 0 with a cool-down of a
// microsecond and waits until it is over: the next Admit finds it
// HALF_OPEN.
func trip(t *testing.T, f Fleet, key policy.BreakerKey, cfg policy.BreakerConfig) {
	t.Helper()
	snap, err := f.Replicas[0].Record(key, cfg, policy.ResultTransientFailure, "")
	if err != nil || snap.State != policy.BreakerOpen {
		t.Fatalf("Record(failure) = %v state %v, want OPEN", err, snap.State)
	}
	f.WaitPast(snap.OpenUntil)
}

func exactlyNProbes(t *testing.T, f Fleet) {
	key := policy.BreakerKey{Tenant: "acme", Target: "probes"}
	cfg := policy.BreakerConfig{ConsecutiveFailures: 1, Cooldown: time.Microsecond, HalfOpenProbes: 3, ProbeTimeout: time.Minute}
	trip(t, f, key, cfg)
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			a, err := f.Replicas[i%len(f.Replicas)].Admit(key, cfg)
			switch {
			case err != nil:
				t.Errorf("Admit: %v", err)
			case a.Admitted:
				admitted.Add(1)
			default:
				refused.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 3 || refused.Load() != 61 {
		t.Errorf("admitted %d, refused %d; want 3 and 61", admitted.Load(), refused.Load())
	}
	snap, err := f.Replicas[1].Breaker(key)
	if err != nil || snap.State != policy.BreakerHalfOpen || snap.ProbesInFlight != 3 || snap.Generation != 2 {
		t.Errorf("Breaker = %+v, %v; want HALF_OPEN, 3 probes, generation 2", snap, err)
	}
}

func transitionOnce(t *testing.T, f Fleet) {
	key := policy.BreakerKey{Tenant: "acme", Target: "once"}
	cfg := policy.BreakerConfig{ConsecutiveFailures: 5, Cooldown: time.Hour}
	var opened atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			before, _ := f.Replicas[i%len(f.Replicas)].Breaker(key)
			snap, err := f.Replicas[i%len(f.Replicas)].Record(key, cfg, policy.ResultTransientFailure, "")
			if err != nil {
				t.Errorf("Record: %v", err)
			}
			if snap.State == policy.BreakerOpen && before.State != policy.BreakerOpen && snap.Generation == 1 {
				opened.Add(1)
			}
		})
	}
	wg.Wait()
	snap, err := f.Replicas[2].Breaker(key)
	if err != nil || snap.State != policy.BreakerOpen || snap.Generation != 1 {
		t.Errorf("Breaker = %+v, %v; want OPEN at generation 1 (one transition)", snap, err)
	}
	if opened.Load() < 1 {
		t.Errorf("no Record saw the breaker open")
	}
}

func poolNeverOverspent(t *testing.T, f Fleet) {
	r, err := f.Replicas[0].OpenRun(policy.Run{ID: "run-1", Tenant: "acme", Pool: 10, Cutoff: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			sp, err := f.Replicas[i%len(f.Replicas)].SpendRetry(policy.SpendRequest{Tenant: "acme", RunID: r.ID})
			if err != nil {
				t.Errorf("SpendRetry: %v", err)
			}
			if sp.Granted {
				granted.Add(1)
			} else if sp.Stop != policy.StopBudgetExhausted {
				t.Errorf("refused with %v, want BUDGET_EXHAUSTED", sp.Stop)
			}
		})
	}
	wg.Wait()
	got, err := f.Replicas[1].Run(r.ID)
	if err != nil || granted.Load() != 10 || got.Spent != 10 {
		t.Errorf("granted %d, run spent %d (%v); want 10 and 10", granted.Load(), got.Spent, err)
	}
}

func budgetNeverBelowZero(t *testing.T, f Fleet) {
	if _, err := f.Replicas[0].SetBudget(policy.TenantBudget{Tenant: "tight", Capacity: 5, MinPerSecond: 1e-9,
		RetryCost: 1, TimeoutCost: 1}); err != nil {
		t.Fatalf("SetBudget: %v", err)
	}
	for i, r := range f.Replicas {
		Eventually(t, fmt.Sprintf("the budget on replica %d", i), func() bool {
			st, err := r.Budget("tight")
			return err == nil && !st.IsDefault && st.Budget.Capacity == 5
		})
	}
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			sp, err := f.Replicas[i%len(f.Replicas)].SpendRetry(policy.SpendRequest{Tenant: "tight"})
			if err != nil {
				t.Errorf("SpendRetry: %v", err)
			}
			if sp.TenantTokens < 0 {
				t.Errorf("tokens %v below zero", sp.TenantTokens)
			}
			if sp.Granted {
				granted.Add(1)
			}
		})
	}
	wg.Wait()
	if granted.Load() != 5 {
		t.Errorf("granted %d retries from a bucket of 5, want 5", granted.Load())
	}
}

func cooldownOnlyLater(t *testing.T, f Fleet) {
	key := policy.BreakerKey{Tenant: "acme", Target: "cool"}
	base := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			until := base.Add(time.Duration((i*7)%30) * time.Second)
			in, err := f.Replicas[i%len(f.Replicas)].ExtendCooldown(key, policy.BreakerConfig{}, until)
			if err != nil || in.Before(until) {
				t.Errorf("ExtendCooldown(%v) = %v, %v; want at least that", until, in, err)
			}
		})
	}
	wg.Wait()
	snap, err := f.Replicas[0].Breaker(key)
	if want := base.Add(29 * time.Second); err != nil || !snap.CooldownUntil.Equal(want) {
		t.Errorf("cool-down until %v (%v), want the latest %v", snap.CooldownUntil, err, want)
	}
	a, err := f.Replicas[2].Admit(key, policy.BreakerConfig{})
	if err != nil || a.Admitted || a.Reason != "cooldown:pushback" {
		t.Errorf("Admit during the cool-down = %+v, %v; want refused cooldown:pushback", a, err)
	}
}

func finalCountsOnce(t *testing.T, f Fleet) {
	r, err := f.Replicas[0].OpenRun(policy.Run{ID: "run-final", Tenant: "acme", Pool: 10, Cutoff: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Go(func() {
			call := fmt.Sprintf("call-%d", i%3)
			if err := f.Replicas[i%len(f.Replicas)].RecordFinal(r.ID, call, policy.DispositionSucceeded, policy.StopNone); err != nil {
				t.Errorf("RecordFinal: %v", err)
			}
		})
	}
	wg.Wait()
	got, err := f.Replicas[2].Run(r.ID)
	if err != nil || got.Ledger != (policy.Ledger{Succeeded: 3}) {
		t.Errorf("ledger %+v (%v), want 3 succeeded: one per call", got.Ledger, err)
	}
}

func adminWriteVisible(t *testing.T, f Fleet) {
	p := policy.Default()
	p.MaxAttempts = 7
	if _, err := f.Replicas[0].SetPolicy("acme", "pay", p); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	for i, r := range f.Replicas {
		Eventually(t, fmt.Sprintf("the policy on replica %d", i), func() bool {
			got, _ := r.Resolve("acme", "pay")
			return got.MaxAttempts == 7
		})
	}
}

func forcedElsewhere(t *testing.T, f Fleet) {
	key := policy.BreakerKey{Tenant: "acme", Target: "forced"}
	if a, err := f.Replicas[1].Admit(key, policy.BreakerConfig{}); err != nil || !a.Admitted {
		t.Fatalf("Admit on a new breaker = %+v, %v; want admitted", a, err)
	}
	if _, err := f.Replicas[0].ForceBreaker(key, policy.BreakerOpen); err != nil {
		t.Fatalf("ForceBreaker: %v", err)
	}
	Eventually(t, "the forced OPEN on replica 1", func() bool {
		a, err := f.Replicas[1].Admit(key, policy.BreakerConfig{})
		return err == nil && !a.Admitted && a.Reason == "breaker:forced_open"
	})
}

func subscriberSeesOthers(t *testing.T, f Fleet) {
	key := policy.BreakerKey{Tenant: "watched", Target: "x"}
	cfg := policy.BreakerConfig{ConsecutiveFailures: 1, Cooldown: time.Microsecond, HalfOpenProbes: 1, ProbeTimeout: time.Minute}
	if _, err := f.Replicas[0].Admit(key, cfg); err != nil {
		t.Fatal(err)
	}
	events, cancel := f.Replicas[2].Subscribe("watched", 64)
	defer cancel()
	next := func() policy.BreakerEvent {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("subscription closed")
			}
			return ev
		case <-time.After(5 * time.Second):
			t.Fatalf("no event within 5s")
		}
		return policy.BreakerEvent{}
	}
	if ev := next(); !ev.Initial || ev.Snapshot.State != policy.BreakerClosed {
		t.Fatalf("first event %+v, want the initial CLOSED state", ev)
	}
	if ev := next(); !ev.SnapshotDone {
		t.Fatalf("second event %+v, want SnapshotDone", ev)
	}
	trip(t, f, key, cfg)
	a, err := f.Replicas[1].Admit(key, cfg)
	if err != nil || !a.Admitted {
		t.Fatalf("probe Admit = %+v, %v", a, err)
	}
	if _, err := f.Replicas[0].Record(key, cfg, policy.ResultSuccess, a.PermitID); err != nil {
		t.Fatalf("probe Record: %v", err)
	}
	for i, want := range []policy.BreakerState{policy.BreakerOpen, policy.BreakerHalfOpen, policy.BreakerClosed} {
		ev := next()
		if ev.Snapshot.State != want || ev.Snapshot.Generation != uint64(i+1) {
			t.Errorf("event %d: %v generation %d, want %v generation %d", i, ev.Snapshot.State, ev.Snapshot.Generation, want, i+1)
		}
	}
}
