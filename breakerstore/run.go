package breakerstore

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// run holds a policy.Run's live state, whose rules live in fleet.Run; mu
// guards every field but hdr's constant fields (ID, Tenant, Description,
// Pool, Created) and cutoff.
type run struct {
	mu     sync.Mutex
	hdr    policy.Run // constant after OpenRun; Spent and Ledger live in v
	cutoff int64
	v      fleet.Run
	// dirtyCalls are call ids changed since the last group commit, in order;
	// a group commit drops the ones it wrote when it commits.
	dirtyCalls []string
	// table is the run's call table (calltable.go); dirtyTable the call
	// ids changed in it since the last group commit, in order.
	table      fleet.CallTable
	dirtyTable []string
	dirty      bool
	deleted    bool // swept: past its retention, removed from the map
}

// runHeader is the JSON record of the runs bucket.
type runHeader struct {
	ID          string `json:"id"`
	Tenant      string `json:"tenant"`
	Description string `json:"description,omitempty"`
	Pool        uint64 `json:"retry_pool"`
	Cutoff      int64  `json:"cutoff_unix_nano"`
	Created     int64  `json:"created_unix_nano"`
	RedriveOf   string `json:"redrive_of,omitempty"`
}

// OpenRun creates a run. An empty r.ID is generated (hex, sorting by
// creation time). r.Pool must be > 0 (ErrInvalid naming retry_pool) and
// r.Cutoff in the future (cutoff_time); an existing id is ErrExists. Spent,
// Ledger and Created are set by the store. The run is committed before
// OpenRun returns. It is safe for concurrent use.
func (s *Store) OpenRun(r policy.Run) (policy.Run, error) {
	if s.closed.Load() {
		return policy.Run{}, ErrClosed
	}
	now := s.clock.Now()
	if r.ID == "" {
		r.ID = newRunID(now)
	}
	if err := fieldErr(fleet.CheckRun(&r, now)); err != nil {
		return policy.Run{}, err
	}
	if r.RedriveOf != "" {
		if old, ok := s.runs.get(r.RedriveOf); !ok || old.hdr.Tenant != r.Tenant {
			return policy.Run{}, fmt.Errorf("%w: run %q", ErrNotFound, r.RedriveOf)
		}
	}
	r = policy.Run{ID: strings.Clone(r.ID), Tenant: strings.Clone(r.Tenant), Description: strings.Clone(r.Description),
		Pool: r.Pool, Cutoff: r.Cutoff, Created: now, RedriveOf: strings.Clone(r.RedriveOf)}
	hdr, err := json.Marshal(runHeader{ID: r.ID, Tenant: r.Tenant, Description: r.Description,
		Pool: r.Pool, Cutoff: r.Cutoff.UnixNano(), Created: now.UnixNano(), RedriveOf: r.RedriveOf})
	if err != nil {
		return policy.Run{}, fmt.Errorf("breakerstore: encode run: %w", err)
	}
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if _, ok := s.runs.get(r.ID); ok {
		return policy.Run{}, fmt.Errorf("%w: run %q", ErrExists, r.ID)
	}
	if n := s.runs.len(); n >= s.opts.MaxRuns {
		return policy.Run{}, fmt.Errorf("%w: %d runs kept (cap %d; runs are deleted %v after their cut-off)",
			ErrTooManyRuns, n, s.opts.MaxRuns, s.opts.RunRetention)
	}
	rs := &run{hdr: r, cutoff: r.Cutoff.UnixNano(), v: fleet.NewRun(r.Pool, r.Cutoff.UnixNano()),
		table: fleet.NewCallTable(s.opts.MaxRunCalls)}
	err = s.update("write run", func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketRuns).Get([]byte(r.ID)) != nil {
			return fmt.Errorf("%w: run %q", ErrExists, r.ID)
		}
		if err := tx.Bucket(bucketRuns).Put([]byte(r.ID), hdr); err != nil {
			return err
		}
		return tx.Bucket(bucketRunState).Put([]byte(r.ID), rs.encodeState())
	})
	if err != nil {
		return policy.Run{}, err
	}
	s.runs.put(r.ID, rs)
	return r, nil
}

// newRunID returns 16 hex digits of the creation time in Unix ns and 8 of
// randomness, so generated ids sort by creation.
func newRunID(now time.Time) string {
	var b [12]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixNano()))
	_, _ = rand.Read(b[8:])
	return hex.EncodeToString(b[:])
}

