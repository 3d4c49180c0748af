package fleet_test

import (
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

func TestAdaptiveBoundsDefaults(t *testing.T) {
	p := policy.Policy{Flow: policy.FlowConfig{MaxInFlight: 32, Adaptive: policy.Adaptive{Enabled: true}}}
	b := p.FlowLimits().Adaptive
	want := policy.AdaptiveBounds{Min: 1, Max: 32, Decrease: policy.DefaultAdaptiveDecrease,
		Increase: policy.DefaultAdaptiveIncrease}
	if b != want {
		t.Fatalf("bounds %+v, want %+v", b, want)
	}
	p.Flow.Adaptive.Enabled = false
	if b := p.FlowLimits().Adaptive; b.Max != 0 {
		t.Fatalf("disabled adaptive ceiling resolved as %+v, want none", b)
	}
}

func TestAdaptiveLimitRules(t *testing.T) {
	b := policy.AdaptiveBounds{Min: 4, Max: 20, Decrease: 0.5, Increase: 1, Hold: time.Second}
	var l fleet.AdaptiveLimit
	if got := l.Ceiling(b); got != 20 {
		t.Fatalf("fresh limit: ceiling %d, want the maximum 20", got)
	}
	if cut, e := l.Congested(sec, b); !cut || e != fleet.Mutated || l.Limit != 10 {
		t.Fatalf("first congestion: cut %v effect %b limit %v, want cut to 10", cut, e, l.Limit)
	}
	// The rest of the same window's refusals change nothing: the next cut
	// waits for a window of outcomes (10) and the hold.
	for i := range 9 {
		if cut, _ := l.Congested(2*sec, b); cut || l.Limit != 10 {
			t.Fatalf("refusal %d of the window: cut %v limit %v, want unchanged 10", i, cut, l.Limit)
		}
	}
	if cut, _ := l.Congested(sec+sec/2, b); cut {
		t.Fatalf("a window later but within the hold: cut, want unchanged")
	}
	if cut, _ := l.Congested(2*sec, b); !cut || l.Limit != 5 {
		t.Fatalf("a window and the hold later: cut %v limit %v, want cut to 5", cut, l.Limit)
	}
	l = fleet.AdaptiveLimit{Limit: 10, LastDecrease: sec}
	// A full window of successes (10 at a limit of 10) adds about one.
	for range 10 {
		l.Succeeded(b)
	}
	if got := l.Ceiling(b); got != 10 || l.Limit < 10.9 || l.Limit > 11 {
		t.Fatalf("after one window of successes: limit %v ceiling %d, want just under 11", l.Limit, got)
	}
	// The floor holds however long the congestion lasts.
	for i := range 100 {
		l.Congested(int64(3+i)*sec, b)
	}
	if got := l.Ceiling(b); got != 4 {
		t.Fatalf("after sustained congestion: ceiling %d, want the floor 4", got)
	}
	// The maximum holds however long the successes last.
	for range 10000 {
		l.Succeeded(b)
	}
	if got := l.Ceiling(b); got != 20 {
		t.Fatalf("after many successes: ceiling %d, want the maximum 20", got)
	}
	// A maximum lowered under the limit clamps it at once.
	b.Max = 8
	if got := l.Ceiling(b); got != 8 {
		t.Fatalf("maximum lowered to 8: ceiling %d, want 8", got)
	}
}

// TestAdaptiveLimitSettles drives the limit against an upstream with a
// hidden capacity of 12: a window of requests at a ceiling above 12 draws
// a 429, one at or below succeeds. With the defaults the ceiling settles
// just under the capacity and the share of windows refused stays small.
func TestAdaptiveLimitSettles(t *testing.T) {
	p := policy.Policy{Flow: policy.FlowConfig{MaxInFlight: 64, Adaptive: policy.Adaptive{Enabled: true}}}
	b := p.FlowLimits().Adaptive
	var l fleet.AdaptiveLimit
	const capacity, rounds = 12, 2000
	now, refused := int64(0), 0
	lo, hi := 1<<30, 0
	for i := range rounds {
		now += int64(100 * time.Millisecond)
		c := l.Ceiling(b)
		if i >= rounds/2 {
			lo, hi = min(lo, c), max(hi, c)
		}
		for j := range c {
			if j >= capacity {
				l.Congested(now, b)
				if i >= rounds/2 {
					refused++
				}
				continue
			}
			l.Succeeded(b)
		}
	}
	t.Logf("second half: ceiling between %d and %d, %d requests refused", lo, hi, refused)
	if lo < 8 || hi > 14 {
		t.Fatalf("settled between %d and %d, want within [8, 14]", lo, hi)
	}
	if total := rounds / 2 * capacity; refused*50 > total {
		t.Fatalf("%d of about %d requests refused over the second half, want under 2%%", refused, total)
	}
}

// TestFlowAdaptive: a Flow with an adaptive ceiling admits exactly its
// Ceiling leases, and a release carries its signal to the limit, also for
// a lease no longer held; a release without a signal, or under limits
// without an adaptive ceiling, leaves it alone.
func TestFlowAdaptive(t *testing.T) {
	lim := policy.FlowLimits{Ceiling: 10, LeaseTTL: 10 * time.Second, FullWait: time.Second,
		Adaptive: policy.AdaptiveBounds{Min: 2, Max: 10, Decrease: 0.5, Increase: 1}}
	var f fleet.Flow
	var n byte
	newID := func() fleet.PermitID { n++; return fleet.PermitID{n} }
	if cut, _ := f.Adaptive.Congested(sec, lim.Adaptive); !cut {
		t.Fatalf("first congestion did not cut")
	}
	var leases []string
	for i := range 6 {
		a, _ := f.Admit(sec, &lim, newID)
		if a.Admitted != (i < 5) {
			t.Fatalf("admission %d at an adaptive ceiling of 5: admitted %v, want %v", i, a.Admitted, i < 5)
		}
		if a.Admitted {
			leases = append(leases, a.LeaseID)
		}
	}
	if held, _ := f.Release(sec, leases[0], &lim, policy.SignalSuccess); !held || f.Adaptive.Limit != 5.2 {
		t.Fatalf("success release: held %v limit %v, want held and 5.2", held, f.Adaptive.Limit)
	}
	if held, _ := f.Release(sec, leases[0], &lim, policy.SignalSuccess); held || f.Adaptive.Limit <= 5.2 {
		t.Fatalf("success release of a lease returned before: held %v limit %v, want not held and grown", held, f.Adaptive.Limit)
	}
	before := f.Adaptive
	f.Release(sec, leases[1], &lim, policy.SignalNone)
	noAdaptive := lim
	noAdaptive.Adaptive = policy.AdaptiveBounds{}
	f.Release(sec, leases[2], &noAdaptive, policy.SignalCongestion)
	if f.Adaptive != before {
		t.Fatalf("releases without a signal or an adaptive ceiling changed the limit: %+v, want %+v", f.Adaptive, before)
	}
	if f.Adaptive.Decreases != 1 {
		t.Fatalf("decreases %d, want 1", f.Adaptive.Decreases)
	}
}
