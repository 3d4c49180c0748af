package fleet

import (
	"slices"
	"time"

	"github.com/policyd/policyd/policy"
)

// Reasons of policy.Admission for a concurrency ceiling, machine-readable.
const (
	ReasonLease = "concurrency:lease" // admitted under the ceiling; return the lease with the outcome
	ReasonFull  = "concurrency:full"  // refused: every lease of the ceiling is out
)

// Lease is a concurrency lease handed out by Pool.Acquire, live until
// Expiry (Unix ns). Its id is 128 random bits, like a probe permit's, so a
// lease cannot be guessed and released by another worker.
type Lease struct {
	ID     PermitID
	Expiry int64
}

// Pool is one fleet-wide concurrency ceiling: the leases live under one
// key (a breaker's key) and the count of releases of leases it did not
// hold. The zero value holds no lease. The ceiling itself is the policy's
// and is passed to Acquire, so a lowered ceiling takes effect at once for
// new leases while the ones out run to their end.
type Pool struct {
	Leases []Lease
	Stray  uint64 // releases of leases not held: expired, returned twice, never handed out
}

// Acquire hands out a lease expiring ttl (ns) after now, with the id
// newID returns, while fewer than ceiling leases are live at now; a lease
// past its expiry no longer counts. Otherwise it refuses with ReasonFull
// and a RetryAfter of wait (ns), or less when a lease expires sooner.
// newID is called only when a lease is handed out. The Admission carries
// the lease id in LeaseID and its expiry in LeaseExpiry; its breaker
// fields are left for the breaker to fill.
func (p *Pool) Acquire(now int64, ceiling int, ttl, wait int64, newID func() PermitID) (policy.Admission, Effect) {
	var e Effect
	if p.expire(now) {
		e = Mutated
	}
	if len(p.Leases) < ceiling {
		l := Lease{ID: newID(), Expiry: now + ttl}
		p.Leases = append(p.Leases, l)
		return policy.Admission{Admitted: true, Reason: ReasonLease, LeaseID: l.ID.String(),
			LeaseExpiry: time.Unix(0, l.Expiry)}, Mutated
	}
	for _, l := range p.Leases {
		wait = min(wait, l.Expiry-now)
	}
	return policy.Admission{Reason: ReasonFull, RetryAfter: time.Duration(max(wait, 0))}, e
}

// Release returns the lease with id and reports whether it was held (live
// at now). A lease not held (expired, returned before, never handed out,
// an id that does not parse) is ignored and counted in Stray: a worker may
// release after expiry, and that must never break a batch.
func (p *Pool) Release(now int64, id string) (bool, Effect) {
	lid, ok := ParsePermitID(id)
	if ok {
		for i, l := range p.Leases {
			if l.ID == lid {
				p.Leases = slices.Delete(p.Leases, i, i+1)
				if l.Expiry > now {
					return true, Mutated
				}
				break
			}
		}
	}
	p.Stray++
	return false, Mutated
}

// Live returns the number of leases live at now.
func (p *Pool) Live(now int64) int {
	n := 0
	for _, l := range p.Leases {
		if l.Expiry > now {
			n++
		}
	}
	return n
}

// expire drops the leases past their expiry and reports whether any was.
func (p *Pool) expire(now int64) bool {
	n := len(p.Leases)
	p.Leases = slices.DeleteFunc(p.Leases, func(l Lease) bool { return l.Expiry <= now })
	return len(p.Leases) != n
}
