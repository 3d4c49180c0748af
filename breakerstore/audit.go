package breakerstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/policy"
)

// Defaults and limits of the audit trail.
const (
	// DefaultAuditRetention is how long audit records are kept by default.
	DefaultAuditRetention = 7 * 24 * time.Hour
	// DefaultAuditMaxRecords is how many audit records are kept by default.
	DefaultAuditMaxRecords = 1_000_000
	// DefaultAuditBuffer is how many appended audit records may wait for the
	// next group commit by default; past it new records are dropped.
	DefaultAuditBuffer = 64 * 1024
	// DefaultAuditPage is the page size of a QueryAudit without a limit.
	DefaultAuditPage = 100
	// MaxAuditPage is the largest page QueryAudit returns.
	MaxAuditPage = 10_000

	// auditSweepBatch caps the records one flush deletes, so a large backlog
	// is removed over several commits instead of one huge transaction.
	auditSweepBatch = 50_000
	// auditKeyLen is the length of a record key: time and sequence number.
	auditKeyLen = 16
	// auditVersion is the version byte of an encoded record.
	auditVersion = 1
)

// AppendAudit adds recs, in order, to the audit trail. It stamps each
// record's Time with the store's clock when it is zero (never earlier than
// the previous stamp, so the trail's order is the order of appends) and its
// Seq always.
//
// AppendAudit never blocks a decision on the disk in the default SyncGroup
// mode: the records wait in a bounded in-memory buffer for the flusher's
// next group commit, and when the buffer is full (Options.AuditBuffer) a
// record is dropped and counted in Stats.AuditDropped, and the flusher logs
// the drops. With SyncAlways the records are committed in one call of
// bbolt's Batch, sharing an fsync with concurrent mutations, before
// AppendAudit returns; callers append all the records of one request at
// once. A record whose tenant, target, call id or run id holds a NUL byte
// cannot be indexed and is dropped likewise. After Close it does nothing.
// AppendAudit is safe for concurrent use.
func (s *Store) AppendAudit(recs ...policy.AuditRecord) {
	s.appendAudit(nil, recs)
}

// appendAudit is AppendAudit for the records of every group, in order;
// with SyncAlways the records join p, when set, instead of being committed
// on their own. The records are copied once, into the buffer (or the
// SyncAlways batch), and stamped there with one reading of the clock.
func (s *Store) appendAudit(p *pending, groups ...[]policy.AuditRecord) {
	if s.closed.Load() {
		return
	}
	n := 0
	for _, g := range groups {
		n += len(g)
	}
	if n == 0 {
		return
	}
	now := s.now()
	var unindexable error
	s.auditMu.Lock()
	dst, room := s.auditBuf, max(s.opts.AuditBuffer-len(s.auditBuf), 0)
	if s.opts.Sync == SyncAlways {
		dst, room = make([]policy.AuditRecord, 0, n), n // never the caller's array
	}
	start := len(dst)
	for _, g := range groups {
		for i := range g {
			if err := checkAuditNames(&g[i]); err != nil {
				s.auditDropped.Add(1)
				unindexable = err
				continue
			}
			if len(dst)-start == room {
				s.auditDropped.Add(1)
				continue
			}
			dst = append(dst, g[i])
			s.stampAudit(&dst[len(dst)-1], now)
		}
	}
	if s.opts.Sync != SyncAlways {
		s.auditBuf = dst
	}
	s.auditMu.Unlock()
	if unindexable != nil {
		s.log.Warn("breakerstore: audit record dropped", "err", unindexable)
	}
	if s.opts.Sync == SyncAlways {
		if p != nil {
			p.audit = append(p.audit, dst...)
			return
		}
		one := shared()
		one.audit = dst
		_ = s.commit(one) // a failure is logged, the records left to the flusher
	}
}

// checkAuditNames checks that rec's names can be indexed.
func checkAuditNames(rec *policy.AuditRecord) error {
	for _, f := range [...]struct{ field, v string }{
		{"tenant", rec.Tenant}, {"target", rec.Target}, {"call_id", rec.CallID}, {"run_id", rec.RunID},
	} {
		if err := checkName(f.field, f.v, true); err != nil {
			return err
		}
	}
	return nil
}

