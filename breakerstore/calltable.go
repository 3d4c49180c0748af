package breakerstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// bucketCallTable holds each run's call table (fleet.CallTable): key run
// id 0x00 call id, value a callRecord (see encodeCallRecord). New in
// schema version 2, before its release.
var bucketCallTable = []byte("calltable")

// DefaultMaxRunCalls is Options.MaxRunCalls's default.
const DefaultMaxRunCalls = 100000

// Version bytes of a call table record: 1 without a primary target, 2 with
// one (a call that ended on a fallback). Both are read; a record of
// version 1 is a call that never left its primary.
const (
	callRecordVersion        = 1
	callRecordVersionPrimary = 2
)

// NoteCall tells the call table of run runID what n says of call callID
// (fleet.CallRecord.Note): a NextDelay decision or a final disposition. An
// unknown run is ErrNotFound; a call beyond the table's cap
// (Options.MaxRunCalls) is counted, not kept. Like a ledger count it is
// committed by the next group commit (at once with SyncAlways). It is safe
// for concurrent use.
func (s *Store) NoteCall(runID, callID string, n policy.CallNote) error {
	return s.noteCall(runID, callID, n, nil)
}

// noteCall is NoteCall, its SyncAlways commit gathered in p when p is not
// nil.
func (s *Store) noteCall(runID, callID string, n policy.CallNote, p *pending) error {
	if s.closed.Load() {
		return ErrClosed
	}
	r, ok := s.runs.get(runID)
	if !ok {
		return fmt.Errorf("%w: run %q", ErrNotFound, runID)
	}
	r.mu.Lock()
	kept, changed := r.table.Note(callID, &n)
	if !changed {
		r.mu.Unlock()
		return nil
	}
	r.dirtyTable = append(r.dirtyTable, kept)
	newlyDirty := r.markDirty()
	r.mu.Unlock()
	return s.changed(p, r, newlyDirty)
}

// RunCalls returns up to limit calls (all when limit <= 0) of run runID's
// call table that f selects, sorted by call id, starting after the id
// after, and how many of the run's calls are beyond the table's cap. An
// unknown run is ErrNotFound. It is safe for concurrent use.
func (s *Store) RunCalls(runID string, f policy.RunCallFilter, after string, limit int) ([]policy.RunCall, uint64, error) {
	if s.closed.Load() {
		return nil, 0, ErrClosed
	}
	r, ok := s.runs.get(runID)
	if !ok {
		return nil, 0, fmt.Errorf("%w: run %q", ErrNotFound, runID)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []policy.RunCall
	for id, c := range r.table.Calls {
		if id <= after {
			continue
		}
		rc := runCallOf(id, c)
		if f.Matches(&rc) {
			out = append(out, rc)
		}
	}
	slices.SortFunc(out, func(a, b policy.RunCall) int { return strings.Compare(a.CallID, b.CallID) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, r.table.Untracked, nil
}

func runCallOf(id string, c *fleet.CallRecord) policy.RunCall {
	rc := policy.RunCall{CallID: id, Disposition: c.Final.Disposition, Stop: c.Final.Stop, Attempts: c.Attempts,
		Classification: c.Classification, Detail: c.Detail, Target: c.Target, TriageRef: c.TriageRef,
		PrimaryTarget: c.PrimaryTarget}
	if c.First != 0 {
		rc.First = time.Unix(0, c.First)
	}
	if c.Last != 0 {
		rc.Last = time.Unix(0, c.Last)
	}
	return rc
}

// encodeTable encodes the call table's changed records, in the order of
// dirtyTable; r.mu is held.
func (r *run) encodeTable() []keyValue {
	kvs := make([]keyValue, 0, len(r.dirtyTable))
	for _, id := range r.dirtyTable {
		kvs = append(kvs, keyValue{joinKey(r.hdr.ID, id), encodeCallRecord(r.table.Calls[id])})
	}
	return kvs
}

// encodeCallRecord returns a call table record: the version byte (1, or 2
// when the record has a primary target), the disposition and stop reason
// (a byte each), attempts (uint32), the first and last attempt times (Unix
// ns, int64), all big-endian, then target, classification, detail and
// triage reference and, in version 2, the primary target, each a uvarint
// length and the bytes.
func encodeCallRecord(c *fleet.CallRecord) []byte {
	v := make([]byte, 0, 23+len(c.Target)+len(c.Classification)+len(c.Detail)+len(c.TriageRef)+len(c.PrimaryTarget)+10)
	version := byte(callRecordVersion)
	if c.PrimaryTarget != "" {
		version = callRecordVersionPrimary
	}
	v = append(v, version, byte(c.Final.Disposition), byte(c.Final.Stop))
	v = binary.BigEndian.AppendUint32(v, c.Attempts)
	v = binary.BigEndian.AppendUint64(v, uint64(c.First))
	v = binary.BigEndian.AppendUint64(v, uint64(c.Last))
	for _, s := range [...]string{c.Target, c.Classification, c.Detail, c.TriageRef} {
		v = binary.AppendUvarint(v, uint64(len(s)))
		v = append(v, s...)
	}
	if version == callRecordVersionPrimary {
		v = binary.AppendUvarint(v, uint64(len(c.PrimaryTarget)))
		v = append(v, c.PrimaryTarget...)
	}
	return v
}

// decodeCallRecord is encodeCallRecord's inverse.
func decodeCallRecord(v []byte) (fleet.CallRecord, error) {
	var c fleet.CallRecord
	if len(v) < 23 || (v[0] != callRecordVersion && v[0] != callRecordVersionPrimary) {
		return c, errors.New("want a call record of version 1 or 2, at least 23 bytes")
	}
	c.Final = fleet.Final{Disposition: policy.Disposition(v[1]), Stop: policy.StopReason(v[2])}
	c.Attempts = binary.BigEndian.Uint32(v[3:])
	c.First = int64(binary.BigEndian.Uint64(v[7:]))
	c.Last = int64(binary.BigEndian.Uint64(v[15:]))
	rest := v[23:]
	strs := []*string{&c.Target, &c.Classification, &c.Detail, &c.TriageRef, &c.PrimaryTarget}
	if v[0] == callRecordVersion {
		strs = strs[:4]
	}
	for _, dst := range strs {
		n, k := binary.Uvarint(rest)
		if k <= 0 || n > uint64(len(rest)-k) {
			return c, errors.New("truncated string")
		}
		*dst = string(rest[k : k+int(n)]) // a copy: v lives only as long as the transaction
		rest = rest[k+int(n):]
	}
	if len(rest) != 0 {
		return c, errors.New("trailing bytes")
	}
	return c, nil
}

// loadCallTables reads the calltable bucket into the runs' tables; it runs
// after loadRuns.
func (s *Store) loadCallTables(tx *bbolt.Tx) error {
	b := tx.Bucket(bucketCallTable)
	if b == nil {
		return nil // a file Open has not upgraded yet (Check reads it as it is)
	}
	return b.ForEach(func(k, v []byte) error {
		id, call, ok := splitKey(k)
		if !ok {
			return corrupt(bucketCallTable, k, errors.New("want key run 0x00 call"))
		}
		r, ok := s.runs.get(id)
		if !ok {
			return corrupt(bucketCallTable, k, fmt.Errorf("call of unknown run %q", id))
		}
		c, err := decodeCallRecord(v)
		if err != nil {
			return corrupt(bucketCallTable, k, err)
		}
		if len(r.table.Calls) >= r.table.Cap {
			r.table.Untracked++ // the cap was lowered since: keep what fits
			return nil
		}
		r.table.Calls[call] = &c
		return nil
	})
}
