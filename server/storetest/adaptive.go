package storetest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// adaptiveLimits are the suite's adaptive ceiling: at most 8 leases, at
// least 2, halved on congestion, +1 per window of successes, at least a
// second between two decreases.
var adaptiveLimits = policy.FlowLimits{Ceiling: 8, LeaseTTL: 10 * time.Second, FullWait: time.Second,
	Adaptive: policy.AdaptiveBounds{Min: 2, Max: 8, Decrease: 0.5, Increase: 1, Hold: time.Second}}

// testAdaptiveCeiling: the adaptive concurrency ceiling (fleet.AdaptiveLimit)
// kept by the engine, over the replicas: a fresh ceiling admits exactly
// its maximum of 64 concurrent Admits; 8 concurrent congestion signals
// within the hold (the clock stands still) cut it once, and exactly once
// however they interleave; it then admits exactly its Ceiling;
// successes grow it by Increase per window; a lease released after its
// expiry still teaches; the floor and the maximum hold. It runs only for
// an engine with Engine.Adaptive set.
func testAdaptiveCeiling(t *testing.T, e *env) {
	key := policy.BreakerKey{Tenant: "acme", Target: "portal"}
	lim := adaptiveLimits
	admitRace := func(what string, want int) []string {
		t.Helper()
		ids := make([]string, workers)
		var admitted atomic.Int32
		race(workers, func(i int) {
			a, err := e.on(i).AdmitFlow(key, breaker, lim)
			if err != nil {
				t.Errorf("%s: AdmitFlow = %v, want nil", what, err)
				return
			}
			if a.Admitted {
				admitted.Add(1)
				ids[i] = a.LeaseID
			}
		})
		if got := int(admitted.Load()); got != want {
			t.Fatalf("%s: %d of %d concurrent Admits got a lease, want exactly %d", what, got, workers, want)
		}
		var held []string
		for _, id := range ids {
			if id != "" {
				held = append(held, id)
			}
		}
		return held
	}
	release := func(i int, id string, sig policy.FlowSignal) bool {
		t.Helper()
		held, err := e.on(i).ReleaseLease(key, id, lim, sig)
		if err != nil {
			t.Fatalf("ReleaseLease = %v, want nil", err)
		}
		return held
	}
	pool := func() policy.PoolStatus {
		t.Helper()
		st, err := e.s.Pool(key)
		if err != nil {
			t.Fatalf("Pool(%v) = %v, want nil", key, err)
		}
		return st
	}

	ids := admitRace("a fresh ceiling", 8)
	// The refusals race in from every replica within the hold: one cut.
	race(len(ids), func(i int) {
		if _, err := e.on(i).ReleaseLease(key, ids[i], lim, policy.SignalCongestion); err != nil {
			t.Errorf("ReleaseLease = %v, want nil", err)
		}
	})
	if st := pool(); st.Adaptive != 4 || st.Decreases != 1 || st.InFlight != 0 {
		t.Fatalf("after 8 concurrent congestion signals within the hold: %+v, want the limit 4 after 1 decrease, none in flight", st)
	}
	ids = admitRace("a ceiling cut to 4", 4)

	// A window of successes (4) adds just under Increase.
	for i, id := range ids {
		if !release(i, id, policy.SignalSuccess) {
			t.Fatalf("release of live lease %d: held false", i)
		}
	}
	if st := pool(); st.Adaptive <= 4.9 || st.Adaptive >= 5 {
		t.Fatalf("after a window of successes: limit %v, want just under 5", st.Adaptive)
	}
	ids = admitRace("a ceiling of 4.9", 4)

	// A lease that expired still teaches: its outcome happened.
	e.clock.Advance(lim.LeaseTTL + time.Second)
	if release(0, ids[0], policy.SignalCongestion) {
		t.Fatalf("release of an expired lease: held true, want false")
	}
	if st := pool(); st.Adaptive >= 2.5 || st.Decreases != 2 || st.Stray != 1 {
		t.Fatalf("after congestion from an expired lease: %+v, want the limit under 2.5 after 2 decreases, 1 stray release", st)
	}

	// The hold has passed but not a window of outcomes (2): no cut.
	e.clock.Advance(lim.Adaptive.Hold)
	release(0, ids[0], policy.SignalCongestion)
	if st := pool(); st.Decreases != 2 {
		t.Fatalf("congestion a hold but not a window after a cut: %+v, want still 2 decreases", st)
	}

	// The floor holds under sustained congestion, a window and a hold apart.
	for range 20 {
		e.clock.Advance(lim.Adaptive.Hold)
		for i := range lim.Adaptive.Max {
			release(i, ids[0], policy.SignalCongestion)
		}
	}
	if st := pool(); st.Adaptive != 2 {
		t.Fatalf("after sustained congestion: limit %v, want the floor 2", st.Adaptive)
	}
	ids = admitRace("a ceiling at its floor", 2)
	// The maximum holds under sustained success.
	for i := range 200 {
		release(i, ids[0], policy.SignalSuccess)
	}
	if st := pool(); st.Adaptive != 8 {
		t.Fatalf("after sustained success: limit %v, want the maximum 8", st.Adaptive)
	}
	// Both leases are back (ids[0] by the first success, ids[1] now, with
	// nothing to teach): the whole maximum is free.
	release(0, ids[1], policy.SignalNone)
	if st := pool(); st.Adaptive != 8 || st.InFlight != 0 {
		t.Fatalf("after a release without a signal: %+v, want the limit 8 unchanged, none in flight", st)
	}
	admitRace("a ceiling back at its maximum", 8)
}