// stampAudit sets rec's time (when zero, to now) and sequence number;
// s.auditMu must be held.
func (s *Store) stampAudit(rec *policy.AuditRecord, now int64) {
	var ns int64
	if rec.Time.IsZero() {
		ns = max(now, s.auditLast)
		s.auditLast = ns
	} else {
		ns = max(rec.Time.UnixNano(), 0)
	}
	rec.Time = time.Unix(0, ns)
	s.auditSeq++
	rec.Seq = s.auditSeq
}

// auditSynced updates the in-memory view of the trail after a SyncAlways
// commit of recs; when it failed (err), the records wait in the buffer for
// the flusher, or are dropped when it is full.
func (s *Store) auditSynced(recs []policy.AuditRecord, err error) {
	s.auditMu.Lock()
	defer s.auditMu.Unlock()
	if err != nil {
		s.log.Error("breakerstore: audit records not committed; retrying in the next flush",
			"err", s.writeErr("commit audit", err), "records", len(recs))
		room := max(s.opts.AuditBuffer-len(s.auditBuf), 0)
		if len(recs) > room {
			s.auditDropped.Add(uint64(len(recs) - room))
			recs = recs[:room]
		}
		s.auditBuf = append(s.auditBuf, recs...)
		return
	}
	s.syncMutations.Add(1)
	s.records.Add(uint64(len(recs)))
	for _, rec := range recs {
		if ns := rec.Time.UnixNano(); s.auditCount == 0 || ns < s.auditOldest {
			s.auditOldest = ns
		}
		s.auditCount++
	}
}

// takeAudit empties the buffer for a group commit.
func (s *Store) takeAudit() []policy.AuditRecord {
	s.auditMu.Lock()
	defer s.auditMu.Unlock()
	recs := s.auditBuf
	// The next interval likely appends as many: size for it at once rather
	// than growing (and copying) the buffer from nothing again.
	s.auditBuf = make([]policy.AuditRecord, 0, min(cap(recs), s.opts.AuditBuffer))
	return recs
}

// requeueAudit puts records of a failed group commit back in front of the
// buffer, dropping what no longer fits.
func (s *Store) requeueAudit(recs []policy.AuditRecord) {
	if len(recs) == 0 {
		return
	}
	s.auditMu.Lock()
	defer s.auditMu.Unlock()
	merged := append(recs, s.auditBuf...)
	if over := len(merged) - s.opts.AuditBuffer; over > 0 {
		merged = merged[:s.opts.AuditBuffer]
		s.auditDropped.Add(uint64(over))
	}
	s.auditBuf = merged
}

// auditSweepDue reports whether records on disk are past the retention age
// or the record cap, so the flusher must delete some.
func (s *Store) auditSweepDue(now int64) bool {
	s.auditMu.Lock()
	defer s.auditMu.Unlock()
	if s.auditCount == 0 {
		return false
	}
	return s.auditCount > s.opts.AuditMaxRecords || s.auditOldest < now-int64(s.opts.AuditRetention)
}

// auditCommitted updates the in-memory view of the disk after a group
// commit that wrote n records, deleted del and left oldest first.
func (s *Store) auditCommitted(n, del int, oldest int64) {
	s.auditMu.Lock()
	s.auditCount = max(s.auditCount+n-del, 0)
	s.auditOldest = oldest
	s.auditMu.Unlock()
	s.auditDeleted.Add(uint64(del))
}

// logAuditDrops logs the records dropped since the last call; s.flushMu
// must be held.
func (s *Store) logAuditDrops() {
	if d := s.auditDropped.Load(); d != s.auditDropLogged {
		s.log.Warn("breakerstore: audit records dropped (buffer full or unindexable)",
			"dropped", d-s.auditDropLogged, "total", d, "buffer", s.opts.AuditBuffer)
		s.auditDropLogged = d
	}
}

