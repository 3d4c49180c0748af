package policy

import (
	"cmp"
	"time"
)

// This file holds the vocabulary of shared state: plain values that the
// store keeps and the server hands out. They carry no behaviour beyond
// naming, so both sides can speak of them without importing each other.

// BreakerKey names one fleet-wide breaker. Tenant is empty for a breaker of
// ScopeTarget, shared by every tenant.
type BreakerKey struct {
	Tenant string
	Target string
}

// KeyFor returns the breaker key of tenant and target under cfg's scope.
func KeyFor(cfg BreakerConfig, tenant, target string) BreakerKey {
	if cfg.Scope == ScopeTarget {
		return BreakerKey{Target: target}
	}
	return BreakerKey{Tenant: tenant, Target: target}
}

// BreakerState is the state of a circuit breaker.
type BreakerState uint8

// Breaker states. The zero value means "any" in filters.
const (
	BreakerStateUnspecified BreakerState = iota
	BreakerClosed
	BreakerOpen
	BreakerHalfOpen
	BreakerDisabled
)

// String returns the state's name as the API spells it.
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "CLOSED"
	case BreakerOpen:
		return "OPEN"
	case BreakerHalfOpen:
		return "HALF_OPEN"
	case BreakerDisabled:
		return "DISABLED"
	default:
		return "UNSPECIFIED"
	}
}

// BreakerSnapshot is a copy of one breaker's state at an instant.
type BreakerSnapshot struct {
	Key                 BreakerKey
	State               BreakerState
	Forced              bool
	OpenUntil           time.Time
	ConsecutiveFailures int
	WindowCalls         uint64
	WindowFailures      uint64
	ProbesInFlight      int
	Changed             time.Time
	CooldownUntil       time.Time
	Mode                BreakerMode
	Generation          uint64 // state transitions so far; 0: never left CLOSED
	// Degraded is true for a replica's last-known state, answered because
	// its shared engine did not: what the replica decides from meanwhile.
	Degraded bool
}

// Admission is the answer to a request to make an attempt.
type Admission struct {
	Admitted   bool
	State      BreakerState
	PermitID   string        // set for a HALF_OPEN probe
	RetryAfter time.Duration // when refused: how long until asking again makes sense
	Reason     string        // breaker:closed, breaker:open, breaker:probe, breaker:probes_taken, cooldown:pushback, run:cutoff, concurrency:full, rate:limited, ...
	RunCutoff  time.Time     // the cut-off of the call's run, when it names one
	Degraded   bool          // decided from the replica's last known state: the shared engine did not answer

	// LeaseID is the concurrency lease handed out with the admission, when
	// the policy has a ceiling (FlowConfig.MaxInFlight); LeaseExpiry is
	// when it frees its slot unreturned.
	LeaseID     string
	LeaseExpiry time.Time
	// FlowControlled is true when the policy has a fleet-wide ceiling, so
	// every attempt must ask for admission.
	FlowControlled bool
	// Target is the target admitted: the one asked for, or a fallback of
	// the call's chain when that one's breaker is open or its ceiling full
	// (Fallback.OnCircuitOpen). Permit and lease are its.
	Target string
}

// PoolStatus is a concurrency ceiling's state at an instant.
type PoolStatus struct {
	InFlight int    // leases live
	Stray    uint64 // releases of leases not held, ignored
	// Adaptive is the adaptive ceiling's exact current value, 0 when the
	// key has none or it never started (it then stands at the maximum).
	Adaptive float64
	// Decreases counts the adaptive ceiling's decreases under the key so
	// far (counter-grade: a crash may lose the last flush interval's).
	Decreases uint64
}

// FlowSignal is what an attempt's outcome tells an adaptive ceiling
// (fleet.AdaptiveLimit) when its lease comes back.
type FlowSignal uint8

// Flow signals.
const (
	SignalNone       FlowSignal = iota // nothing learnt: a release without an outcome, another failure
	SignalSuccess                      // the attempt succeeded: grow the ceiling
	SignalCongestion                   // a 429, or a 503 with a pushback hint: shrink it
)

// LeaseRelease is a concurrency lease to give back (Leases.ReleaseLeases):
// lease ID under Key, whose ceilings are Limits, with what the attempt's
// outcome tells an adaptive ceiling.
type LeaseRelease struct {
	Key    BreakerKey
	ID     string
	Limits FlowLimits
	Signal FlowSignal
}

