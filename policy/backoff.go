package policy

import (
	"math"
	"time"
)

// maxDuration is the largest time.Duration, about 292 years; arithmetic in
// this package saturates at it instead of overflowing.
const maxDuration = time.Duration(math.MaxInt64)

// twoTo63 is 2^63 as a float64: the first value that does not fit an int64.
const twoTo63 = float64(1 << 63)

// durationOf converts v nanoseconds to a Duration: NaN and values <= 0 give 0,
// values too large for a Duration give maxDuration.
func durationOf(v float64) time.Duration {
	switch {
	case !(v > 0):
		return 0
	case v >= twoTo63:
		return maxDuration
	default:
		return time.Duration(v)
	}
}

// addSat returns a+b for non-negative a and b, saturating at maxDuration.
func addSat(a, b time.Duration) time.Duration {
	if a > maxDuration-b {
		return maxDuration
	}
	return a + b
}

// unit clamps a random draw to [0, 1]; NaN counts as 0.
func unit(u float64) float64 {
	switch {
	case !(u > 0):
		return 0
	case u > 1:
		return 1
	default:
		return u
	}
}

// scale returns d*u for d >= 0 and u in [0, 1], never outside [0, d] despite
// floating-point rounding.
func scale(d time.Duration, u float64) time.Duration {
	r := durationOf(float64(d) * u)
	if r > d {
		return d
	}
	return r
}

// Nominal returns the nominal delay before retry number retry (counted from 0
// for the first retry): min(b.Max, b.Base * b.Factor^retry). It saturates
// instead of overflowing, so any retry count, however large, gives b.Max.
// A negative retry counts as 0; a Base <= 0 gives 0; a Max <= 0 means no cap
// other than the largest Duration; a Factor that is NaN or <= 0 counts as 1.
// Validate rejects all of these.
func Nominal(b Backoff, retry int) time.Duration {
	if b.Base <= 0 {
		return 0
	}
	limit := b.Max
	if limit <= 0 {
		limit = maxDuration
	}
	if retry < 0 {
		retry = 0
	}
	f := b.Factor
	if !(f > 0) {
		f = 1
	}
	v := float64(b.Base) * math.Pow(f, float64(retry))
	if !(v < float64(limit)) {
		return limit
	}
	return min(durationOf(v), limit)
}

// Jittered returns the delay before retry number retry (from 0) under b's
// jitter, given the previous delay prev and a random draw u in [0, 1):
//
//   - JitterNone: the nominal delay.
//   - JitterFull (and JitterUnspecified or any unknown value): u * nominal.
//   - JitterEqual: nominal/2 + u * nominal/2.
//   - JitterDecorrelated: min(nominal, base + u*(3*prev - base)), where a prev
//     <= 0, or one with 3*prev below base, counts as base.
//
// The result is always in [0, Nominal(b, retry)], and for JitterEqual in
// [Nominal/2, Nominal], so budgets computed from nominal delays stay upper
// bounds. A u outside [0, 1] is clamped to it; NaN counts as 0.
func Jittered(b Backoff, retry int, prev time.Duration, u float64) time.Duration {
	n := Nominal(b, retry)
	u = unit(u)
	switch b.Jitter {
	case JitterNone:
		return n
	case JitterEqual:
		half := n / 2
		return half + scale(n-half, u)
	case JitterDecorrelated:
		base := max(b.Base, 0)
		hi := base
		if prev > 0 {
			if prev > maxDuration/3 {
				hi = maxDuration
			} else if 3*prev > base {
				hi = 3 * prev
			}
		}
		return min(n, base+scale(hi-base, u))
	default:
		return scale(n, u)
	}
}