// flushAudit writes recs and deletes records past retention in tx; it runs
// inside the flusher's transaction. count is the records on disk before.
// It returns the records deleted and the time of the oldest one left.
//
// Retention is exact to the record but decodes at most one segment: the
// segments are walked from the oldest, one whose last record (in its
// header) is past the age cutoff, or whose records are all beyond the
// cap, is deleted whole, and the first one that is only partly expired is
// rewritten without its expired records, under its first remaining key.
func (s *Store) flushAudit(tx *bbolt.Tx, recs []policy.AuditRecord, now int64, count int) (deleted int, oldest int64, err error) {
	if err := writeAudit(tx, recs); err != nil {
		return 0, 0, err
	}
	b := tx.Bucket(bucketAuditSeg)
	cutoff := now - int64(s.opts.AuditRetention)
	excess := count + len(recs) - s.opts.AuditMaxRecords
	var gone [][]byte // segments to delete
	var restKey, restValue []byte
	var w segEncoder
	c := b.Cursor()
	for k, v := c.First(); k != nil && deleted < auditSweepBatch; k, v = c.Next() {
		need := excess - deleted // records still beyond the cap
		if len(k) == auditKeyLen && int64(binary.BigEndian.Uint64(k)) >= cutoff && need <= 0 {
			break
		}
		h, err := parseSegHeader(v)
		if err == nil && len(k) != auditKeyLen {
			err = errors.New("key is not time and sequence number")
		}
		if err != nil {
			s.log.Error("breakerstore: undecodable audit segment removed", "err", corrupt(bucketAuditSeg, k, err))
			gone = append(gone, bytes.Clone(k))
			continue
		}
		room := auditSweepBatch - deleted
		if (int64(h.last.ns) < cutoff || need >= h.count) && h.count <= room {
			gone = append(gone, bytes.Clone(k))
			deleted += h.count
			continue
		}
		_, ents, err := segEntries(k, v)
		if err != nil {
			s.log.Error("breakerstore: undecodable audit segment removed", "err", corrupt(bucketAuditSeg, k, err))
			gone = append(gone, bytes.Clone(k))
			deleted += h.count
			continue
		}
		m := max(need, 0)
		for m < len(ents) && int64(ents[m].key.ns) < cutoff {
			m++
		}
		if m = min(m, room, len(ents)); m > 0 {
			gone = append(gone, bytes.Clone(k))
			deleted += m
			if rest := ents[m:]; len(rest) > 0 {
				restKey, restValue = rest[0].key.bytes(), w.encode(rest)
			}
		}
		// The segments after this one are newer than its last record,
		// which is kept, and nothing is beyond the cap any more (or the
		// sweep's batch is full).
		break
	}
	for _, k := range gone {
		if err := b.Delete(k); err != nil {
			return 0, 0, err
		}
	}
	if restKey != nil {
		if err := b.Put(restKey, restValue); err != nil {
			return 0, 0, err
		}
	}
	first, _ := b.Cursor().First()
	if len(first) == auditKeyLen {
		oldest = int64(binary.BigEndian.Uint64(first))
	}
	return deleted, oldest, nil
}

// writeAudit writes recs as segments, and the highest sequence number, in
// tx. It is idempotent, as bbolt's Batch requires: run again on the same
// state it writes the same keys and values.
func writeAudit(tx *bbolt.Tx, recs []policy.AuditRecord) error {
	if len(recs) == 0 {
		return nil
	}
	var w segEncoder
	if err := w.insert(tx.Bucket(bucketAuditSeg), auditEntries(recs)); err != nil {
		return err
	}
	var top uint64
	for i := range recs {
		top = max(top, recs[i].Seq)
	}
	meta := tx.Bucket(bucketMeta)
	if v := meta.Get(keyAuditSeq); len(v) == 8 && binary.BigEndian.Uint64(v) >= top {
		return nil
	}
	return meta.Put(keyAuditSeq, binary.BigEndian.AppendUint64(nil, top))
}

