package fleet

import (
	"time"

	"github.com/policyd/policyd/policy"
)

// KeyRecord is one idempotency key's record: create-only per key, at most
// one live lease, kept until Expires (never shortened). State is
// KeyInFlight (Lease held until LeaseUntil), KeySucceeded (Result is the
// upstream's reference), KeyUnknown (an attempt's outcome was lost) or
// KeyNew (released by a failed attempt). Times are Unix ns; Lease is the
// holder's lease id, 0 for none.
type KeyRecord struct {
	State      policy.KeyState
	Lease      uint64
	LeaseUntil int64
	Expires    int64
	Result     string
}

// ErrLease refuses a CompleteKey whose lease is not the key's current one.
var ErrLease = &Refusal{Field: "lease_id",
	Rule: "is not the key's current lease: another worker took it over, or the key was completed already"}

// Claim applies a claim at now to r (exists false: no record, or one
// expired, which counts as none) with a fresh lease id and c's lease end
// and expiry, and returns the answer and whether r changed:
//
//   - no live record, or one released by a failed attempt: NEW, leased;
//   - SUCCEEDED: SUCCEEDED with the result reference, unchanged;
//   - IN_FLIGHT with a live lease: IN_FLIGHT, with the time the lease
//     still runs, unchanged;
//   - UNKNOWN, or IN_FLIGHT with an expired lease (its holder lost the
//     outcome): UNKNOWN, leased again when the upstream deduplicates by
//     key (c.Dedupes), else left UNKNOWN without a lease: the caller must
//     dead-letter the call.
//
// The expiry only moves later.
func (r *KeyRecord) Claim(exists bool, now int64, lease uint64, c *policy.KeyClaim) (a policy.KeyAnswer, changed bool) {
	until, expires := c.LeaseUntil.UnixNano(), c.Expires.UnixNano()
	take := func(st policy.KeyState, reason string) (policy.KeyAnswer, bool) {
		*r = KeyRecord{State: policy.KeyInFlight, Lease: lease, LeaseUntil: until, Expires: max(expires, r.Expires)}
		return policy.KeyAnswer{State: st, LeaseUntil: c.LeaseUntil, Reason: reason}, true
	}
	if !exists || now >= r.Expires {
		*r = KeyRecord{}
		return take(policy.KeyNew, "idempotency:new")
	}
	switch {
	case r.State == policy.KeyNew:
		return take(policy.KeyNew, "idempotency:new")
	case r.State == policy.KeySucceeded:
		return policy.KeyAnswer{State: policy.KeySucceeded, ResultRef: r.Result, Reason: "idempotency:succeeded"}, false
	case r.State == policy.KeyInFlight && now < r.LeaseUntil:
		return policy.KeyAnswer{State: policy.KeyInFlight, RetryAfter: time.Duration(r.LeaseUntil - now), Reason: "idempotency:in_flight"}, false
	case c.Dedupes:
		return take(policy.KeyUnknown, "idempotency:unknown_retry")
	}
	changed = r.State != policy.KeyUnknown || r.Lease != 0
	r.State, r.Lease, r.LeaseUntil = policy.KeyUnknown, 0, 0
	return policy.KeyAnswer{State: policy.KeyUnknown, Reason: "idempotency:unknown"}, changed
}

// Complete records how the attempt holding lease ended, at now: SUCCEEDED
// keeps result for later claims, FAILED frees the key, UNKNOWN marks the
// outcome lost. A lease that is not the record's current one is ErrLease
// (r unchanged). The expiry only moves later, to expires at least.
func (r *KeyRecord) Complete(now int64, lease uint64, o policy.KeyOutcome, result string, expires int64) error {
	if r.State != policy.KeyInFlight || r.Lease != lease || lease == 0 || now >= r.Expires {
		return ErrLease
	}
	switch o {
	case policy.KeyOutcomeSucceeded:
		r.State, r.Result = policy.KeySucceeded, result
	case policy.KeyOutcomeFailed:
		r.State = policy.KeyNew
	default:
		r.State = policy.KeyUnknown
	}
	r.Lease, r.LeaseUntil, r.Expires = 0, 0, max(r.Expires, expires)
	return nil
}
