package fleet

import "github.com/policyd/policyd/policy"

// FinalReport is a call's reported final disposition with what it is
// checked against: the outcome it came with, what policyd decided for the
// call, and the shared state at now. Times are Unix ns; zero means none.
type FinalReport struct {
	Final   Final
	Success bool
	// Failure is the category of the failure the outcome carries,
	// classified by policyd; zero when it carries none (a success, or a
	// failure already told to NextDelay).
	Failure policy.Category
	// Decided is set when policyd answered the call; Answer is then its
	// answer to the highest attempt.
	Decided bool
	Answer  policy.Answer
	// Breaker is the call's breaker now, when it has one.
	Breaker      policy.BreakerState
	HasBreaker   bool
	Transitioned bool  // the breaker has left CLOSED at least once
	Changed      int64 // the breaker's last state change
	CooldownEnd  int64 // the breaker's fleet-wide cool-down end (the latest one, past or not)
	Now          int64
	Deadline     int64 // the call's deadline
	Cutoff       int64 // the run's cut-off
	// Horizon is how long a call can go on under its policy (Horizon);
	// a breaker that closed within it may have refused the call.
	Horizon int64
	// AttemptTimeout is reserved before each attempt under the policy.
	AttemptTimeout int64
}

// CheckFinal returns the rule a final disposition breaks, or "" when it
// agrees with the outcome and with what policyd decided:
//
//   - SUCCEEDED only with a success, and a success only with SUCCEEDED;
//   - when policyd stopped the call, the disposition (and the stop reason,
//     when given) it decided, nothing else;
//   - otherwise FAILED_TERMINAL only with a failure not classified
//     transient, and never after policyd answered a transient failure with
//     RETRY unless a later failure is reported;
//   - DEAD_LETTER only with a transient failure (a server's pushback:
//     any failure);
//   - CIRCUIT_OPEN only while the call's breaker is not CLOSED or a
//     fleet-wide cool-down refuses admission, or within the policy's
//     horizon after either;
//   - DEADLINE_CUT only past the run's cut-off or the call's deadline, or
//     with a deadline that a fleet-wide cool-down in force leaves no room
//     before.
//
// Two cases cannot be checked and are accepted: FAILED_TERMINAL for a call
// policyd never saw fail, reported with no failure (the Go client reports
// an error of no kind it knows that way), and DEADLINE_CUT for a call
// whose deadline policyd does not know (neither the outcome nor a decision
// carried one), before its run's cut-off: a caller that cancels a call
// cuts it at a deadline of its own (both clients report a cancelled call
// so).
func CheckFinal(r *FinalReport) string {
	d := r.Final.Disposition
	switch {
	case d == policy.DispositionSucceeded && !r.Success:
		return "SUCCEEDED needs success: true"
	case d != policy.DispositionSucceeded && r.Success:
		return "must be SUCCEEDED or unset when success is true"
	case d == policy.DispositionSucceeded:
		return ""
	}
	if r.Decided && !r.Answer.Retry {
		if d != r.Answer.Disposition || (r.Final.Stop != policy.StopNone && r.Final.Stop != r.Answer.Stop) {
			return "must be " + r.Answer.Disposition.String() + " (" + r.Answer.Stop.String() +
				"), the stop policyd decided for this call"
		}
		return ""
	}
	switch d {
	case policy.DispositionFailedTerminal:
		switch {
		case r.Failure == policy.CategoryTransient:
			return "FAILED_TERMINAL needs a terminal classification; the failure reported is transient"
		case r.Failure == 0 && r.Decided && r.Answer.Category == policy.CategoryTransient:
			return "FAILED_TERMINAL needs a terminal classification; policyd classified this call's failure transient and answered RETRY"
		}
	case policy.DispositionDeadLetter:
		switch {
		case r.Final.Stop == policy.StopServerPushback && r.Failure != 0:
		case r.Failure != policy.CategoryTransient:
			return "DEAD_LETTER needs a STOP policyd decided for this call or a transient failure that justifies it"
		}
	case policy.DispositionCircuitOpen:
		switch {
		case r.HasBreaker && r.Breaker != policy.BreakerClosed && r.Breaker != policy.BreakerDisabled:
		case r.HasBreaker && r.Transitioned && r.Now-r.Changed <= r.Horizon:
		case r.HasBreaker && r.CooldownEnd != 0 && r.Now-r.CooldownEnd <= r.Horizon:
			// A fleet-wide cool-down refuses admission too.
		default:
			return "CIRCUIT_OPEN needs the call's breaker to have refused it; it is CLOSED"
		}
	case policy.DispositionDeadlineCut:
		switch {
		case r.Cutoff != 0 && r.Now >= r.Cutoff:
		case r.Deadline == 0:
			// A caller that cancels cuts the call at a deadline of its
			// own, which policyd cannot know.
		case r.Now >= r.Deadline:
		case r.CooldownEnd > r.Now && r.CooldownEnd+r.AttemptTimeout > r.Deadline:
		default:
			return "DEADLINE_CUT needs the run's cut-off or the call's deadline to have passed"
		}
	}
	return ""
}