// auditEntries returns recs as segment entries in key order; they point at
// recs. The records are normally in key order already (stamped in order);
// a record with a time of its own, or records a failed SyncAlways commit
// left to the flusher, may not be. Of records with the same key the last
// one is kept, as a Put of each would.
func auditEntries(recs []policy.AuditRecord) []segEntry {
	ents := make([]segEntry, len(recs))
	sorted := true
	for i := range recs {
		rec := &recs[i]
		ents[i] = segEntry{key: akey{uint64(max(rec.Time.UnixNano(), 0)), rec.Seq}, rec: rec}
		if i > 0 && ents[i].key.cmp(ents[i-1].key) <= 0 {
			sorted = false
		}
	}
	if sorted {
		return ents
	}
	slices.SortStableFunc(ents, func(a, b segEntry) int { return a.key.cmp(b.key) })
	out := ents[:0]
	for i, e := range ents {
		if i+1 < len(ents) && ents[i+1].key == e.key {
			continue
		}
		out = append(out, e)
	}
	return out
}

// loadAudit reads the trail's size, oldest time, last stamp and sequence
// number from the segments' keys and headers; records are read only by
// queries.
func (s *Store) loadAudit(tx *bbolt.Tx) error {
	s.auditCount = 0
	if b := tx.Bucket(bucketAuditSeg); b != nil {
		var last akey
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != auditKeyLen {
				return corrupt(bucketAuditSeg, k, errors.New("key is not time and sequence number"))
			}
			h, err := parseSegHeader(v)
			if err != nil {
				return corrupt(bucketAuditSeg, k, err)
			}
			if s.auditCount == 0 {
				s.auditOldest = int64(binary.BigEndian.Uint64(k))
			}
			s.auditCount += h.count
			last = h.last
		}
		if s.auditCount > 0 {
			s.auditLast, s.auditSeq = int64(last.ns), last.seq
		}
	}
	if v := tx.Bucket(bucketMeta).Get(keyAuditSeq); v != nil {
		if len(v) != 8 {
			return corrupt(bucketMeta, keyAuditSeq, fmt.Errorf("%d bytes, want 8", len(v)))
		}
		s.auditSeq = max(s.auditSeq, binary.BigEndian.Uint64(v))
	}
	return nil
}

// checkAudit decodes every audit segment and checks it in full (see
// checkSegment), and that the segments are in order and do not overlap;
// Check uses it. The records of a file of the previous layout, which Open
// moves into segments, are decoded too.
func checkAudit(tx *bbolt.Tx) error {
	if b := tx.Bucket(bucketAuditSeg); b != nil {
		var prev *akey
		err := b.ForEach(func(k, v []byte) error {
			last, err := checkSegment(k, v, prev)
			if err != nil {
				return corrupt(bucketAuditSeg, k, err)
			}
			prev = &last
			return nil
		})
		if err != nil {
			return err
		}
	}
	if b := tx.Bucket(bucketAudit); b != nil {
		return b.ForEach(func(k, v []byte) error {
			if _, err := decodeAudit(k, v); err != nil {
				return corrupt(bucketAudit, k, err)
			}
			return nil
		})
	}
	return nil
}

