package policy

import (
	"math/bits"
	"strconv"
	"time"
)

// PlanInput is a request to plan retries into a window.
type PlanInput struct {
	// Window is the time the whole call may take, > 0.
	Window time.Duration
	// Backoff is the schedule; its jitter is ignored, since plans use nominal
	// delays, which jitter never exceeds.
	Backoff Backoff
	// AttemptTimeout is reserved for every attempt, >= 0.
	AttemptTimeout time.Duration
	// TTLMargin is added to the remaining window for the idempotency-key
	// TTL, >= 0; 0 means the default, DefaultTTLMargin(Window,
	// AttemptTimeout), so that the TTL always outlives the window.
	TTLMargin time.Duration
	// MaxAttempts caps the plan, 1 to 100; 0 means 100.
	MaxAttempts int
	// Origin, when not zero, is when the window began (the event's origin
	// time): the plan fits what is left of the window at Now, Window less
	// Now-Origin. An Origin after Now counts as Now; how far after is the
	// caller's rule to check.
	Origin time.Time
	// Now is the time the plan is made at; it is read only with Origin.
	Now time.Time
	// Reserve is the fraction of the remaining window kept as headroom, in
	// [0, 1): the schedule fits Remaining * (1 - Reserve).
	Reserve float64
}

// Plan is the result of planning retries into a window.
type Plan struct {
	// Window is the window planned for.
	Window time.Duration
	// Remaining is what is left of the window at the time of planning:
	// Window less the time since the origin, never below zero; Window when
	// there is no origin.
	Remaining time.Duration
	// Usable is the part of Remaining the schedule fits: Remaining * (1 -
	// reserve), rounded down.
	Usable time.Duration
	// MaxAttempts is the largest attempt count, counting the first, whose
	// timeouts and nominal delays fit Usable; 0 when not even one does, with
	// Reason saying why.
	MaxAttempts int
	// Reason is empty when MaxAttempts > 0, else PlanWindowSpent or
	// PlanNoRoom.
	Reason string
	// AttemptTimeout is the timeout reserved for every attempt; for an inner
	// hop of SplitHops, the one derived for that hop.
	AttemptTimeout time.Duration
	// Delays is the nominal delay before each retry: MaxAttempts-1 entries.
	Delays []time.Duration
	// WorstCase is the nominal delays plus every attempt's timeout: the
	// longest the call can take, <= Usable.
	WorstCase time.Duration
	// IdempotencyTTL is how long, from the time of planning, the upstream
	// must remember an idempotency key: Remaining plus the TTL margin (the
	// default margin when none is given), never jittered, and always longer
	// than Remaining.
	IdempotencyTTL time.Duration
}

// Reasons a Plan has no attempt.
const (
	// PlanWindowSpent: the window has passed since the origin.
	PlanWindowSpent = "window:spent"
	// PlanNoRoom: what is left of the window, less the reserve, is shorter
	// than one attempt timeout.
	PlanNoRoom = "window:no_room"
)

// DefaultTTLMargin is the idempotency-key TTL margin PlanBudget adds when
// none is given: the largest of one attempt timeout, a tenth of the window
// and one millisecond. A late retry that started just before the window
// closed thus still finds its key.
func DefaultTTLMargin(window, attemptTimeout time.Duration) time.Duration {
	return max(attemptTimeout, window/10, time.Millisecond)
}

// remaining returns what is left of in's window at in.Now, and the part of
// it outside the reserve.
func (in PlanInput) remaining() (remaining, usable time.Duration) {
	remaining = in.Window
	if !in.Origin.IsZero() {
		if elapsed := in.Now.Sub(in.Origin); elapsed >= in.Window {
			return 0, 0
		} else if elapsed > 0 {
			remaining -= elapsed
		}
	}
	if in.Reserve == 0 {
		return remaining, remaining
	}
	// A product that rounds to remaining or above (a tiny reserve, or
	// remaining near the largest Duration, where float64 rounds up) keeps
	// remaining: converting it could overflow.
	u := float64(remaining) * (1 - in.Reserve)
	if u >= float64(remaining) {
		return remaining, remaining
	}
	return remaining, min(remaining, time.Duration(u))
}

