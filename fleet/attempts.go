package fleet

import (
	"strconv"
	"time"

	"github.com/policyd/policyd/policy"
)

// Attempts is what policyd decided for one call: the highest attempt it
// answered and that answer, kept until Expiry (Unix ns). The zero value is
// a call policyd has not seen.
type Attempts struct {
	Attempt uint32
	Answer  policy.Answer
	Expiry  int64
}

// Check says what a NextDelay for attempt at now must get: replay true
// means the same attempt again, to be answered with a.Answer as it was (a
// client retrying the RPC after a lost response spends nothing twice); a
// *Refusal naming attempt means a lower attempt, or any attempt after a
// STOP; otherwise the attempt is decided afresh. A record past its Expiry
// counts as none.
func (a *Attempts) Check(now int64, attempt uint32) (replay bool, err error) {
	switch {
	case a.Attempt == 0 || now >= a.Expiry:
		return false, nil
	case attempt == a.Attempt:
		return true, nil
	case !a.Answer.Retry:
		return false, &Refusal{Field: "attempt", Rule: "the call was stopped at attempt " +
			strconv.FormatUint(uint64(a.Attempt), 10) + " (" + a.Answer.Stop.String() + "): no attempt follows a STOP; expected " +
			strconv.FormatUint(uint64(a.Attempt), 10) + " again or none"}
	case attempt < a.Attempt:
		return false, &Refusal{Field: "attempt", Rule: "must be " + strconv.FormatUint(uint64(a.Attempt)+1, 10) +
			" (or " + strconv.FormatUint(uint64(a.Attempt), 10) + " again): attempt " +
			strconv.FormatUint(uint64(a.Attempt), 10) + " of this call was already decided"}
	}
	return false, nil
}

// Decided records the answer to attempt, kept until expiry (Unix ns). It
// never rewinds: an attempt below the one recorded changes nothing (Check
// refuses those before they are decided).
func (a *Attempts) Decided(attempt uint32, ans policy.Answer, expiry int64) Effect {
	if attempt < a.Attempt {
		return 0
	}
	a.Attempt, a.Answer = attempt, ans
	a.Expiry = max(a.Expiry, expiry)
	return Mutated
}

// Horizon returns how long a call under p can go on from its first
// attempt at most, when it has no deadline: for every retry the larger of
// its nominal delay and the longest pushback hint honoured, plus the
// per-attempt timeout. A record of the call's attempts kept that long
// outlives the call.
func Horizon(p *policy.Policy) time.Duration {
	var h time.Duration
	for n := range max(p.MaxAttempts, 1) {
		h += max(policy.Nominal(p.Backoff, n), p.Pushback.MaxHint) + p.AttemptTimeout
	}
	return h
}

// Keep returns until when (Unix ns) the answer to a call decided at now
// under p must be remembered: the call's deadline, or now plus its horizon,
// whichever is later.
func Keep(p *policy.Policy, now int64, deadline time.Time) int64 {
	keep := now + int64(Horizon(p))
	if !deadline.IsZero() {
		keep = max(keep, deadline.UnixNano())
	}
	return keep
}
