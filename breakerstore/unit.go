package breakerstore

import (
	"time"

	"github.com/policyd/policyd/policy"
)

// A Unit makes the mutations of one request durable together. With
// SyncAlways each mutation is otherwise committed on its own, so a NextDelay
// that records a failure, spends a retry and appends its audit record waited
// for three commits one after another; through a Unit it waits for one, at
// Commit. Breaker state transitions are still committed at once, as the
// durability contract asks. With SyncGroup a Unit's methods are the Store's
// and Commit does nothing.
//
// A Unit belongs to one goroutine; the Store it came from stays safe for
// concurrent use. Until Commit returns nil, nothing the Unit did is
// durable: answer the request only after it.
type Unit struct {
	s *Store
	p *pending // nil with SyncGroup
}

var _ policy.Unit = (*Unit)(nil)

// Begin starts a Unit.
func (s *Store) Begin() policy.Unit {
	u := &Unit{s: s}
	if s.opts.Sync == SyncAlways {
		u.p = &pending{}
	}
	return u
}

// Record is Store.Record within the unit.
func (u *Unit) Record(key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, permitID string) (policy.BreakerSnapshot, error) {
	return u.s.record(key, cfg, r, permitID, u.p, u.s.now())
}

// ExtendCooldown is Store.ExtendCooldown within the unit.
func (u *Unit) ExtendCooldown(key policy.BreakerKey, cfg policy.BreakerConfig, until time.Time) (time.Time, error) {
	return u.s.extendCooldown(key, cfg, until, u.p)
}

// SpendRetry is Store.SpendRetry within the unit.
func (u *Unit) SpendRetry(req policy.SpendRequest) (policy.Spend, error) {
	return u.s.spendRetry(req, u.p)
}

// RecordAttempt remembers ans as the answer to attempt of call k, kept until
// keep at least (see Store.CheckAttempt), within the unit.
func (u *Unit) RecordAttempt(k policy.CallKey, attempt uint32, ans policy.Answer, keep time.Time) error {
	return u.s.recordAttempt(k, attempt, ans, keep.UnixNano(), u.p)
}

// AppendAudit is Store.AppendAudit within the unit.
func (u *Unit) AppendAudit(recs ...policy.AuditRecord) {
	u.s.appendAudit(u.p, recs)
}

// Commit makes everything the unit changed durable in one transaction
// (shared with concurrent callers through bbolt's Batch). If it fails, the
// changes stay in memory, the flusher retries them, and the error is
// returned. With SyncGroup it returns nil at once.
func (u *Unit) Commit() error {
	if u.p == nil {
		return nil
	}
	p := u.p
	u.p = &pending{}
	return u.s.commitPending(p)
}