// PlanBudget returns the largest attempt count m (1 to in.MaxAttempts, or 100)
// with m*in.AttemptTimeout + Nominal(0) + ... + Nominal(m-2) <= U, with its
// schedule. U, the usable window, is what is left of in.Window at in.Now
// when in.Origin is set (all of it otherwise), times 1 - in.Reserve. When the
// window is spent or U is shorter than one attempt timeout, the plan has no
// attempt and a Reason; this is an answer, not an error. PlanBudget returns a
// *FieldError when in is invalid or when even the whole window does not fit
// one attempt ("attempt_timeout: must not exceed window").
func PlanBudget(in PlanInput) (Plan, error) {
	if err := in.Validate(); err != nil {
		return Plan{}, err
	}
	if in.AttemptTimeout > in.Window {
		return Plan{}, fieldErr("attempt_timeout", "must not exceed window")
	}
	margin := in.TTLMargin
	if margin == 0 {
		margin = DefaultTTLMargin(in.Window, in.AttemptTimeout) // Validate rules out overflow
	}
	remaining, usable := in.remaining()
	plan := Plan{
		Window:         in.Window,
		Remaining:      remaining,
		Usable:         usable,
		AttemptTimeout: in.AttemptTimeout,
		IdempotencyTTL: remaining + margin, // Validate rules out overflow
	}
	switch {
	case remaining == 0:
		plan.Reason, plan.Delays = PlanWindowSpent, []time.Duration{}
		return plan, nil
	case in.AttemptTimeout > usable:
		plan.Reason, plan.Delays = PlanNoRoom, []time.Duration{}
		return plan, nil
	}
	limit := in.MaxAttempts
	if limit == 0 {
		limit = maxAttemptsCap
	}
	m, total := 1, in.AttemptTimeout
	for m < limit {
		// total <= usable, so usable-total never overflows; comparing with
		// what is left keeps sums near the largest Duration exact.
		left := usable - total
		step := Nominal(in.Backoff, m-1)
		if step > left || in.AttemptTimeout > left-step {
			break
		}
		m, total = m+1, total+step+in.AttemptTimeout
	}
	delays := make([]time.Duration, m-1)
	for n := range delays {
		delays[n] = Nominal(in.Backoff, n)
	}
	plan.MaxAttempts, plan.Delays, plan.WorstCase = m, delays, total
	return plan, nil
}

// maxHops is the most hops SplitHops plans.
const maxHops = 16

// mulDiv returns a*b/c for 0 <= a, b <= c and c > 0, without overflow.
func mulDiv(a, b, c time.Duration) time.Duration {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, _ := bits.Div64(hi, lo, uint64(c)) // a*b/c <= a fits, so no panic
	return time.Duration(q)
}

// SplitHops plans a chain of hops calls, hop 1 being the caller with in's
// window W1 and attempt timeout A1 (which must be > 0 when hops > 1). The
// whole window of an inner hop must fit into one attempt of the hop before:
// W(i+1) = A(i) - max(A(i)/10, 1ms), and A(i+1) = A(i) * W(i+1) / W(i) keeps
// the proportion of attempt timeout to window. Each inner window is thus
// strictly smaller than the one before. Inner hops cap the backoff's base and
// max delay at their window. SplitHops returns one Plan per hop, or a
// *FieldError naming the field at fault, e.g. when the attempt timeout is too
// short to leave an inner hop room for one attempt. hops is 1 to 16. The
// origin and the reserve shape hop 1's schedule only: an inner hop's window
// is one attempt of the hop before, whole.
func SplitHops(in PlanInput, hops int) ([]Plan, error) {
	if hops < 1 || hops > maxHops {
		return nil, fieldErr("hops", "must be between 1 and 16")
	}
	if hops > 1 && in.AttemptTimeout <= 0 {
		return nil, fieldErr("attempt_timeout", "must be > 0 when hops > 1")
	}
	plans := make([]Plan, 0, hops)
	hop := in
	for i := 1; i <= hops; i++ {
		if i > 1 {
			a, w := hop.AttemptTimeout, hop.Window
			inner := a - max(a/10, time.Millisecond)
			if inner <= 0 {
				return nil, fieldErr("attempt_timeout", "too short to leave hop "+strconv.Itoa(i)+" a window")
			}
			hop.Window = inner
			hop.AttemptTimeout = mulDiv(a, inner, w)
			if hop.AttemptTimeout <= 0 {
				return nil, fieldErr("attempt_timeout", "too short to leave hop "+strconv.Itoa(i)+" an attempt timeout")
			}
			hop.Backoff.Base = min(hop.Backoff.Base, inner)
			hop.Backoff.Max = min(hop.Backoff.Max, inner)
			hop.Origin, hop.Reserve = time.Time{}, 0
		}
		p, err := PlanBudget(hop)
		if err != nil {
			if fe, ok := err.(*FieldError); ok && i > 1 {
				return nil, fieldErr(fe.Field, fe.Rule+" (hop "+strconv.Itoa(i)+")")
			}
			return nil, err
		}
		plans = append(plans, p)
	}
	return plans, nil
}
