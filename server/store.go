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
// Implementations must be safe for concurrent use. The behaviours the
// handlers rely on (probes, budgets, cool-downs, transitions, the first
// final disposition winning, durability, subscriptions, attempts, permits,
// what one replica's writes show on another, and the adaptive ceiling) are the one contract
// suite, package storetest, which every implementation's tests run
// unchanged: breakerstore's on bbolt, redisstore's on Redis standalone and
// on Redis Cluster.
type Store interface {
	Policies
	Breakers
	Budgets
	Runs
	Audit
	Outcomes
	Attempts
	Leases
	Keys
	AttemptStats
	// Begin starts a batch for the state changes of one request
	// (NextDelay's breaker failure, cool-down, retry spend, attempt record
	// and audit record), so a store that makes changes durable before
	// answering commits them once. A decision records, extends cool-downs
	// and spends only through one, or, on a store that takes a NextDelay
	// in one step of its own (OneCallNextDelay), through that step, and
	// reads what it must wait for through it too: a store whose calls wait
	// for an engine bounds all of a request's together (redisstore: one
	// --store-timeout from Begin), so a decision of several calls answers
	// within the timeout when the engine stalls, not within one per call.
	Begin() Changes
}

// OneCallNextDelay is a Store that decides a NextDelay's fleet-wide part
// in one atomic step of its own (redisstore: one function call), instead
// of a batch of Changes: decideNextDelay uses it for a call whose policy
// has no fallback targets and whose attempt held no lease, and the batch
// otherwise. The answers, audit records, metrics, call-table notes and
// attempt tallies are those of the batch; the contract suite checks both
// against the rules (storetest, nextDelays).
type OneCallNextDelay interface {
	// NextDelayInOneCall takes st in one step (policy.NextDelayStep says
	// what it does). An attempt refused is an error with the behaviour
	// FailedPrecondition() bool, as ClaimAttempt's; a permit not live is
	// fleet.ErrPermit. ok false means the store could not take the step
	// (its engine is out of reach: degraded mode): the caller decides
	// through Begin instead.
	// The step is part of the request's u (Begin's), within its time.
	NextDelayInOneCall(u Changes, st *policy.NextDelayStep) (res policy.NextDelayResult, ok bool, err error)
	// KnownRun returns run id's ID, Tenant and Cutoff (which never
	// change) when the store has them at hand, without a round trip; ok
	// false sends the caller to Runs.Run. NextDelay and Admit read a
	// call's run through it (runOfCall).
	KnownRun(id string) (run policy.Run, ok bool)
	// DecidedInOneCall keeps what a decision of NextDelayInOneCall leaves to
	// write, whose answer nobody waits for: the note n of call callID in
	// run runID's call table (when runID is set) and the attempt tally t
	// (when t.Target is set). A store may write them later (redisstore:
	// with its next flush), durable as counters are. What it waits for is
	// part of the request's u, within its time.
	DecidedInOneCall(u Changes, runID, callID string, n policy.CallNote, t policy.AttemptTally) error
}