// Result is what an attempt's outcome means to a breaker.
type Result uint8

// Results. ResultTerminal means the upstream answered (a 4xx): it is up, so
// the breaker treats it as a success. ResultPushback is a transient failure
// that carried a pushback hint (Retry-After and the like): the upstream is
// up and asked for time, which the fleet-wide cool-down grants, so the
// breaker counts it neither as a failure nor as a success
// (fleet.BreakerResult).
const (
	ResultSuccess Result = iota + 1
	ResultTransientFailure
	ResultTerminal
	ResultPushback
)

// TenantBudget configures a tenant's retry token bucket: retries withdraw
// RetryCost (TimeoutCost after a timeout), successes deposit DepositRatio, and
// MinPerSecond tokens flow in over time, up to Capacity.
type TenantBudget struct {
	Tenant       string
	Capacity     float64
	DepositRatio float64
	MinPerSecond float64
	RetryCost    float64
	TimeoutCost  float64
	DryRun       bool
}

// BudgetStatus is a tenant budget with its live counters.
type BudgetStatus struct {
	Budget         TenantBudget
	Tokens         float64
	Granted        uint64
	Refused        uint64
	DryRunRefusals uint64
	IsDefault      bool
}

// SpendRequest asks for one retry from a tenant's budget and, when RunID is
// set, from that run's pool.
type SpendRequest struct {
	Tenant  string
	Timeout bool // the failure was a timeout: TimeoutCost applies
	RunID   string
}

// Spend is the answer to a SpendRequest. When not granted, Stop and
// Disposition say why.
type Spend struct {
	Granted       bool
	Stop          StopReason
	Disposition   Disposition
	TenantTokens  float64
	RunRemaining  uint64
	HasRun        bool
	DryRunRefused bool
	Degraded      bool // decided from the replica's share of the last known budget: the engine did not answer
}

// PolicyEntry is a policy stored at a scope; empty Tenant or Target match
// every tenant or target.
type PolicyEntry struct {
	Tenant  string
	Target  string
	Policy  Policy
	Updated time.Time
}

// Ledger counts the final dispositions of a run's calls.
type Ledger struct {
	Succeeded               uint64
	FailedTerminal          uint64
	DeadLetterExhausted     uint64
	DeadLetterBudget        uint64
	DeadLetterNotIdempotent uint64
	DeadLetterPushback      uint64
	DeadLetterDeadline      uint64 // stopped by the call's own deadline
	CircuitOpen             uint64
	DeadlineCut             uint64 // ended by the run's cut-off
	Deduplicated            uint64 // of Succeeded, answered by the idempotency ledger
}

// Run is a batch run: a retry pool its calls share and a wall-clock cut-off.
type Run struct {
	ID          string
	Tenant      string
	Description string
	Pool        uint64
	Spent       uint64
	Cutoff      time.Time
	Created     time.Time
	Ledger      Ledger
	RedriveOf   string // the run whose dead-lettered and cut calls this one re-drives
}

// BreakerEvent is one message of a breaker subscription: the current states
// first (Initial true), then one event with SnapshotDone set and no
// snapshot, then every state change and every new fleet-wide cool-down.
type BreakerEvent struct {
	Snapshot     BreakerSnapshot
	Initial      bool
	SnapshotDone bool
	// Resume, on SnapshotDone and on every change after it, is the
	// subscription's position after this event, opaque, for a store whose
	// subscriptions resume (redisstore's SubscribeFrom); empty otherwise.
	Resume string
	// Resumed, on SnapshotDone, says the subscription resumed from the
	// position it was asked for: no snapshot came before it.
	Resumed bool
}

// AuditEvent is the kind of an audit record.
type AuditEvent uint8

// Audit events, numbered as the API numbers them.
const (
	AuditEventUnspecified AuditEvent = iota
	// AuditAdmit is an Admit answer, recorded when it refused.
	AuditAdmit
	// AuditDecision is a NextDelay answer for a failed attempt.
	AuditDecision
	// AuditOutcome is a reported attempt outcome.
	AuditOutcome
	// AuditFinal is a call's reported final disposition.
	AuditFinal
)

// String returns the event's name as the API spells it, e.g. "DECISION".
func (e AuditEvent) String() string {
	switch e {
	case AuditAdmit:
		return "ADMIT"
	case AuditDecision:
		return "DECISION"
	case AuditOutcome:
		return "OUTCOME"
	case AuditFinal:
		return "FINAL"
	default:
		return "UNSPECIFIED"
	}
}

