package fleet

import (
	"math"

	"github.com/policyd/policyd/policy"
)

// AdaptiveLimit is a fleet-wide concurrency ceiling that learns from the
// upstream by additive increase and multiplicative decrease, as TCP's
// congestion window does (and Netflix's concurrency-limits AIMDLimit):
// every success adds Increase/Limit, so a full window of successes adds
// Increase; a congestion signal (a 429, or a 503 carrying a pushback hint)
// multiplies it by Decrease, at most once per window: after a decrease,
// the next waits until a window's worth of outcomes (the new ceiling's
// number) came back and Hold passed, so the refusals of requests sent
// under the old ceiling cut it once, as TCP cuts once per round trip. It
// stays within [Min, Max], where Max is the policy's max_in_flight and
// also where it starts. The zero value has not started: its first use
// starts it at Max.
type AdaptiveLimit struct {
	Limit        float64 // the current ceiling, exact; 0 before the first use
	LastDecrease int64   // Unix ns of the last decrease; 0 for none
	Since        int64   // outcomes since the last decrease
	Decreases    uint64  // decreases so far, for the metrics; no rule reads it
}

// Ceiling returns the whole number of leases the limit allows now: its
// current value rounded down, within the bounds.
func (l *AdaptiveLimit) Ceiling(b policy.AdaptiveBounds) int {
	return min(max(int(math.Floor(l.current(b))), b.Min), b.Max)
}

// Current returns the limit's exact value within b: Max before the first
// use, and clamped when the bounds changed under it.
func (l *AdaptiveLimit) Current(b policy.AdaptiveBounds) float64 { return l.current(b) }

func (l *AdaptiveLimit) current(b policy.AdaptiveBounds) float64 {
	if l.Limit == 0 {
		return float64(b.Max)
	}
	return min(max(l.Limit, float64(b.Min)), float64(b.Max))
}

// Succeeded grows the limit by Increase/limit for one success.
func (l *AdaptiveLimit) Succeeded(b policy.AdaptiveBounds) Effect {
	cur := l.current(b)
	l.Limit = min(cur+b.Increase/cur, float64(b.Max))
	l.Since++
	return Mutated
}

// Congested shrinks the limit by Decrease for a congestion signal at now,
// unless the last decrease was less than a window of outcomes or Hold
// before now. It reports whether the limit shrank.
func (l *AdaptiveLimit) Congested(now int64, b policy.AdaptiveBounds) (bool, Effect) {
	cur := l.current(b)
	if l.LastDecrease != 0 && (l.Since < int64(math.Floor(cur)) || now-l.LastDecrease < int64(b.Hold)) {
		l.Since++
		return false, Mutated
	}
	l.Limit = max(cur*b.Decrease, float64(b.Min))
	l.LastDecrease, l.Since = now, 0
	l.Decreases++
	return true, Mutated
}
