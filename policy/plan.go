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
	// TTLMargin is added to the window for the idempotency-key TTL, >= 0.
	TTLMargin time.Duration
	// MaxAttempts caps the plan, 1 to 100; 0 means 100.
	MaxAttempts int
}

// Plan is the result of planning retries into a window.
type Plan struct {
	// Window is the window planned for.
	Window time.Duration
	// MaxAttempts is the largest attempt count, counting the first, whose
	// timeouts and nominal delays fit the window.
	MaxAttempts int
	// AttemptTimeout is the timeout reserved for every attempt; for an inner
	// hop of SplitHops, the one derived for that hop.
	AttemptTimeout time.Duration
	// Delays is the nominal delay before each retry: MaxAttempts-1 entries.
	Delays []time.Duration
	// WorstCase is the nominal delays plus every attempt's timeout: the
	// longest the call can take, <= Window.
	WorstCase time.Duration
	// IdempotencyTTL is how long the upstream must remember an idempotency
	// key: Window + TTLMargin, never jittered.
	IdempotencyTTL time.Duration
}

// PlanBudget returns the largest attempt count m (1 to in.MaxAttempts, or 100)
// with m*in.AttemptTimeout + Nominal(0) + ... + Nominal(m-2) <= in.Window,
// with its schedule. It returns a *FieldError when in is invalid or when even
// one attempt does not fit ("attempt_timeout: must not exceed window").
func PlanBudget(in PlanInput) (Plan, error) {
	if err := in.Validate(); err != nil {
		return Plan{}, err
	}
	if in.AttemptTimeout > in.Window {
		return Plan{}, fieldErr("attempt_timeout", "must not exceed window")
	}
	limit := in.MaxAttempts
	if limit == 0 {
		limit = maxAttemptsCap
	}
	m, total := 1, in.AttemptTimeout
	for m < limit {
		// total <= Window, so Window-total never overflows; comparing with
		// what is left keeps sums near the largest Duration exact.
		left := in.Window - total
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
	return Plan{
		Window:         in.Window,
		MaxAttempts:    m,
		AttemptTimeout: in.AttemptTimeout,
		Delays:         delays,
		WorstCase:      total,
		IdempotencyTTL: in.Window + in.TTLMargin, // Validate rules out overflow
	}, nil
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
// short to leave an inner hop room for one attempt. hops is 1 to 16.
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