// Verdict is a NextDelay answer as the audit trail keeps it.
type Verdict uint8

// Verdicts, numbered as the API's Decision. VerdictNone is set on records
// that are not decisions.
const (
	VerdictNone Verdict = iota
	VerdictRetry
	VerdictStop
)

// String returns "RETRY", "STOP" or "NONE".
func (v Verdict) String() string {
	switch v {
	case VerdictRetry:
		return "RETRY"
	case VerdictStop:
		return "STOP"
	default:
		return "NONE"
	}
}

// AuditRecord is one write-once entry of the audit trail: an attempt's
// outcome, a decision with its classification and wait, a refused
// admission, or a call's final disposition. Time and Seq are stamped by the
// store when the record is appended (Time only when zero); together they
// order the trail.
type AuditRecord struct {
	Time           time.Time
	Seq            uint64
	Event          AuditEvent
	Tenant         string
	Target         string
	CallID         string
	RunID          string
	Attempt        uint32
	Classification string // the failure's classification reason, e.g. transient:503
	Verdict        Verdict
	Delay          time.Duration // the wait handed out with a RETRY; for an attempt's outcome, its latency
	Stop           StopReason
	Disposition    Disposition
	Detail         string
	// PrimaryTarget is the call's primary target when the attempt went to
	// a fallback (Target is then the fallback); empty otherwise.
	PrimaryTarget string
}

// Cursor returns the record's position in the trail's order.
func (r AuditRecord) Cursor() AuditCursor { return AuditCursor{Time: r.Time, Seq: r.Seq} }

// AuditCursor is a position in the audit trail's order: a record's time,
// then its sequence number. As AuditQuery.After the zero cursor is the
// beginning; as the next cursor of a query it means there is nothing more.
type AuditCursor struct {
	Time time.Time
	Seq  uint64
}

// IsZero reports whether c is the zero cursor.
func (c AuditCursor) IsZero() bool { return c.Time.IsZero() && c.Seq == 0 }

// AuditQuery selects audit records: those of CallID and of Tenant (each
// when set), recorded in [Start, End) (each bound when set), after the
// cursor After, at most Limit of them (the store's default when <= 0).
type AuditQuery struct {
	CallID string
	Tenant string
	Start  time.Time
	End    time.Time
	After  AuditCursor
	Limit  int
}

// Answer is a NextDelay answer as policyd remembers it for the call, so the
// same attempt asked again gets it again: the verdict with its wait or stop,
// the classification, the rules applied, and the shared state reported.
type Answer struct {
	Retry          bool
	Delay          time.Duration
	AttemptTimeout time.Duration
	Stop           StopReason
	Disposition    Disposition
	Category       Category
	Class          string // the classification reason, e.g. transient:503
	Note           string // the pushback note
	Checks         Check
	Breaker        BreakerState
	TenantTokens   float64
	RunRemaining   uint64
	Deadline       time.Time // the call's effective deadline (the run's cut-off included), zero if none
	// FlowControlled is true when the call's policy has a fleet-wide
	// ceiling; it is not remembered with the answer but set from the
	// policy in force each time the answer is given.
	FlowControlled bool
	Degraded       bool // decided in a shared engine's degraded mode (the engine did not answer)
	// Target is where the next attempt goes on a RETRY: the call's primary
	// target or a fallback of its policy's chain (Fallback). NextDelay
	// remembers it with the answer only when it is a fallback (empty
	// meaning the primary), so a call that never escalates stores nothing
	// more.
	Target string `json:",omitempty"`
}

// CallKey names one call: call ids are scoped by tenant.
type CallKey struct {
	Tenant string
	CallID string
}

// PolicyScope names where a policy is stored: a tenant, a target, both,
// or neither (the default). An empty Tenant or Target matches every
// tenant or target. It is not a breaker's key, though it looks like one.
type PolicyScope struct {
	Tenant string
	Target string
}

// Compare orders scopes by tenant, then target, as their keys sort on
// disk; it returns -1, 0 or +1.
func (s PolicyScope) Compare(o PolicyScope) int {
	if c := cmp.Compare(s.Tenant, o.Tenant); c != 0 {
		return c
	}
	return cmp.Compare(s.Target, o.Target)
}
