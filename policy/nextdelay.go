package policy

import "time"

// NextDelayStep is the part of a NextDelay decision that needs the fleet's
// state, for an engine that takes it in one atomic step (the server's
// OneCallNextDelay): the attempt check of call Call's Attempt (replay,
// refuse, or go on), the failure's Result recorded in the breaker under
// Key, the pushback hint shared as its cool-down, then for a retry the
// fleet-wide rules (fleet.GateRetry), the Spend and fleet.Spent, then the
// run's cut-off (fleet.CutRun), and the answer remembered until Keep. It
// is for a call whose policy has no fallback targets and whose attempt
// held no lease.
type NextDelayStep struct {
	Call     CallKey
	Attempt  uint32 // the attempt that failed, from 1
	Key      BreakerKey
	Breaker  BreakerConfig
	Result   Result // the failure as the breaker counts it (fleet.BreakerResult)
	PermitID string // the HALF_OPEN probe permit the attempt used, "" for none
	// Share is the pushback hint's wait (capped at Policy.Pushback.MaxHint)
	// to share as the breaker's cool-down, from the step's time; 0 for
	// none. For a retry it is shared only while the breaker is not OPEN.
	Share time.Duration
	// Decision is the stateless rules' decision (Decide), CheckBreaker
	// added to its checks.
	Decision Decision
	Policy   *Policy // the call's: its Pushback and AttemptTimeout
	// SpreadDraw is the random draw in [0, 1) that spreads a delay over a
	// longer cool-down of the fleet.
	SpreadDraw float64
	Spend      SpendRequest
	RunCutoff  time.Time // the run's cut-off, zero for a call of no run
	CutBinds   bool      // the run's cut-off is the deadline Decision was decided with
	// Answer is the answer as far as the stateless rules made it (Category,
	// Class, Note, Checks, Deadline, AttemptTimeout, FlowControlled): the
	// step completes it and remembers it.
	Answer Answer
	Keep   time.Time // the answer is remembered until then at least
}

// NextDelayResult is what a NextDelayStep decided.
type NextDelayResult struct {
	// Replay is true when the same attempt was decided before: Answer is
	// that answer again, and nothing else is set.
	Replay bool
	// Answer is the step's answer (the step's Answer completed), as
	// remembered.
	Answer Answer
	// Decision is the step's Decision as the fleet-wide rules left it.
	Decision Decision
	// Breaker is the breaker's state after the failure was recorded.
	Breaker BreakerSnapshot
	// Asked is true when the budgets were asked; Spend is their answer.
	Asked bool
	Spend Spend
}
