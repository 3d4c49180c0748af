package storetest

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// ceiling is the suite's concurrency ceiling: 10 leases of 10 s, a full
// ceiling asking again after 1 s.
var ceiling = policy.FlowLimits{Ceiling: 10, LeaseTTL: 10 * time.Second, FullWait: time.Second}

// admitFlow is AdmitFlow on replica i, failing t on an error.
func (e *env) admitFlow(t *testing.T, i int, key policy.BreakerKey, lim policy.FlowLimits) policy.Admission {
	t.Helper()
	a, err := e.on(i).AdmitFlow(key, breaker, lim)
	if err != nil {
		t.Fatalf("AdmitFlow(%v) on replica %d = %v, want nil", key, i%len(e.replicas), err)
	}
	return a
}

// pool is Pool on replica i, failing t on an error.
func (e *env) pool(t *testing.T, i int, key policy.BreakerKey) policy.PoolStatus {
	t.Helper()
	st, err := e.on(i).Pool(key)
	if err != nil {
		t.Fatalf("Pool(%v) = %v, want nil", key, err)
	}
	return st
}

// testLeases: a concurrency ceiling over the replicas: exactly the
// ceiling of 64 concurrent AdmitFlows get a lease, each distinct; the
// rest are refused concurrency:full with FullWait; a lease returned on
// another replica frees its slot, returned again it is ignored and
// counted; leases expire; a breaker that refuses takes no lease.
func testLeases(t *testing.T, e *env) {
	key := policy.BreakerKey{Tenant: "acme", Target: "portal"}
	var admitted atomic.Int32
	leases := make([]string, workers)
	race(workers, func(i int) {
		a, err := e.on(i).AdmitFlow(key, breaker, ceiling)
		switch {
		case err != nil:
			t.Errorf("AdmitFlow = %v, want nil", err)
		case a.Admitted:
			admitted.Add(1)
			leases[i] = a.LeaseID
			if a.LeaseID == "" || a.Reason != fleet.ReasonClosed || !a.LeaseExpiry.Equal(e.clock.Now().Add(ceiling.LeaseTTL)) {
				t.Errorf("admitted %+v, want a lease expiring after %v, by a CLOSED breaker", a, ceiling.LeaseTTL)
			}
		case a.Reason != fleet.ReasonFull || a.RetryAfter != ceiling.FullWait || a.LeaseID != "":
			t.Errorf("refused %+v, want %s after %v without a lease", a, fleet.ReasonFull, ceiling.FullWait)
		}
	})
	if n := admitted.Load(); n != int32(ceiling.Ceiling) {
		t.Fatalf("%d of %d concurrent AdmitFlows over the replicas got a lease, want exactly %d", n, workers, ceiling.Ceiling)
	}
	var held []string
	seen := map[string]bool{}
	for _, l := range leases {
		if l != "" {
			if seen[l] {
				t.Errorf("lease %s handed out twice", l)
			}
			seen[l] = true
			held = append(held, l)
		}
	}
	for i := range e.replicas {
		if st := e.pool(t, i, key); st.InFlight != ceiling.Ceiling || st.Stray != 0 {
			t.Errorf("Pool on replica %d = %+v, want %d in flight, 0 stray", i, st, ceiling.Ceiling)
		}
	}
	if ok, err := e.on(1).ReleaseLease(key, held[0], ceiling, policy.SignalNone); err != nil || !ok {
		t.Fatalf("ReleaseLease of a live lease on another replica = %v, %v; want true, nil", ok, err)
	}
	for i, id := range []string{held[0], fleet.PermitID{1}.String(), "not-a-lease"} {
		if ok, err := e.on(2).ReleaseLease(key, id, ceiling, policy.SignalNone); err != nil || ok {
			t.Errorf("ReleaseLease %d of a lease not held = %v, %v; want false, nil (ignored)", i, ok, err)
		}
	}
	if st := e.pool(t, 0, key); st.InFlight != ceiling.Ceiling-1 || st.Stray != 3 {
		t.Errorf("Pool after the releases = %+v, want %d in flight, 3 stray", st, ceiling.Ceiling-1)
	}
	if a := e.admitFlow(t, 2, key, ceiling); !a.Admitted {
		t.Errorf("AdmitFlow into the freed slot = %+v, want admitted", a)
	}
	if a := e.admitFlow(t, 0, key, ceiling); a.Admitted || a.Reason != fleet.ReasonFull {
		t.Errorf("AdmitFlow at the ceiling again = %+v, want refused %s", a, fleet.ReasonFull)
	}
	// Several at once (ReleaseLeases, a ReportOutcome's): each answered as
	// ReleaseLease answers it, a bad key naming the field.
	rs := []policy.LeaseRelease{{Key: key, ID: held[1], Limits: ceiling}, {Key: key, ID: "not-a-lease", Limits: ceiling},
		{Key: policy.BreakerKey{Tenant: "acme"}, ID: held[2], Limits: ceiling}, {Key: key, ID: held[2], Limits: ceiling}}
	got, errs := make([]bool, len(rs)), make([]error, len(rs))
	e.on(1).ReleaseLeases(rs, got, errs)
	if !got[0] || got[1] || got[2] || !got[3] || errs[0] != nil || errs[1] != nil || !invalid(errs[2]) || errs[3] != nil {
		t.Errorf("ReleaseLeases(live, not a lease, no target, live) = %v, %v; want [true false false true], an invalid argument for the third", got, errs)
	}
	if st := e.pool(t, 2, key); st.InFlight != ceiling.Ceiling-2 || st.Stray != 4 {
		t.Errorf("Pool after ReleaseLeases = %+v, want %d in flight, 4 stray", st, ceiling.Ceiling-2)
	}
	// Unreturned leases expire: a crashed worker cannot leak its slot.
	e.clock.Advance(ceiling.LeaseTTL)
	if st := e.pool(t, 1, key); st.InFlight != 0 {
		t.Errorf("Pool after the lease life = %+v, want 0 in flight", st)
	}
	// A breaker that refuses gets the lease back at once.
	if _, err := e.s.ForceBreaker(key, policy.BreakerOpen); err != nil {
		t.Fatalf("ForceBreaker(OPEN) = %v, want nil", err)
	}
	for i := range 3 * ceiling.Ceiling {
		if a := e.admitFlow(t, i, key, ceiling); a.Admitted || a.Reason != fleet.ReasonForcedOpen || a.LeaseID != "" {
			t.Fatalf("AdmitFlow on a forced OPEN breaker = %+v, want refused %s without a lease", a, fleet.ReasonForcedOpen)
		}
	}
	if st := e.pool(t, 0, key); st.InFlight != 0 {
		t.Errorf("Pool after the breaker's refusals = %+v, want 0 in flight: a refused attempt holds nothing", st)
	}
	// Bad limits name the field.
	if _, err := e.s.AdmitFlow(key, breaker, policy.FlowLimits{}); !invalid(err) {
		t.Errorf("AdmitFlow without a ceiling = %v, want an invalid argument", err)
	}
	// A release under a key that never had a ceiling is ignored.
	if ok, err := e.s.ReleaseLease(policy.BreakerKey{Tenant: "acme", Target: "never"}, held[1], ceiling, policy.SignalNone); err != nil || ok {
		t.Errorf("ReleaseLease under a key without a ceiling = %v, %v; want false, nil", ok, err)
	}
}

