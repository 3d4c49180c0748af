package policy

import "time"

// MaxResultRefLen is the longest result reference an idempotency record
// keeps, in bytes.
const MaxResultRefLen = 1024

// KeyState is the state of an idempotency record, as ClaimKey answers it.
type KeyState uint8

// Key states, numbered as the API numbers them.
const (
	KeyStateUnspecified KeyState = iota
	KeyNew                       // free: the claimer holds the lease now
	KeyInFlight                  // another worker holds a live lease
	KeySucceeded                 // an attempt succeeded: do not call the upstream
	KeyUnknown                   // a previous attempt's outcome was lost
)

var keyStateNames = [...]string{"UNSPECIFIED", "NEW", "IN_FLIGHT", "SUCCEEDED", "UNKNOWN"}

// String returns the state's name as the API spells it without its prefix.
func (s KeyState) String() string {
	if int(s) < len(keyStateNames) {
		return keyStateNames[s]
	}
	return "KeyState(" + itoa(int(s)) + ")"
}

// KeyOutcome is how the attempt holding a key's lease ended.
type KeyOutcome uint8

// Key outcomes, numbered as the API numbers them.
const (
	KeyOutcomeUnspecified KeyOutcome = iota
	KeyOutcomeSucceeded              // the upstream applied it
	KeyOutcomeFailed                 // the upstream did not apply it: the key is free again
	KeyOutcomeUnknown                // the outcome was lost: it may have been applied
)

var keyOutcomeNames = [...]string{"UNSPECIFIED", "SUCCEEDED", "FAILED", "UNKNOWN"}

// String returns the outcome's name as the API spells it without its prefix.
func (o KeyOutcome) String() string {
	if int(o) < len(keyOutcomeNames) {
		return keyOutcomeNames[o]
	}
	return "KeyOutcome(" + itoa(int(o)) + ")"
}

// KeyRef names an idempotency record: a tenant's key.
type KeyRef struct {
	Tenant, Key string
}

// KeyClaim is a claim of an idempotency key before an attempt: the lease
// a NEW (or retried UNKNOWN) claim takes runs until LeaseUntil, and the
// record is kept until Expires at least.
type KeyClaim struct {
	LeaseUntil, Expires time.Time
	// Dedupes says the upstream deduplicates by key
	// (Policy.UpstreamDedupesByKey): an UNKNOWN record is leased again.
	Dedupes bool
}

// KeyAnswer is ClaimKey's answer.
type KeyAnswer struct {
	State      KeyState
	LeaseID    string // set when the claimer now holds the lease
	LeaseUntil time.Time
	ResultRef  string        // SUCCEEDED
	RetryAfter time.Duration // IN_FLIGHT: how long the other lease still runs
	Reason     string
}

// KeyRecordView is an idempotency record as GetKey and CompleteKey show it.
type KeyRecordView struct {
	Ref        KeyRef
	State      KeyState
	LeaseUntil time.Time
	Expires    time.Time
	ResultRef  string
}

// Schedule is the longest a call can take under p without server hints:
// every attempt's timeout and the nominal delays between them, capped by
// the call deadline when p has one. An idempotency record must outlive it
// (Validate refuses an IdempotencyTTL below it).
func (p *Policy) Schedule() time.Duration {
	s := time.Duration(max(p.MaxAttempts, 1)) * max(p.AttemptTimeout, 0)
	for n := range max(p.MaxAttempts-1, 0) {
		s += Nominal(p.Backoff, n)
	}
	if p.CallDeadline > 0 {
		s = min(s, p.CallDeadline)
	}
	return s
}
