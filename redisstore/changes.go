package redisstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/policy"
)

// Changes is a batch of the state changes of one request (server.Changes
// spells the same interface). It is an alias of an interface literal so
// the two are one type without an import.
type Changes = interface {
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
	Record(key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, permitID string) (policy.BreakerSnapshot, error)
	ExtendCooldown(key policy.BreakerKey, cfg policy.BreakerConfig, until time.Time) (time.Time, error)
	SpendRetry(req policy.SpendRequest) (policy.Spend, error)
	RecordAttempt(k policy.CallKey, attempt uint32, ans policy.Answer, keep time.Time) error
	NoteCall(runID, callID string, n policy.CallNote) error
	CountAttempts(t policy.AttemptTally)
	AppendAudit(recs ...policy.AuditRecord)
	Commit() error
}

// changes holds the writes of one request that need no answer (the
// attempt record, the audit records) until Commit sends them in one
// pipeline; the reads, the breaker, cool-down and spend calls answer at
// once, each one function call. Every engine call made through it,
// Commit's too, shares one deadline, Options.Timeout from Begin: s is
// the request's view of the Store (Store.bound). It belongs to one
// goroutine.
type changes struct {
	s        *Store // &view
	view     Store
	attempts []pendingAttempt
	notes    []pendingNote
	tallies  []policy.AttemptTally
	audit    []policy.AuditRecord
}

// Begin starts a batch of changes for one request, whose engine calls
// wait for Redis at most Options.Timeout from now, all of them together.
func (s *Store) Begin() Changes {
	c := &changes{view: *s.bounded()}
	c.s = &c.view
	return c
}

// bounded is a view of s whose engine calls wait for Redis at most
// Options.Timeout from now, all of them together.
func (s *Store) bounded() *Store {
	return &Store{replicaState: s.replicaState, bound: time.Now().Add(s.opts.Timeout)}
}

// within is s as the request u sees it: u's view of this replica, whose
// calls share the request's time, when u is one (Begin's).
func (s *Store) within(u Changes) *Store {
	if c, ok := u.(*changes); ok && c.s.replicaState == s.replicaState {
		return c.s
	}
	return s
}

// ClaimAttempt is Store.ClaimAttempt within the request's time.
func (c *changes) ClaimAttempt(k policy.CallKey, attempt uint32) (policy.Answer, bool, error) {
	return c.s.ClaimAttempt(k, attempt)
}

// Run is Store.Run within the request's time.
func (c *changes) Run(id string) (policy.Run, error) { return c.s.Run(id) }

// Breaker is Store.Breaker within the request's time.
func (c *changes) Breaker(key policy.BreakerKey) (policy.BreakerSnapshot, error) {
	return c.s.Breaker(key)
}

// ReleaseLease is Store.ReleaseLease within the request's time.
func (c *changes) ReleaseLease(key policy.BreakerKey, id string, lim policy.FlowLimits, sig policy.FlowSignal) (bool, error) {
	return c.s.ReleaseLease(key, id, lim, sig)
}

// ReleaseLeases is Store.ReleaseLeases within the request's time.
func (c *changes) ReleaseLeases(rs []policy.LeaseRelease, held []bool, errs []error) {
	c.s.ReleaseLeases(rs, held, errs)
}

// Admit is Store.Admit within the request's time.
func (c *changes) Admit(key policy.BreakerKey, cfg policy.BreakerConfig) (policy.Admission, error) {
	return c.s.Admit(key, cfg)
}

// AdmitFlow is Store.AdmitFlow within the request's time.
func (c *changes) AdmitFlow(key policy.BreakerKey, cfg policy.BreakerConfig, lim policy.FlowLimits) (policy.Admission, error) {
	return c.s.AdmitFlow(key, cfg, lim)
}

// LastAnswers is Store.LastAnswers within the request's time.
func (c *changes) LastAnswers(keys []policy.CallKey, out []policy.Answer, attempts []uint32) {
	c.s.LastAnswers(keys, out, attempts)
}

// Key is Store.Key within the request's time.
func (c *changes) Key(ref policy.KeyRef) (policy.KeyRecordView, error) { return c.s.Key(ref) }

// ApplyOutcomes is Store.ApplyOutcomes within the request's time.
func (c *changes) ApplyOutcomes(ups []policy.OutcomeUpdate, deposits map[string]int) (int, error) {
	return c.s.ApplyOutcomes(ups, deposits)
}

