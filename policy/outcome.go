package policy

// OutcomeUpdate is one reported attempt outcome as the shared state applies
// it: a result for the call's breaker (none when NextDelay already counted
// the failure), the audit records the outcome makes, and, for a call of a
// batch run, the call's final disposition for the run's ledger.
type OutcomeUpdate struct {
	Key     BreakerKey
	Breaker BreakerConfig
	// Result is told to the breaker under Key; 0 tells it nothing.
	Result Result
	// PermitID is the HALF_OPEN probe permit the attempt used, released
	// with the result.
	PermitID string
	// Audit is appended to the audit trail once the result is recorded.
	Audit []AuditRecord
	// RunID, CallID, Final and Stop record the call's final disposition in
	// the run's ledger when RunID is set and Final is not DispositionNone.
	RunID  string
	CallID string
	Final  Disposition
	Stop   StopReason
	// Deduplicated marks a SUCCEEDED the idempotency ledger answered.
	Deduplicated bool
	// Note, when not zero, is told to the run's call table (RunID set).
	Note CallNote
	// Tally, when its Target is set, counts the call's end in the attempt
	// statistics once the update applies (not Refused) and, with a final
	// disposition of a run, only when the ledger took it as the call's
	// first.
	Tally AttemptTally
	// Refused is set by the store when the state's rules refused the
	// update (a probe permit that is not live): its result and final
	// disposition were not applied, its audit records were, and the rest
	// of the batch applies.
	Refused error
}
