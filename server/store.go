package server

import (
	"time"

	"github.com/policyd/policyd/policy"
)

// Store is the shared state the handlers decide with. It is declared here,
// where it is consumed, in domain types only, so another backend (a
// replicated one, say) can stand in for breakerstore without touching the
// handlers. Errors are told apart by behaviour the handlers declare in
// errors.go: an error (or one it wraps) with a NotFound, AlreadyExists,
// Invalid, OverCapacity, Closed or FailedPrecondition method returning true
// is of that class; any other is a failure of the store (INTERNAL, logged).
// Implementations must be safe for concurrent use.
type Store interface {
	Policies
	Breakers
	Budgets
	Runs
	Audit
	Outcomes
	Attempts
	Leases
	// Begin starts a batch for the state changes of one request
	// (NextDelay's breaker failure, cool-down, retry spend, attempt record
	// and audit record), so a store that makes changes durable before
	// answering commits them once. A decision records, extends cool-downs
	// and spends only through one.
	Begin() Changes
}

// Changes is a batch of the state changes of one request that commit
// together at Commit; nothing rolls back. It belongs to one goroutine. It
// is an alias of an interface literal so that an engine can return it
// without importing server: an engine spells the same literal (as
// breakerstore.Changes does) and the two are one type.
type Changes = interface {
	// Record tells the breaker under key an attempt's result (see
	// breakerstore.Store.Record).
	Record(key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, permitID string) (policy.BreakerSnapshot, error)
	// ExtendCooldown moves the fleet-wide cool-down of the breaker under
	// key later.
	ExtendCooldown(key policy.BreakerKey, cfg policy.BreakerConfig, until time.Time) (time.Time, error)
	// SpendRetry withdraws one retry from the tenant's budget and the run's
	// pool.
	SpendRetry(req policy.SpendRequest) (policy.Spend, error)
	// RecordAttempt remembers ans as the answer to attempt of call k until
	// keep at least, so the same attempt replays it and a lower one is
	// refused.
	RecordAttempt(k policy.CallKey, attempt uint32, ans policy.Answer, keep time.Time) error
	// AppendAudit adds audit records.
	AppendAudit(recs ...policy.AuditRecord)
	// Commit makes every change durable, in one transaction where the
	// store commits before answering; nothing rolls back.
	Commit() error
}

// Leases holds the fleet-wide ceilings (policy.FlowConfig) per breaker
// key, by fleet.Flow's rules: the concurrency leases live, each an
// unguessable id with an expiry (at most the ceiling live at once; a lease
// past its expiry no longer counts, so a crashed worker cannot leak one),
// and the GCRA rate account (never more than rate x time + burst).
type Leases interface {
	// AdmitFlow admits an attempt under lim's ceilings: a rate slot, then
	// one of at most lim.Ceiling live leases under key expiring after
	// lim.LeaseTTL, then the breaker under key as Admit asks it; what was
	// taken is given back at once when a later step refuses. A rate
	// ceiling refuses with reason rate:limited and the exact wait, a full
	// ceiling with concurrency:full and lim.FullWait (or less when a lease
	// expires sooner), without asking the breaker. An admitted Admission
	// carries LeaseID and LeaseExpiry (when there is a concurrency
	// ceiling) besides the breaker's answer.
	AdmitFlow(key policy.BreakerKey, cfg policy.BreakerConfig, lim policy.FlowLimits) (policy.Admission, error)
	// ReleaseLease returns lease id under key and reports whether it was
	// held; one not held (expired, returned before, never handed out) is
	// ignored and counted, never an error.
	ReleaseLease(key policy.BreakerKey, id string) (bool, error)
	// Pool returns the ceiling's live leases and stray releases under key,
	// the zero status when there are none.
	Pool(key policy.BreakerKey) (policy.PoolStatus, error)
}

// Attempts remembers per call the highest attempt decided and its answer.
type Attempts interface {
	// CheckAttempt says what a NextDelay for attempt of call k must get:
	// replay true and the answer given before for the same attempt; an
	// error with the behaviour FailedPrecondition() bool naming attempt for
	// a lower attempt or any after a STOP; else nothing, and the attempt
	// is decided afresh (and recorded through the unit).
	CheckAttempt(k policy.CallKey, attempt uint32) (ans policy.Answer, replay bool, err error)
	// LastAnswer returns the answer to the highest attempt of call k
	// decided, while it is remembered.
	LastAnswer(k policy.CallKey) (policy.Answer, bool)
}

// Outcomes applies reported outcomes a batch at a time.
type Outcomes interface {
	// ApplyOutcomes applies ups in order (each one's breaker result, audit
	// records and final run disposition), then deposits[tenant] successes,
	// stopping at the first error; it returns how many updates it applied.
	// A store that makes changes durable before answering makes the whole
	// batch durable together, not one change at a time.
	ApplyOutcomes(ups []policy.OutcomeUpdate, deposits map[string]int) (int, error)
}

// Policies resolves and stores retry policies.
type Policies interface {
	Resolve(tenant, target string) (policy.Policy, policy.PolicyEntry)
	SetPolicy(tenant, target string, p policy.Policy) (policy.PolicyEntry, error)
	Policy(tenant, target string) (policy.PolicyEntry, error)
	Policies(after policy.PolicyScope, limit int) ([]policy.PolicyEntry, error)
	DeletePolicy(tenant, target string) error
}

// Breakers is the fleet-wide circuit breaker state.
type Breakers interface {
	Admit(key policy.BreakerKey, cfg policy.BreakerConfig) (policy.Admission, error)
	Breaker(key policy.BreakerKey) (policy.BreakerSnapshot, error)
	Breakers(tenant string, state policy.BreakerState, after policy.BreakerKey, limit int) ([]policy.BreakerSnapshot, error)
	ResetBreaker(key policy.BreakerKey) (policy.BreakerSnapshot, error)
	ForceBreaker(key policy.BreakerKey, st policy.BreakerState) (policy.BreakerSnapshot, error)
	// Subscribe streams the current states of tenant's breakers (all when
	// tenant is empty), then every change. The channel is closed when the
	// subscriber falls behind or cancel is called.
	Subscribe(tenant string, buffer int) (events <-chan policy.BreakerEvent, cancel func())
}

// Budgets holds the per-tenant retry token buckets and the run pools.
type Budgets interface {
	SetBudget(b policy.TenantBudget) (policy.TenantBudget, error)
	Budget(tenant string) (policy.BudgetStatus, error)
	Budgets(after string, limit int) ([]policy.BudgetStatus, error)
	DeleteBudget(tenant string) error
	Deposit(tenant string, successes int)
}

// Audit is the write-once audit trail of attempts, decisions and final
// dispositions.
type Audit interface {
	// AppendAudit adds records in order, stamping their time (when zero)
	// and sequence number. It must not block a decision on the disk: a
	// store that cannot keep up drops records and says so in its own logs
	// and counters. Handlers append the records of one request in one call,
	// so a store that commits them before answering does so once.
	AppendAudit(recs ...policy.AuditRecord)
	// QueryAudit returns the records q selects in the trail's order and the
	// cursor of the next page, zero at the end. It sees every record
	// appended before it was called.
	QueryAudit(q policy.AuditQuery) ([]policy.AuditRecord, policy.AuditCursor, error)
}

// Runs holds batch runs and their ledgers.
type Runs interface {
	OpenRun(r policy.Run) (policy.Run, error)
	Run(id string) (policy.Run, error)
	Runs(tenant, after string, limit int) ([]policy.Run, error)
	RecordFinal(runID, callID string, d policy.Disposition, stop policy.StopReason) error
}
