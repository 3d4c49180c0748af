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
	// Recorded says the outcome's failure was told to NextDelay
	// (already_recorded): policyd answered the attempt.
	Recorded bool
	// Decided is set when policyd answered the call; Answer is then its
	// answer to the highest attempt.
	Decided bool
	Answer  policy.Answer
	// Stale says Answer is a RETRY to an earlier attempt than the one
	// reported, whose failure was told to NextDelay (Recorded): the answer
	// to the attempt reported is not remembered, as when a replica that
	// could not reach its store decided it and the store never got it.
	Stale bool
	// Breaker is the call's breaker now, when it has one.
	Breaker      policy.BreakerState
	HasBreaker   bool
	Transitioned bool  // the breaker has left CLOSED at least once
	Changed      int64 // the breaker's last state change
	CooldownEnd  int64 // the breaker's fleet-wide cool-down end (the latest one, past or not)
	Now          int64
	Deadline     int64 // the call's deadline
	Cutoff       int64 // the run's cut-off
	// Skew is how far the reporter's clock may run ahead of now (ns): a
	// client ends a call DEADLINE_CUT by its own clock, checking the
	// run's cut-off locally.
	Skew int64
	// HasKey says the call carries an idempotency key. A DEAD_LETTER
	// (NOT_IDEMPOTENT) is then one the ledger ordered (a lost outcome), or
	// a client's that could not claim the key (policyd or its store away,
	// after a lost outcome, once told another worker holds the key, or
	// always with the Go client's RequireClaim), so did not write.
	HasKey bool
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
//     RETRY unless a later failure is reported (or told to NextDelay for a
//     later attempt: Stale);
//   - DEAD_LETTER only with a transient failure (a server's pushback:
//     any failure, and after policyd answered a transient failure of
//     the call with RETRY, and NOT_IDEMPOTENT when the call's idempotency
//     carries an idempotency key); DEAD_LETTER with stop reason
//     DEADLINE only past the
//     call's deadline, nearer than the attempt timeout, or with a deadline
//     that a fleet-wide cool-down in force leaves no room before;
//   - CIRCUIT_OPEN only while the call's breaker is not CLOSED or a
//     fleet-wide cool-down refuses admission, or within the policy's
//     horizon after either;
//   - DEADLINE_CUT only for a call of a run, past the run's cut-off (by a
//     clock up to Skew ahead), or with a cut-off that a fleet-wide
//     cool-down in force leaves no room before: only a run's cut-off cuts.
//
// Three cases cannot be checked and are accepted: FAILED_TERMINAL for a
// call policyd never saw fail, reported with no failure (the Go client
// reports an error of no kind it knows that way), or of a failure told to
// NextDelay for an attempt whose answer is not remembered (Stale: the
// remembered RETRY is an earlier attempt's); DEAD_LETTER (DEADLINE)
// for a call whose deadline policyd does not know (neither the outcome
// nor a decision carried one): a caller that cancels a call ends it at a
// deadline of its own (both clients report a cancelled call so, and tell
// the moment of the cancel as the call's deadline, which passes the check
// when policyd knows a later one); and
// DEAD_LETTER (BUDGET_EXHAUSTED) or (DEADLINE) of a failure told to
// NextDelay when no answer of the attempt is remembered: a replica that
// could not reach its store stops a retry it cannot spend for, or whose
// wait would pass the deadline, so (flagged degraded), and the store
// never got the answer to remember (the replica was killed before it
// wrote it, or the final went to another replica first); a terminal
// failure it answered STOP so is the FAILED_TERMINAL case. Refusing it
// would lose the call's end from the run's ledger and call table;
// nothing is lost wins over a check that cannot see the decision.
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
		case r.Failure == 0 && r.Decided && !r.Stale && r.Answer.Category == policy.CategoryTransient:
			return "FAILED_TERMINAL needs a terminal classification; policyd classified this call's failure transient and answered RETRY"
		}
	case policy.DispositionDeadLetter:
		switch {
		case (r.Final.Stop == policy.StopDeadline || r.Final.Stop == policy.StopBudgetExhausted) && r.Recorded && (!r.Decided || r.Stale):
			// A degraded stop whose answer the store never kept (for a
			// deadline, the wait that no longer fit is not known here).
		case r.Final.Stop == policy.StopDeadline:
			if !r.fitsNoMore(r.Deadline) {
				return "DEAD_LETTER (DEADLINE) needs the call's deadline to have passed"
			}
		case r.Final.Stop == policy.StopServerPushback && r.Failure != 0:
		case r.Final.Stop == policy.StopNotIdempotent && r.HasKey:
		case r.Failure == 0 && r.Decided && r.Answer.Category == policy.CategoryTransient:
			// policyd answered the call's transient failure with RETRY; the
			// retry did not happen (an idempotency key whose outcome was
			// lost, say).
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
		case r.Cutoff == 0:
			return "DEADLINE_CUT needs a run's cut-off; a call stopped by its own deadline is DEAD_LETTER (DEADLINE)"
		case r.Now+r.Skew >= r.Cutoff:
		case r.CooldownEnd > r.Now && r.CooldownEnd+r.AttemptTimeout > r.Cutoff:
		default:
			return "DEADLINE_CUT needs the run's cut-off to have passed"
		}
	}
	return ""
}

// fitsNoMore reports whether no attempt fits before deadline at r.Now: it
// has passed, it is nearer than the attempt timeout (policyd's own rule
// stops such a call; a client waiting out a full ceiling or a rate wait
// ends it so), a fleet-wide cool-down in force leaves no room before it, or
// it is unknown (zero: a caller that cancels ends the call at a deadline
// of its own, which policyd cannot know).
func (r *FinalReport) fitsNoMore(deadline int64) bool {
	switch {
	case deadline == 0, r.Now >= deadline:
		return true
	case r.AttemptTimeout > 0 && r.Now+r.AttemptTimeout > deadline:
		return true
	case r.CooldownEnd > r.Now && r.CooldownEnd+r.AttemptTimeout > deadline:
		return true
	}
	return false
}
