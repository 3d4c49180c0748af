package breakerstore

import (
	"errors"
	"slices"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/policy"
)

// Every write of the store is a pending set of changes made durable by
// commit, the one function that checks the size cap, notes and counts the
// transaction and, when it fails, queues the entities again for the group
// commit and gives the audit records back to the buffer. What differs
// between writes is data in the pending value: how the transaction is
// made (kind), the free pages it may not use (floor) and a step of its own.

// commitKind says how a pending set of changes is committed.
type commitKind uint8

const (
	// commitShared is a SyncAlways commit of counters and audit records,
	// through bbolt's Batch: it shares a transaction and an fsync with
	// concurrent callers, and may run twice, so it writes current state
	// only (and has no step).
	commitShared commitKind = iota
	// commitAlone is a transaction of its own, at once: admin writes and
	// breaker transitions, durable before their method returns.
	commitAlone
	// commitGroup is the flusher's group commit: it clears the entities'
	// dirty marks, and its step writes the buffered audit records and
	// deletes what the sweep and retention dropped.
	commitGroup
)

// entity is a piece of state with counters that are flushed in group commits.
type entity interface {
	// write puts the entity's current state in tx, locking the entity; with
	// clear it also clears the dirty mark. It returns the records written.
	write(tx *bbolt.Tx, clear bool) (int, error)
	// redirty marks the entity dirty again after a failed commit and reports
	// whether the caller must queue it (it was clean and still exists).
	redirty() bool
}

// pending is a set of changes that commit together, in one transaction;
// nothing rolls back. It belongs to one goroutine.
type pending struct {
	kind  commitKind
	floor int    // free pages kept (see roomLeft); < 0 for a deletion
	op    string // what the commit does, for its error

	ents      []entity // written with their current state
	inline    [2]entity
	seen      map[entity]struct{}
	mutations int // changes made durable, for Stats.SyncMutations
	audit     []policy.AuditRecord
	// step runs in the transaction after the entities are written: an
	// admin write's puts and deletes, the group commit's audit and
	// deletions.
	step func(tx *bbolt.Tx) error

	written int // records the transaction wrote, set by commit
}

// shared returns an empty SyncAlways batch.
func shared() *pending {
	return &pending{kind: commitShared, floor: counterPages, op: "commit"}
}

// add puts e in p, once however often it changes. A few entities are
// told apart by a scan, more through a set.
func (p *pending) add(e entity) {
	p.mutations++
	if p.seen != nil {
		if _, ok := p.seen[e]; !ok {
			p.seen[e] = struct{}{}
			p.ents = append(p.ents, e)
		}
		return
	}
	if slices.Contains(p.ents, e) {
		return
	}
	if p.ents == nil {
		p.ents = p.inline[:0] // most hold one or two: no array of their own
	}
	p.ents = append(p.ents, e)
	if len(p.ents) > 8 {
		p.seen = make(map[entity]struct{}, 2*len(p.ents))
		for _, x := range p.ents {
			p.seen[x] = struct{}{}
		}
	}
}

// empty reports whether p has nothing to commit.
func (p *pending) empty() bool { return len(p.ents) == 0 && len(p.audit) == 0 && p.step == nil }

// changed notes that counters of e changed (newlyDirty: e was clean until
// now) and makes the change durable as the sync mode asks: with SyncGroup
// in the next group commit, for which e is queued when newly dirty; with
// SyncAlways in p's commit when p is set, else in a commit of its own now.
// With SyncAlways the group commit writes e again, harmlessly.
func (s *Store) changed(p *pending, e entity, newlyDirty bool) error {
	if newlyDirty {
		s.queue(e)
	}
	if s.opts.Sync != SyncAlways {
		return nil
	}
	if p != nil {
		p.add(e)
		return nil
	}
	p = &pending{kind: commitShared, floor: counterPages, op: "commit"}
	p.add(e)
	return s.commit(p)
}

// commit makes p durable in one write transaction, as p.kind says. On
// failure the entities are queued for the next group commit and the audit
// records wait in the buffer (dropped when it is full), so nothing changed
// in memory is lost to the disk while the store runs; the error is
// returned, a class of this package's as it is, any other as a storage
// error naming p.op.
func (s *Store) commit(p *pending) error {
	if p.empty() {
		return nil
	}
	if p.kind == commitAlone && s.closed.Load() {
		return ErrClosed
	}
	fn := func(tx *bbolt.Tx) error {
		if err := s.roomLeft(p.floor); err != nil {
			return err
		}
		if p.kind == commitShared {
			s.stats.noteBatch(tx)
		}
		p.written = 0
		for _, e := range p.ents {
			k, err := e.write(tx, p.kind == commitGroup)
			if err != nil {
				return err
			}
			p.written += k
		}
		if p.step != nil {
			if err := p.step(tx); err != nil {
				return err
			}
		}
		if p.kind == commitGroup {
			return nil // the step wrote the audit records, with retention
		}
		return s.writeAudit(tx, p.audit)
	}
	var err error
	if p.kind == commitShared {
		err = s.db.Batch(fn)
	} else {
		err = s.db.Update(fn)
	}
	switch {
	case p.kind == commitGroup && err != nil:
		s.requeueAudit(p.audit)
	case p.kind != commitGroup && len(p.audit) > 0:
		s.auditSynced(p.audit, err)
	}
	if err != nil {
		for _, e := range p.ents {
			if e.redirty() {
				s.queue(e)
			}
		}
		for _, class := range []error{ErrInvalid, ErrNotFound, ErrExists, ErrTooManyBreakers, ErrDiskFull} {
			if errors.Is(err, class) {
				return err
			}
		}
		return s.writeErr(p.op, err)
	}
	switch p.kind {
	case commitShared:
		s.stats.syncMutations.Add(uint64(p.mutations))
	case commitGroup:
		s.stats.commits.Add(1)
		s.stats.groupCommits.Add(1)
		p.written += len(p.audit)
	default:
		s.stats.commits.Add(1)
	}
	s.stats.records.Add(uint64(p.written))
	return nil
}

// update runs fn in a durable write transaction of its own: an admin write.
func (s *Store) update(op string, fn func(tx *bbolt.Tx) error) error {
	return s.commit(&pending{kind: commitAlone, floor: reservePages, op: op, step: fn})
}

// updateFreeing is update for a deletion: in a file at its size cap it may
// use the pages roomLeft keeps free.
func (s *Store) updateFreeing(op string, fn func(tx *bbolt.Tx) error) error {
	return s.commit(&pending{kind: commitAlone, floor: -1, op: op, step: fn})
}

// queue adds a newly dirty entity to the next group commit.
func (s *Store) queue(e entity) {
	s.group.dirtyMu.Lock()
	s.group.dirty = append(s.group.dirty, e)
	s.group.dirtyMu.Unlock()
}

// noteBatch counts each distinct Batch transaction once, at its commit.
func (w *writeStats) noteBatch(tx *bbolt.Tx) {
	w.batchMu.Lock()
	if w.lastBatchTx != tx {
		w.lastBatchTx = tx
		tx.OnCommit(func() {
			w.commits.Add(1)
			w.syncCommits.Add(1)
		})
	}
	w.batchMu.Unlock()
}