// QueryAudit returns the audit records that q selects, in the trail's order
// (time, then sequence number), and the cursor to pass as q.After for the
// next page, zero when there is none. Records still waiting for a group
// commit are included, so a query sees every record appended before it.
// q.Limit defaults to DefaultAuditPage and is capped at MaxAuditPage.
// The segments are read from the one holding the start (q.Start or
// q.After) on, by time; a segment whose header shows it ends before the
// start, or whose Bloom filter shows it holds no record of q.CallID or
// q.Tenant (when set), is skipped without decoding its records. It is safe
// for concurrent use.
func (s *Store) QueryAudit(q policy.AuditQuery) ([]policy.AuditRecord, policy.AuditCursor, error) {
	if s.closed.Load() {
		return nil, policy.AuditCursor{}, ErrClosed
	}
	if err := checkName("call_id", q.CallID, true); err != nil {
		return nil, policy.AuditCursor{}, err
	}
	if err := checkName("tenant", q.Tenant, true); err != nil {
		return nil, policy.AuditCursor{}, err
	}
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultAuditPage
	}
	limit = min(limit, MaxAuditPage)
	var startNs, endNs int64 = 0, math.MaxInt64
	if !q.Start.IsZero() {
		startNs = max(q.Start.UnixNano(), 0)
	}
	if !q.End.IsZero() {
		endNs = q.End.UnixNano()
	}
	hasAfter := !q.After.IsZero()
	after := akey{uint64(max(q.After.Time.UnixNano(), 0)), q.After.Seq}
	// inRange reports whether a record of key k is in [Start, End) and
	// after q.After.
	inRange := func(k akey) bool {
		ns := int64(k.ns)
		return ns >= startNs && ns < endNs && (!hasAfter || k.cmp(after) > 0)
	}

	// Holding flushMu while the read transaction starts means every record
	// is either in the buffer copy or in the transaction's snapshot.
	s.flushMu.Lock()
	var out []policy.AuditRecord
	s.auditMu.Lock()
	for i := range s.auditBuf {
		rec := &s.auditBuf[i]
		if (q.CallID == "" || rec.CallID == q.CallID) && (q.Tenant == "" || rec.Tenant == q.Tenant) &&
			inRange(akey{uint64(max(rec.Time.UnixNano(), 0)), rec.Seq}) {
			out = append(out, *rec)
		}
	}
	s.auditMu.Unlock()
	tx, err := s.db.Begin(false)
	s.flushMu.Unlock()
	if err != nil {
		return nil, policy.AuditCursor{}, storageErr("query audit", err)
	}
	defer func() { _ = tx.Rollback() }()

	seek := akey{ns: uint64(startNs)}
	if hasAfter && after.cmp(seek) > 0 {
		seek = after
	}
	c := tx.Bucket(bucketAuditSeg).Cursor()
	fromDisk := 0
segments:
	for k, v := segAt(c, seek.bytes()); k != nil && fromDisk <= limit; k, v = c.Next() {
		if len(k) != auditKeyLen {
			return nil, policy.AuditCursor{}, corrupt(bucketAuditSeg, k, errors.New("key is not time and sequence number"))
		}
		if int64(binary.BigEndian.Uint64(k)) >= endNs {
			break
		}
		h, err := parseSegHeader(v)
		if err != nil {
			return nil, policy.AuditCursor{}, corrupt(bucketAuditSeg, k, err)
		}
		if h.last.cmp(seek) < 0 ||
			q.CallID != "" && !h.mayHold('c', q.CallID) || q.Tenant != "" && !h.mayHold('t', q.Tenant) {
			continue
		}
		r := newSegReader(keyOf(k), &h)
		for fromDisk <= limit {
			e, ok, err := r.next()
			if err != nil {
				return nil, policy.AuditCursor{}, corrupt(bucketAuditSeg, k, err)
			}
			if !ok {
				break
			}
			if int64(e.key.ns) >= endNs {
				break segments
			}
			if !inRange(e.key) {
				continue
			}
			tenant, callID, ok := auditNames(e.body)
			if !ok {
				return nil, policy.AuditCursor{}, corrupt(bucketAuditSeg, k, errors.New("undecodable record"))
			}
			if q.CallID != "" && string(callID) != q.CallID || q.Tenant != "" && string(tenant) != q.Tenant {
				continue
			}
			rec, err := decodeAudit(e.key.bytes(), e.body)
			if err != nil {
				return nil, policy.AuditCursor{}, corrupt(bucketAuditSeg, k, err)
			}
			out = append(out, rec)
			fromDisk++
		}
	}
	slices.SortFunc(out, func(a, b policy.AuditRecord) int { return compareCursor(a.Cursor(), b.Cursor()) })
	var next policy.AuditCursor
	if len(out) > limit {
		out = out[:limit]
		next = out[limit-1].Cursor()
	}
	return out, next, nil
}

// compareCursor orders cursors by time, then sequence number.
func compareCursor(a, b policy.AuditCursor) int {
	if c := a.Time.Compare(b.Time); c != 0 {
		return c
	}
	switch {
	case a.Seq < b.Seq:
		return -1
	case a.Seq > b.Seq:
		return 1
	}
	return 0
}