// Changes is a batch of the state changes of one request that commit
// together at Commit; nothing rolls back. It belongs to one goroutine. It
// is an alias of an interface literal so that an engine can return it
// without importing server: an engine spells the same literal (as
// breakerstore.Changes does) and the two are one type.
type Changes = interface {
	// ClaimAttempt, Run, Breaker, ReleaseLease, ReleaseLeases, Admit,
	// AdmitFlow, LastAnswers, Key and ApplyOutcomes are the Store's (Attempts, Runs,
	// Breakers, Leases, Keys, Outcomes), asked within the request's time.
	ClaimAttempt(k policy.CallKey, attempt uint32) (policy.Answer, bool, error)
	Run(id string) (policy.Run, error)
	Breaker(key policy.BreakerKey) (policy.BreakerSnapshot, error)
	ReleaseLease(key policy.BreakerKey, id string, lim policy.FlowLimits, sig policy.FlowSignal) (bool, error)
	ReleaseLeases(rs []policy.LeaseRelease, held []bool, errs []error)
	Admit(key policy.BreakerKey, cfg policy.BreakerConfig) (policy.Admission, error)
	AdmitFlow(key policy.BreakerKey, cfg policy.BreakerConfig, lim policy.FlowLimits) (policy.Admission, error)
	LastAnswers(keys []policy.CallKey, out []policy.Answer, attempts []uint32)
	Key(ref policy.KeyRef) (policy.KeyRecordView, error)
	ApplyOutcomes(ups []policy.OutcomeUpdate, deposits map[string]int) (int, error)
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
	// refused, and ends the call's claim (Attempts.ClaimAttempt).
	RecordAttempt(k policy.CallKey, attempt uint32, ans policy.Answer, keep time.Time) error
	// AppendAudit adds audit records.
	AppendAudit(recs ...policy.AuditRecord)
	// NoteCall tells run runID's call table what the decision says of
	// call callID (see Runs.NoteCall).
	NoteCall(runID, callID string, n policy.CallNote) error
	// CountAttempts counts the end of a call in the attempt statistics
	// (AttemptStats): NextDelay's STOP, counted once per call because an
	// attempt is decided once.
	CountAttempts(t policy.AttemptTally)
	// Commit makes every change durable, in one transaction where the
	// store commits before answering; nothing rolls back.
	Commit() error
}

// runReader, breakerReader, leaseReleaser and admitter are what a helper of the
// decisions reads or releases, through a request's Changes (within its
// time) or the Store.
type (
	runReader interface {
		Run(id string) (policy.Run, error)
	}
	breakerReader interface {
		Breaker(key policy.BreakerKey) (policy.BreakerSnapshot, error)
	}
	leaseReleaser interface {
		ReleaseLease(key policy.BreakerKey, id string, lim policy.FlowLimits, sig policy.FlowSignal) (bool, error)
	}
	admitter interface {
		Admit(key policy.BreakerKey, cfg policy.BreakerConfig) (policy.Admission, error)
		AdmitFlow(key policy.BreakerKey, cfg policy.BreakerConfig, lim policy.FlowLimits) (policy.Admission, error)
	}
)

// AttemptStats holds the attempt statistics per tenant and attempt
// target (fleet.AttemptStats has the rules: hour buckets of successes and
// final failures by attempt number, kept policy.StatsRetention). They are
// counted through the write paths the store has: Changes.CountAttempts for
// NextDelay's STOP, policy.OutcomeUpdate.Tally for reported outcomes (a
// success, or a final disposition policyd did not decide), counted when
// the update applies and, for a final disposition of a run, only when the
// run's ledger took it as the call's first. So a replayed NextDelay, the
// outcome reporting a STOP policyd decided and a run's final reported
// again count nothing more; an outcome batch sent twice counts twice, as
// its breaker results and deposits do. Counts are counters: they are as
// durable as the breakers' windows (the group commit, or the next flush).
type AttemptStats interface {
	// AttemptStats returns the statistics of the window from since to now,
	// one entry per tenant and target with a count in it, sorted by tenant
	// and target; an empty tenant or target selects every one.
	AttemptStats(tenant, target string, since time.Time) ([]policy.TargetStats, error)
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
	// ignored and counted, never an error. With an adaptive ceiling
	// (lim.Adaptive.Max set), sig is what the attempt's outcome tells it
	// (fleet.AdaptiveLimit: a success grows it, a congestion signal shrinks
	// it), applied in the same step as the release, also for a lease no
	// longer held: the outcome happened either way.
	ReleaseLease(key policy.BreakerKey, id string, lim policy.FlowLimits, sig policy.FlowSignal) (bool, error)
	// ReleaseLeases is ReleaseLease of each of rs, held[i] and errs[i]
	// its answer for rs[i] (both as long as rs), in one step where the
	// store can: redisstore sends them in one round trip, where one a
	// lease made a ReportOutcome of n leased outcomes n round trips.
	ReleaseLeases(rs []policy.LeaseRelease, held []bool, errs []error)
	// Pool returns the ceiling's live leases, stray releases and adaptive
	// value under key, the zero status when there are none.
	Pool(key policy.BreakerKey) (policy.PoolStatus, error)
}

