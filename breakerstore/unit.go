package breakerstore

import (
	"time"

	"github.com/policyd/policyd/policy"
)

// Changes is a batch of the state changes of one request that commit
// together (nothing rolls back): the shape server.Changes declares, spelt
// here too so that Begin's result is of the type the server consumes (two
// aliases of one interface literal are one type, and the compiler checks
// that they agree).
type Changes = interface {
	// ClaimAttempt, Run, Breaker, ReleaseLease, ReleaseLeases, Admit,
	// AdmitFlow, LastAnswers, Key and ApplyOutcomes are the Store's, asked
	// for the request: a store whose calls wait for an engine (redisstore)
	// bounds a request's together; here they are the Store's own.
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
	// CountAttempts counts the end of a call in the attempt statistics.
	CountAttempts(t policy.AttemptTally)
	// Commit makes every change durable, in one transaction where the
	// store commits before answering; nothing rolls back.
	Commit() error
}

// changeBatch makes the mutations of one request durable together. With
// SyncAlways each mutation is otherwise committed on its own, so a NextDelay
// that records a failure, spends a retry and appends its audit record waited
// for three commits one after another; through a batch it waits for one, at
// Commit. Breaker state transitions are still committed at once, as the
// durability contract asks. With SyncGroup its methods are the Store's
// and Commit does nothing.
//
// A changeBatch belongs to one goroutine; the Store it came from stays safe for
// concurrent use. Until Commit returns nil, nothing it did is durable:
// answer the request only after it.
type changeBatch struct {
	s *Store
	p *pending // nil with SyncGroup
}

var _ Changes = (*changeBatch)(nil)

// Begin starts a batch of changes that commit together.
func (s *Store) Begin() Changes {
	u := &changeBatch{s: s}
	if s.opts.Sync == SyncAlways {
		u.p = shared()
	}
	return u
}

// ClaimAttempt is Store.ClaimAttempt.
func (u *changeBatch) ClaimAttempt(k policy.CallKey, attempt uint32) (policy.Answer, bool, error) {
	return u.s.ClaimAttempt(k, attempt)
}

// Run is Store.Run.
func (u *changeBatch) Run(id string) (policy.Run, error) { return u.s.Run(id) }

// Breaker is Store.Breaker.
func (u *changeBatch) Breaker(key policy.BreakerKey) (policy.BreakerSnapshot, error) {
	return u.s.Breaker(key)
}

// ReleaseLease is Store.ReleaseLease.
func (u *changeBatch) ReleaseLease(key policy.BreakerKey, id string, lim policy.FlowLimits, sig policy.FlowSignal) (bool, error) {
	return u.s.ReleaseLease(key, id, lim, sig)
}

// ReleaseLeases is Store.ReleaseLeases.
func (u *changeBatch) ReleaseLeases(rs []policy.LeaseRelease, held []bool, errs []error) {
	u.s.ReleaseLeases(rs, held, errs)
}

// Admit is Store.Admit.
func (u *changeBatch) Admit(key policy.BreakerKey, cfg policy.BreakerConfig) (policy.Admission, error) {
	return u.s.Admit(key, cfg)
}

// AdmitFlow is Store.AdmitFlow.
func (u *changeBatch) AdmitFlow(key policy.BreakerKey, cfg policy.BreakerConfig, lim policy.FlowLimits) (policy.Admission, error) {
	return u.s.AdmitFlow(key, cfg, lim)
}

// LastAnswers is Store.LastAnswers.
func (u *changeBatch) LastAnswers(keys []policy.CallKey, out []policy.Answer, attempts []uint32) {
	u.s.LastAnswers(keys, out, attempts)
}

// Key is Store.Key.
func (u *changeBatch) Key(ref policy.KeyRef) (policy.KeyRecordView, error) { return u.s.Key(ref) }

// ApplyOutcomes is Store.ApplyOutcomes.
func (u *changeBatch) ApplyOutcomes(ups []policy.OutcomeUpdate, deposits map[string]int) (int, error) {
	return u.s.ApplyOutcomes(ups, deposits)
}

// Record is Store.Record within the batch.
func (u *changeBatch) Record(key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, permitID string) (policy.BreakerSnapshot, error) {
	var snap policy.BreakerSnapshot
	_, err := u.s.record(key, cfg, r, permitID, u.p, u.s.now(), &snap)
	return snap, err
}

// ExtendCooldown is Store.ExtendCooldown within the batch.
func (u *changeBatch) ExtendCooldown(key policy.BreakerKey, cfg policy.BreakerConfig, until time.Time) (time.Time, error) {
	return u.s.extendCooldown(key, cfg, until, u.p)
}

// SpendRetry is Store.SpendRetry within the batch.
func (u *changeBatch) SpendRetry(req policy.SpendRequest) (policy.Spend, error) {
	return u.s.spendRetry(req, u.p)
}

// RecordAttempt remembers ans as the answer to attempt of call k, kept until
// keep at least (see Store.ClaimAttempt), within the batch, and ends the
// call's claim.
func (u *changeBatch) RecordAttempt(k policy.CallKey, attempt uint32, ans policy.Answer, keep time.Time) error {
	return u.s.recordAttempt(k, attempt, ans, keep.UnixNano(), u.p)
}

// AppendAudit is Store.AppendAudit within the batch.
func (u *changeBatch) AppendAudit(recs ...policy.AuditRecord) {
	u.s.appendAudit(u.p, recs)
}

// NoteCall is Store.NoteCall within the batch.
func (u *changeBatch) NoteCall(runID, callID string, n policy.CallNote) error {
	return u.s.noteCall(runID, callID, n, u.p)
}

// Commit makes everything the unit changed durable in one transaction
// (shared with concurrent callers through bbolt's Batch). If it fails, the
// changes stay in memory, the flusher retries them, and the error is
// returned. With SyncGroup it returns nil at once.
func (u *changeBatch) Commit() error {
	if u.p == nil {
		return nil
	}
	p := u.p
	u.p = shared()
	return u.s.commit(p)
}

// CountAttempts counts the end of a call in the attempt statistics
// within the batch.
func (u *changeBatch) CountAttempts(t policy.AttemptTally) {
	u.s.countAttempts(t, u.s.now(), u.p)
}