// encodeAudit encodes a record without its key: version 1, event,
// verdict, stop reason, disposition (a byte each), attempt (uvarint), delay
// in nanoseconds (varint), then tenant, target, call id, run id,
// classification and detail, each a uvarint length and its bytes.
func encodeAudit(rec *policy.AuditRecord) []byte {
	return appendAuditBody(make([]byte, 0, auditBodyLen(rec)), rec)
}

// appendAuditBody appends rec encoded as encodeAudit does to b.
func appendAuditBody(b []byte, rec *policy.AuditRecord) []byte {
	b = append(b, auditVersion, byte(rec.Event), byte(rec.Verdict), byte(rec.Stop), byte(rec.Disposition))
	b = binary.AppendUvarint(b, uint64(rec.Attempt))
	b = binary.AppendVarint(b, int64(rec.Delay))
	// Unrolled: a loop over an array of the six strings costs a group
	// commit a third more.
	b = appendAuditString(b, rec.Tenant)
	b = appendAuditString(b, rec.Target)
	b = appendAuditString(b, rec.CallID)
	b = appendAuditString(b, rec.RunID)
	b = appendAuditString(b, rec.Classification)
	return appendAuditString(b, rec.Detail)
}

// appendAuditString appends s's length as a uvarint and s.
func appendAuditString(b []byte, s string) []byte {
	if len(s) < 0x80 {
		b = append(b, byte(len(s)))
	} else {
		b = binary.AppendUvarint(b, uint64(len(s)))
	}
	return append(b, s...)
}

// auditBodyLen is the length of rec encoded by encodeAudit.
func auditBodyLen(rec *policy.AuditRecord) int {
	return 5 + uvarintLen(uint64(rec.Attempt)) + uvarintLen(zigzag(uint64(rec.Delay))) +
		uvarintLen(uint64(len(rec.Tenant))) + len(rec.Tenant) + uvarintLen(uint64(len(rec.Target))) + len(rec.Target) +
		uvarintLen(uint64(len(rec.CallID))) + len(rec.CallID) + uvarintLen(uint64(len(rec.RunID))) + len(rec.RunID) +
		uvarintLen(uint64(len(rec.Classification))) + len(rec.Classification) +
		uvarintLen(uint64(len(rec.Detail))) + len(rec.Detail)
}

// decodeAudit decodes a record written by encodeAudit under key k,
// copying every byte it keeps.
func decodeAudit(k, v []byte) (policy.AuditRecord, error) {
	var rec policy.AuditRecord
	if len(k) != auditKeyLen {
		return rec, fmt.Errorf("key is %d bytes, want %d", len(k), auditKeyLen)
	}
	rec.Time = time.Unix(0, int64(binary.BigEndian.Uint64(k)))
	rec.Seq = binary.BigEndian.Uint64(k[8:])
	if len(v) < 5 || v[0] != auditVersion {
		return rec, errors.New("not an audit record of version 1")
	}
	rec.Event, rec.Verdict = policy.AuditEvent(v[1]), policy.Verdict(v[2])
	rec.Stop, rec.Disposition = policy.StopReason(v[3]), policy.Disposition(v[4])
	v = v[5:]
	attempt, n := binary.Uvarint(v)
	if n <= 0 || attempt > math.MaxUint32 {
		return rec, errors.New("bad attempt")
	}
	rec.Attempt = uint32(attempt)
	v = v[n:]
	delay, n := binary.Varint(v)
	if n <= 0 {
		return rec, errors.New("bad delay")
	}
	rec.Delay = time.Duration(delay)
	v = v[n:]
	for _, dst := range [...]*string{&rec.Tenant, &rec.Target, &rec.CallID, &rec.RunID, &rec.Classification, &rec.Detail} {
		l, n := binary.Uvarint(v)
		if n <= 0 || l > uint64(len(v)-n) {
			return rec, errors.New("truncated string")
		}
		*dst = string(v[n : n+int(l)])
		v = v[n+int(l):]
	}
	if len(v) != 0 {
		return rec, fmt.Errorf("%d trailing bytes", len(v))
	}
	return rec, nil
}