// Keys is the idempotency ledger: records keyed by tenant and idempotency
// key (fleet.KeyRecord has the rules), every change durable (fsync'd)
// before the method returns, like an admin write.
type Keys interface {
	// ClaimKey claims ref before an attempt; a new record beyond the
	// tenant's cap is an error with OverCapacity() true.
	ClaimKey(ref policy.KeyRef, c policy.KeyClaim) (policy.KeyAnswer, error)
	// CompleteKey records how the attempt holding lease ended; an unknown
	// key is NotFound, a lease not the key's current one
	// FailedPrecondition. expires, when later, extends the record.
	CompleteKey(ref policy.KeyRef, lease string, o policy.KeyOutcome, result string, expires time.Time) (policy.KeyRecordView, error)
	// Key returns ref's record; an unknown or expired one is NotFound.
	Key(ref policy.KeyRef) (policy.KeyRecordView, error)
}

// Attempts remembers per call the highest attempt decided and its answer.
type Attempts interface {
	// ClaimAttempt says what a NextDelay for attempt of call k must get,
	// and claims the deciding of it, in one step per call: replay true and
	// the answer recorded for the same attempt; an error with the
	// behaviour FailedPrecondition() bool naming attempt for a lower
	// attempt or any after a STOP; else the caller holds the call's claim,
	// decides the attempt and records the answer through the batch
	// (Changes.RecordAttempt, which ends the claim) or, if the decision
	// fails before that, calls ReleaseAttempt. A ClaimAttempt of a call
	// whose claim is held waits for it to end and then answers as above,
	// so concurrent duplicates of one attempt are decided once and all get
	// the one answer.
	ClaimAttempt(k policy.CallKey, attempt uint32) (ans policy.Answer, replay bool, err error)
	// ReleaseAttempt ends the claim on call k that ClaimAttempt gave,
	// without an answer; a request waiting for it decides instead.
	ReleaseAttempt(k policy.CallKey)
	// LastAnswer returns the answer to the highest attempt of call k
	// decided, while it is remembered.
	LastAnswer(k policy.CallKey) (policy.Answer, bool)
	// LastAnswers is LastAnswer of every call of keys at once, into out[i],
	// with the attempt it answered in attempts[i] (0: none remembered; out
	// and attempts at least as long as keys): ReportOutcome reads a
	// request's in one batch, so a store across the network makes one
	// round trip per tenant, not one per outcome.
	LastAnswers(keys []policy.CallKey, out []policy.Answer, attempts []uint32)
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
	// KnownBreaker returns the breaker under key as this process knows it,
	// with no round trip to a shared engine (a replica's copy lags the
	// fleet's by the change stream's delivery; a store in this process
	// knows it exactly), and false when it does not know it.
	KnownBreaker(key policy.BreakerKey) (policy.BreakerSnapshot, bool)
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
	// NoteCall tells run runID's call table what a NextDelay decision or a
	// final disposition says of call callID (fleet.CallRecord.Note has the
	// rules); counter-grade durability, like the ledger. A call beyond the
	// table's cap is counted, not kept.
	NoteCall(runID, callID string, n policy.CallNote) error
	// RunCalls returns up to limit calls of run runID's call table that f
	// selects, sorted by call id, after the id after, and how many of the
	// run's calls are beyond the table's cap.
	RunCalls(runID string, f policy.RunCallFilter, after string, limit int) ([]policy.RunCall, uint64, error)
}