// Run returns the run with id and its ledger, or ErrNotFound. It is safe for
// concurrent use.
func (s *Store) Run(id string) (policy.Run, error) {
	if s.closed.Load() {
		return policy.Run{}, ErrClosed
	}
	r, ok := s.runs.get(id)
	if !ok {
		return policy.Run{}, fmt.Errorf("%w: run %q", ErrNotFound, id)
	}
	return r.snapshot(), nil
}

func (r *run) snapshot() policy.Run {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.hdr
	out.Spent = r.v.Spent
	out.Ledger = r.v.Ledger
	return out
}

// Runs returns up to limit runs (all when limit <= 0) of tenant (every
// tenant's when ""), sorted by id, starting after the id after. It is safe
// for concurrent use.
func (s *Store) Runs(tenant, after string, limit int) ([]policy.Run, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	var out []policy.Run
	for _, r := range s.runs.values() {
		if r.hdr.ID <= after || (tenant != "" && r.hdr.Tenant != tenant) {
			continue
		}
		out = append(out, r.snapshot())
	}
	slices.SortFunc(out, func(a, b policy.Run) int { return cmp.Compare(a.ID, b.ID) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// RecordFinal records the final disposition of call callID in run runID's
// ledger (see policy.Ledger for the mapping of DEAD_LETTER stop reasons). The
// first final disposition of a call id wins: the same report twice counts
// once, and a different one is refused with a *fleet.Refusal naming
// final_disposition (fleet.AlreadyFinal), the ledger unchanged. It returns
// ErrNotFound for an unknown run,
// ErrInvalid for DispositionNone or an unknown disposition. The ledger is a
// counter, flushed per the sync mode. It is safe for concurrent use.
func (s *Store) RecordFinal(runID, callID string, d policy.Disposition, stop policy.StopReason) error {
	_, err := s.recordFinal(runID, callID, fleet.Final{Disposition: d, Stop: stop}, nil)
	return err
}

// recordFinal is RecordFinal; with SyncAlways the change joins p, when set,
// instead of being committed on its own. first reports whether the ledger
// took f as the call's first final disposition.
func (s *Store) recordFinal(runID, callID string, f fleet.Final, p *pending) (first bool, err error) {
	if s.closed.Load() {
		return false, ErrClosed
	}
	if err := checkName("call_id", callID, false); err != nil {
		return false, err
	}
	var probe policy.Ledger
	if fleet.LedgerSlot(&probe, f) == nil {
		return false, invalid("disposition", "must be a final disposition")
	}
	r, ok := s.runs.get(runID)
	if !ok {
		return false, fmt.Errorf("%w: run %q", ErrNotFound, runID)
	}
	r.mu.Lock()
	kept, changed, _, refused := r.v.RecordFinal(callID, f)
	if !changed {
		r.mu.Unlock()
		if refused != nil {
			return false, refused
		}
		return false, nil
	}
	r.dirtyCalls = append(r.dirtyCalls, kept)
	newlyDirty := r.markDirty()
	r.mu.Unlock()
	return true, s.changed(p, r, newlyDirty)
}

func (r *run) markDirty() bool {
	if r.dirty {
		return false
	}
	r.dirty = true
	return true
}

// redirty implements entity.
func (r *run) redirty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dirty {
		return false
	}
	r.dirty = true
	return true
}

// encodeState returns the runstate record: spent, then the 10 ledger
// counters, each uint64 big-endian. r.mu must be held (or r unshared).
func (r *run) encodeState() []byte {
	v := make([]byte, 0, runStateSize)
	v = binary.BigEndian.AppendUint64(v, r.v.Spent)
	for _, n := range ledgerCounters(&r.v.Ledger) {
		v = binary.BigEndian.AppendUint64(v, n)
	}
	return v
}

// runStateSize is the size of a runstate record; runStateSizeV2a that of
// one written before the dead_letter_deadline and deduplicated counters
// (8 counters), still read: only spent is read back, the ledger is
// recomputed from runcalls.
const (
	runStateSize    = 88
	runStateSizeV2a = 72
)

func ledgerCounters(l *policy.Ledger) [10]uint64 {
	return [10]uint64{l.Succeeded, l.FailedTerminal, l.DeadLetterExhausted, l.DeadLetterBudget,
		l.DeadLetterNotIdempotent, l.DeadLetterPushback, l.CircuitOpen, l.DeadlineCut, l.DeadLetterDeadline, l.Deduplicated}
}

// write implements entity: the runstate record and the changed calls. With
// clear, the calls written are dropped from dirtyCalls once tx commits.
// The records are encoded under r.mu and put after it: the run's
// decisions and outcomes (NoteCall, RecordFinal, spends) do not wait for
// bbolt's tree searches of a flush that writes thousands of its calls. A
// sweep that drops the run meanwhile deletes its records in a later
// transaction.
func (r *run) write(tx *bbolt.Tx, clear bool) (int, error) {
	r.mu.Lock()
	if clear {
		r.dirty = false
	}
	if r.deleted {
		r.mu.Unlock()
		return 0, nil
	}
	id := r.hdr.ID
	state := r.encodeState()
	finals := make([]keyValue, 0, len(r.dirtyCalls))
	for _, call := range r.dirtyCalls {
		f := r.v.Calls[call]
		v := []byte{byte(f.Disposition), byte(f.Stop), 1}
		if !f.Deduplicated {
			v = v[:2]
		}
		finals = append(finals, keyValue{joinKey(id, call), v})
	}
	notes := r.encodeTable()
	r.mu.Unlock()

	if err := tx.Bucket(bucketRunState).Put([]byte(id), state); err != nil {
		return 0, err
	}
	for _, b := range [...]struct {
		bucket []byte
		kvs    []keyValue
		dirty  *[]string
	}{{bucketRunCalls, finals, &r.dirtyCalls}, {bucketCallTable, notes, &r.dirtyTable}} {
		bk := tx.Bucket(b.bucket)
		for _, kv := range b.kvs {
			if err := bk.Put(kv.k, kv.v); err != nil {
				return 0, err
			}
		}
		if written, dirty := len(b.kvs), b.dirty; clear && written > 0 {
			tx.OnCommit(func() {
				r.mu.Lock()
				*dirty = slices.Delete(*dirty, 0, written)
				r.mu.Unlock()
			})
		}
	}
	return 1 + len(finals) + len(notes), nil
}

// keyValue is a record encoded for a Put.
type keyValue struct{ k, v []byte }

// loadRuns reads the runs, runstate and runcalls buckets into memory. The
// ledger is recomputed from the calls, which are committed with it.
func (s *Store) loadRuns(tx *bbolt.Tx) error {
	err := tx.Bucket(bucketRuns).ForEach(func(k, v []byte) error {
		var h runHeader
		if err := json.Unmarshal(v, &h); err != nil {
			return corrupt(bucketRuns, k, err)
		}
		if h.ID != string(k) || h.Pool == 0 {
			return corrupt(bucketRuns, k, errors.New("run header does not match its key or has no pool"))
		}
		r := &run{
			hdr: policy.Run{ID: h.ID, Tenant: h.Tenant, Description: h.Description, Pool: h.Pool,
				Cutoff: time.Unix(0, h.Cutoff), Created: time.Unix(0, h.Created), RedriveOf: h.RedriveOf},
			cutoff: h.Cutoff,
			v:      fleet.NewRun(h.Pool, h.Cutoff),
			table:  fleet.NewCallTable(s.opts.MaxRunCalls),
		}
		st := tx.Bucket(bucketRunState).Get(k)
		if len(st) != runStateSize && len(st) != runStateSizeV2a {
			return corrupt(bucketRunState, k, fmt.Errorf("runstate record is %d bytes, want %d", len(st), runStateSize))
		}
		r.v.Spent = binary.BigEndian.Uint64(st)
		s.runs.put(r.hdr.ID, r)
		return nil
	})
	if err != nil {
		return err
	}
	return tx.Bucket(bucketRunCalls).ForEach(func(k, v []byte) error {
		id, call, ok := splitKey(k)
		if !ok || (len(v) != 2 && (len(v) != 3 || v[2] != 1)) {
			return corrupt(bucketRunCalls, k, errors.New("want key run 0x00 call and a 2-byte value (3 with the deduplicated mark 1)"))
		}
		r, ok := s.runs.get(id)
		if !ok {
			return corrupt(bucketRunCalls, k, fmt.Errorf("call of unknown run %q", id))
		}
		if !r.v.Restore(call, fleet.Final{Disposition: policy.Disposition(v[0]), Stop: policy.StopReason(v[1]), Deduplicated: len(v) == 3}) {
			return corrupt(bucketRunCalls, k, fmt.Errorf("disposition %d", v[0]))
		}
		return nil
	})
}