// testRate: a rate ceiling over the replicas is GCRA: a burst at once,
// then one per interval, each refusal telling the exact wait; a slot
// taken by an attempt the breaker or a full concurrency ceiling refuses
// is given back.
func testRate(t *testing.T, e *env) {
	key := policy.BreakerKey{Tenant: "acme", Target: "funder"}
	lim := policy.FlowLimits{Interval: 500 * time.Millisecond, Burst: 3}
	var admitted atomic.Int32
	race(workers, func(i int) {
		a, err := e.on(i).AdmitFlow(key, breaker, lim)
		switch {
		case err != nil:
			t.Errorf("AdmitFlow = %v, want nil", err)
		case a.Admitted:
			admitted.Add(1)
			if a.LeaseID != "" {
				t.Errorf("admitted %+v under a rate ceiling alone, want no lease", a)
			}
		case a.Reason != fleet.ReasonRate || a.RetryAfter <= 0 || a.RetryAfter > time.Duration(lim.Burst)*lim.Interval:
			t.Errorf("refused %+v, want %s with a wait within the burst's span", a, fleet.ReasonRate)
		}
	})
	if n := admitted.Load(); n != int32(lim.Burst) {
		t.Fatalf("%d of %d concurrent AdmitFlows admitted at one instant, want the burst, %d", n, workers, lim.Burst)
	}
	if a := e.admitFlow(t, 1, key, lim); a.Admitted || a.Reason != fleet.ReasonRate || a.RetryAfter != lim.Interval {
		t.Errorf("past the burst: %+v, want refused %s after exactly %v", a, fleet.ReasonRate, lim.Interval)
	}
	e.clock.Advance(200 * time.Millisecond)
	if a := e.admitFlow(t, 2, key, lim); a.Admitted || a.RetryAfter != 300*time.Millisecond {
		t.Errorf("200ms later: %+v, want refused after exactly 300ms", a)
	}
	e.clock.Advance(300 * time.Millisecond)
	if a := e.admitFlow(t, 0, key, lim); !a.Admitted {
		t.Errorf("after the wait: %+v, want admitted", a)
	}
	if a := e.admitFlow(t, 1, key, lim); a.Admitted {
		t.Errorf("at once again: %+v, want refused", a)
	}
	// Refused attempts give their slots back: a full concurrency ceiling
	// (10 refusals, then the burst's two other slots are still there)...
	both := policy.FlowLimits{Ceiling: 1, LeaseTTL: time.Minute, FullWait: time.Second, Interval: lim.Interval, Burst: 3}
	other := policy.BreakerKey{Tenant: "acme", Target: "both"}
	burst := func(what string) {
		t.Helper()
		for slot := range both.Burst {
			a := e.admitFlow(t, slot, other, both)
			if !a.Admitted {
				t.Fatalf("%s: slot %d of the burst = %+v, want admitted: refused attempts gave theirs back", what, slot, a)
			}
			for i := range 10 * min(both.Burst-1-slot, 1) { // while the burst has a slot left
				if r := e.admitFlow(t, i, other, both); r.Admitted || r.Reason != fleet.ReasonFull {
					t.Fatalf("%s: under a full ceiling = %+v, want refused %s", what, r, fleet.ReasonFull)
				}
			}
			if ok, err := e.on(slot+1).ReleaseLease(other, a.LeaseID, both, policy.SignalNone); err != nil || !ok {
				t.Fatalf("%s: ReleaseLease = %v, %v; want true, nil", what, ok, err)
			}
		}
		if a := e.admitFlow(t, 0, other, both); a.Admitted || a.Reason != fleet.ReasonRate {
			t.Fatalf("%s: past the burst = %+v, want refused %s", what, a, fleet.ReasonRate)
		}
	}
	burst("full ceiling")
	// ...and a breaker that refuses.
	e.clock.Advance(time.Duration(both.Burst) * both.Interval)
	if _, err := e.s.ForceBreaker(other, policy.BreakerOpen); err != nil {
		t.Fatalf("ForceBreaker(OPEN) = %v, want nil", err)
	}
	for i := range 10 {
		if a := e.admitFlow(t, i, other, both); a.Admitted || a.Reason != fleet.ReasonForcedOpen || a.LeaseID != "" {
			t.Fatalf("forced OPEN: %+v, want refused %s without a lease", a, fleet.ReasonForcedOpen)
		}
	}
	if _, err := e.s.ResetBreaker(other); err != nil {
		t.Fatalf("ResetBreaker = %v, want nil", err)
	}
	burst("after the breaker's refusals")
}