// Record is Store.Record.
func (c *changes) Record(key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, permitID string) (policy.BreakerSnapshot, error) {
	return c.s.Record(key, cfg, r, permitID)
}

// ExtendCooldown is Store.ExtendCooldown.
func (c *changes) ExtendCooldown(key policy.BreakerKey, cfg policy.BreakerConfig, until time.Time) (time.Time, error) {
	return c.s.ExtendCooldown(key, cfg, until)
}

// SpendRetry is Store.SpendRetry.
func (c *changes) SpendRetry(req policy.SpendRequest) (policy.Spend, error) {
	return c.s.SpendRetry(req)
}

// RecordAttempt remembers ans as the answer to attempt of call k until
// keep at least (fleet.Attempts.Decided: never rewound), at Commit.
func (c *changes) RecordAttempt(k policy.CallKey, attempt uint32, ans policy.Answer, keep time.Time) error {
	if err := checkName("call_id", k.CallID, false); err != nil {
		c.s.ReleaseAttempt(k)
		return err
	}
	c.attempts = append(c.attempts, pendingAttempt{k: k, attempt: attempt, ans: ans, keep: keep})
	return nil
}

// AppendAudit adds records to the trail at Commit.
func (c *changes) AppendAudit(recs ...policy.AuditRecord) {
	now := c.s.opts.Clock()
	for _, r := range recs {
		if r.Time.IsZero() {
			r.Time = now
		}
		c.audit = append(c.audit, r)
	}
}

// Commit writes the attempt records, call notes, attempt statistics and
// audit records in one pipeline;
// with the server's appendfsync always they are durable when it returns.
func (c *changes) Commit() error {
	if len(c.attempts) == 0 && len(c.audit) == 0 && len(c.notes) == 0 && len(c.tallies) == 0 {
		return nil
	}
	s := c.s
	// Each recorded attempt's claim ends once its record is written (or
	// failed to be), so a waiting duplicate reads the answer.
	for _, a := range c.attempts {
		defer s.ReleaseAttempt(a.k)
	}
	if err := s.check(); err != nil {
		return err
	}
	var noteErr error // after the attempt records are written or kept
	if len(c.notes) > 0 && s.opts.BatchOutcomes {
		// The notes go after their tenants' held batches, whose notes were
		// made before (held.go), not in the pipeline below.
		notes := c.notes
		c.notes = nil
		_, noteErr = s.runOutcomes(nil, nil, notes, true)
	}
	for _, t := range c.tallies {
		// The tenant is listed for AttemptStats (once per replica).
		if _, err := s.follow(t.Tenant); err != nil && !errors.Is(err, ErrUnavailable) {
			return fmt.Errorf("redisstore: follow tenant %q: %w", t.Tenant, err)
		}
	}
	ctx, cancel := s.call()
	defer cancel()
	var audit []auditChunk
	if len(c.audit) > 0 {
		var packer auditPacker
		audit = packer.pack(c.audit)
	}
	auditCmds := make([]*redis.Cmd, len(audit))
	var qerr error
	cmds, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, a := range c.attempts {
			if err := queueAttempt(ctx, s.lib.on(p), a); err != nil {
				qerr = err
			}
		}
		queueNotes(ctx, s.lib.on(p), c.notes, s.opts.MaxRunCalls)
		queueTallies(ctx, p, c.tallies, s.opts.Clock())
		for i := range audit {
			auditCmds[i] = s.queueAudit(ctx, s.lib.on(p), &audit[i])
		}
		return nil
	})
	attempts := c.attempts
	c.attempts, c.notes, c.audit, c.tallies = nil, nil, nil, nil
	if qerr != nil {
		return qerr
	}
	if errors.Is(err, ErrUnavailable) {
		// Degraded: the audit chunks not written wait for the next flush,
		// which sends them as they are (one that ran adds nothing again);
		// this replica keeps the attempt records until the engine answers
		// (downAttempts), so a retried NextDelay replays its answer.
		for _, a := range attempts {
			s.keepDown(a.k, a.attempt, a.ans, a.keep.UnixNano())
		}
		var unsent []auditChunk
		for i, cmd := range auditCmds {
			if cmd.Err() != nil {
				unsent = append(unsent, audit[i])
			}
		}
		s.requeueAudit(unsent)
		return noteErr
	}
	if err != nil {
		for _, cmd := range cmds {
			if cmd.Err() != nil {
				return fmt.Errorf("redisstore: commit: %w", cmd.Err())
			}
		}
		return fmt.Errorf("redisstore: commit: %w", err)
	}
	return noteErr
}
