package fleet

import (
	"time"

	"github.com/policyd/policyd/policy"
)

// Flow is one key's fleet-wide ceilings: its concurrency leases, its
// rate account and its adaptive ceiling. The limits are the policy's and
// are passed in, so a changed policy applies to the next admission.
type Flow struct {
	Pool     Pool
	Rate     Rate
	Adaptive AdaptiveLimit
}

// Ceiling returns the concurrency ceiling lim sets at this moment: the
// adaptive limit's Ceiling when lim has one (lim.Adaptive.Max set), else
// lim.Ceiling.
func (f *Flow) Ceiling(lim *policy.FlowLimits) int {
	if lim.Adaptive.Max > 0 {
		return f.Adaptive.Ceiling(lim.Adaptive)
	}
	return lim.Ceiling
}

// Release returns the lease id at now (Pool.Release) and, when lim has an
// adaptive ceiling, tells it what the attempt's outcome says (sig): a
// success grows it (AdaptiveLimit.Succeeded), a congestion signal may cut
// it (AdaptiveLimit.Congested at now), SignalNone changes nothing. The
// signal applies also when the lease was no longer held (expired, returned
// before): the outcome happened either way. It reports whether the lease
// was held.
func (f *Flow) Release(now int64, id string, lim *policy.FlowLimits, sig policy.FlowSignal) (bool, Effect) {
	held, e := f.Pool.Release(now, id)
	if lim.Adaptive.Max > 0 {
		switch sig {
		case policy.SignalSuccess:
			e |= f.Adaptive.Succeeded(lim.Adaptive)
		case policy.SignalCongestion:
			_, e2 := f.Adaptive.Congested(now, lim.Adaptive)
			e |= e2
		}
	}
	return held, e
}

// Admit takes what lim asks at now, in this order, and refuses at the
// first that is out with nothing taken: a rate slot (ReasonRate, with the
// exact wait), then a lease under Ceiling(lim) (ReasonFull, see
// Pool.Acquire; the rate slot is given back). An admission carries the lease, if any; its breaker
// fields are the breaker's to fill. A caller whose breaker then refuses
// gives back what was taken with Undo.
func (f *Flow) Admit(now int64, lim *policy.FlowLimits, newID func() PermitID) (policy.Admission, Effect) {
	var e Effect
	interval := int64(lim.Interval)
	if interval > 0 {
		ok, wait, e2 := f.Rate.Take(now, interval, lim.Burst)
		if !ok {
			return policy.Admission{Reason: ReasonRate, RetryAfter: time.Duration(wait)}, 0
		}
		e |= e2
	}
	ceiling := f.Ceiling(lim)
	if ceiling <= 0 {
		return policy.Admission{Admitted: true}, e
	}
	a, e2 := f.Pool.Acquire(now, ceiling, int64(lim.LeaseTTL), int64(lim.FullWait), newID)
	e |= e2
	if !a.Admitted && interval > 0 {
		e |= f.Rate.Refund(now, interval)
	}
	return a, e
}

// Undo gives back what an admission a of Admit took at now: its lease
// and its rate slot, as if the attempt never was.
func (f *Flow) Undo(now int64, lim *policy.FlowLimits, a *policy.Admission) Effect {
	var e Effect
	if a.LeaseID != "" {
		_, e = f.Pool.Release(now, a.LeaseID)
	}
	if lim.Interval > 0 {
		e |= f.Rate.Refund(now, int64(lim.Interval))
	}
	return e
}