// invalid reports whether err has the class the server answers
// INVALID_ARGUMENT.
func invalid(err error) bool {
	var v interface{ Invalid() bool }
	return errors.As(err, &v) && v.Invalid()
}

// testAdaptive: an adaptive ceiling (fleet.AdaptiveLimit) over the
// replicas: it starts at its maximum, a congestion signal carried by a
// release on one replica halves it for every replica, successes grow it
// by Increase/limit, a second cut waits for a window of outcomes and Hold,
// and a signal counts also with a lease not held. Engines that do not
// apply signals yet leave Engine.Adaptive false and skip it.
func testAdaptive(t *testing.T, e *env) {
	if !e.adaptive {
		t.Skip("the engine does not apply adaptive signals yet (Engine.Adaptive)")
	}
	key := policy.BreakerKey{Tenant: "acme", Target: "learner"}
	lim := policy.FlowLimits{Ceiling: 4, LeaseTTL: 10 * time.Second, FullWait: time.Second,
		Adaptive: policy.AdaptiveBounds{Min: 1, Max: 4, Decrease: 0.5, Increase: 1, Hold: time.Second}}
	admitAll := func(what string, want int) []string {
		t.Helper()
		var n atomic.Int32
		leases := make([]string, workers)
		race(workers, func(i int) {
			a, err := e.on(i).AdmitFlow(key, breaker, lim)
			if err != nil {
				t.Errorf("AdmitFlow = %v, want nil", err)
			}
			if a.Admitted {
				n.Add(1)
				leases[i] = a.LeaseID
			}
		})
		if got := int(n.Load()); got != want {
			t.Fatalf("%s: %d of %d concurrent AdmitFlows over the replicas got a lease, want exactly %d", what, got, workers, want)
		}
		var out []string
		for _, l := range leases {
			if l != "" {
				out = append(out, l)
			}
		}
		return out
	}
	limitIs := func(what string, want float64) {
		t.Helper()
		for i := range e.replicas {
			if st := e.pool(t, i, key); st.Adaptive != want {
				t.Errorf("%s: Pool on replica %d = %+v, want the adaptive limit at %v", what, i, st, want)
			}
		}
	}
	release := func(i int, id string, sig policy.FlowSignal, wantHeld bool) {
		t.Helper()
		if held, err := e.on(i).ReleaseLease(key, id, lim, sig); err != nil || held != wantHeld {
			t.Fatalf("ReleaseLease on replica %d = %v, %v; want %v, nil", i, held, err, wantHeld)
		}
	}
	leases := admitAll("at the maximum", 4)
	limitIs("never moved", 0)
	release(1, leases[0], policy.SignalCongestion, true)
	limitIs("after a congestion signal", 2)
	admitAll("3 out under a ceiling of 2", 0)
	want := 2.0
	for _, l := range leases[1:3] {
		release(2, l, policy.SignalSuccess, true)
		want += lim.Adaptive.Increase / want
	}
	limitIs("after two successes", want)
	admitAll("1 out under a ceiling of 2", 1)
	release(0, fleet.PermitID{7}.String(), policy.SignalCongestion, false)
	limitIs("a congestion signal within Hold of the cut", want)
	e.clock.Advance(2 * lim.Adaptive.Hold)
	release(1, fleet.PermitID{8}.String(), policy.SignalCongestion, false)
	limitIs("a congestion signal past a window and Hold, with a lease not held", want*lim.Adaptive.Decrease)
}
