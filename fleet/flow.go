package fleet

import (
	"time"

	"github.com/policyd/policyd/policy"
)

// Flow is one key's fleet-wide ceilings: its concurrency leases and its
// rate account. The limits are the policy's and are passed in, so a
// changed policy applies to the next admission.
type Flow struct {
	Pool Pool
	Rate Rate
}

// Admit takes what lim asks at now, in this order, and refuses at the
// first that is out with nothing taken: a rate slot (ReasonRate, with the
// exact wait), then a lease (ReasonFull, see Pool.Acquire; the rate slot
// is given back). An admission carries the lease, if any; its breaker
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
	if lim.Ceiling <= 0 {
		return policy.Admission{Admitted: true}, e
	}
	a, e2 := f.Pool.Acquire(now, lim.Ceiling, int64(lim.LeaseTTL), int64(lim.FullWait), newID)
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
