package fleet

import (
	"time"

	"github.com/policyd/policyd/policy"
)

// The fleet-wide rules of a NextDelay decision, after the stateless ones
// (policy.Decide) and the breaker's record of the failure: GateRetry, then
// the budgets (an engine's spend, the tenant's Bucket and the run's pool),
// then Spent, then CutRun. The server applies them over an engine's
// values; redisstore's policyd_nextdelay mirrors them in one call.

// GateRetry applies to dec, a retry the stateless rules decided, the
// fleet-wide rules that come before the budgets, in order: the next
// attempt's breaker in state OPEN stops it (CIRCUIT_OPEN); a cool-down in
// force until cooldown (Unix ns; 0 or any time before now for none) that
// lasts longer than its delay spreads the delay over the cool-down
// (policy.SpreadHint of p.Pushback with the draw u); a delay that then no
// longer fits dec.Deadline with p.AttemptTimeout reserved stops it
// (DEADLINE, DEAD_LETTER). spread reports the spreading (the answer's
// note says so). ask is true when the retry still stands: the budgets are
// to be asked next, and dec's checks then include the tenant's budget and,
// with hasRun, the run's. dec is left alone when it is not a retry.
func GateRetry(dec *policy.Decision, p *policy.Policy, breaker policy.BreakerState, cooldown, now int64, hasRun bool, u float64) (ask, spread bool) {
	if !dec.Retry {
		return false, false
	}
	if breaker == policy.BreakerOpen {
		stopRetry(dec, policy.StopCircuitOpen, policy.DispositionCircuitOpen)
		return false, false
	}
	if wait := time.Duration(cooldown - now); cooldown > now && wait > dec.Delay {
		// Another worker was told to back off: wait with it, spread out.
		dec.Delay, spread = policy.SpreadHint(p.Pushback, wait, u), true
	}
	if !policy.FitsDeadline(time.Unix(0, now), dec.Deadline, dec.Delay, p.AttemptTimeout) {
		stopRetry(dec, policy.StopDeadline, policy.DispositionDeadLetter)
		return false, spread
	}
	dec.Checks |= policy.CheckTenantBudget
	if hasRun {
		dec.Checks |= policy.CheckRunBudget
	}
	return true, spread
}

// Spent applies the budgets' answer sp to a retry GateRetry let through:
// a refusal stops it with the budgets' reason and disposition.
func Spent(dec *policy.Decision, sp *policy.Spend) {
	if !sp.Granted {
		stopRetry(dec, sp.Stop, sp.Disposition)
	}
}

// CutRun applies a run's cut-off (Unix ns, 0 for a call of no run) to
// dec once the rest is decided: past the cut-off every stop but a
// terminal failure is a cut (DEADLINE_CUT), and so is a deadline stop
// when the run's cut-off was the deadline that bound (cutBinds: it came
// before the call's own), not the call's own (DEAD_LETTER).
func CutRun(dec *policy.Decision, cutoff, now int64, cutBinds bool) {
	switch {
	case dec.Retry:
	case cutoff != 0 && now >= cutoff && dec.Disposition != policy.DispositionFailedTerminal:
		dec.Disposition = policy.DispositionDeadlineCut
	case dec.Stop == policy.StopDeadline && cutBinds:
		dec.Disposition = policy.DispositionDeadlineCut
	}
}

// UnixNano is t in Unix nanoseconds, 0 for the zero time: the "none" of
// the times these rules take (a cool-down, a run's cut-off).
func UnixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// UnixTime is the time of ns Unix nanoseconds, the zero time for 0:
// UnixNano's inverse.
func UnixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// SpreadNote is the note of an answer whose delay GateRetry spread over
// the fleet's cool-down, note the answer's note before.
func SpreadNote(note string) string {
	if note != "" {
		return note + ",cooldown:fleet"
	}
	return "cooldown:fleet"
}

// stopRetry turns dec into a stop for reason r with disposition disp.
func stopRetry(dec *policy.Decision, r policy.StopReason, disp policy.Disposition) {
	dec.Retry, dec.Delay, dec.Stop, dec.Disposition = false, 0, r, disp
}
