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

	"github.com/policyd/policyd/breakerstore/internal/auditseg"
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
)

// AppendAudit adds recs, in order, to the audit trail. It stamps each
// record's Time with the store's clock when it is zero (never earlier than
// the previous stamp, so the trail's order is the order of appends) and its
// Seq always.
//
// AppendAudit never blocks a decision on the disk in the default SyncGroup
// mode: the records wait in a bounded in-memory buffer for the flusher's
// next group commit (one starts at once when the buffer is half full),
// and when the buffer is full (Options.AuditBuffer) a record is dropped
// and counted in Stats.AuditDropped, and the flusher logs the drops. With SyncAlways the records are committed in one call of
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
	s.trail.mu.Lock()
	dst, room := s.trail.buf, max(s.opts.AuditBuffer-len(s.trail.buf), 0)
	if s.opts.Sync == SyncAlways {
		dst, room = make([]policy.AuditRecord, 0, n), n // never the caller's array
	}
	start := len(dst)
	for _, g := range groups {
		for i := range g {
			if err := checkAuditNames(&g[i]); err != nil {
				s.trail.dropped.Add(1)
				unindexable = err
				continue
			}
			if len(dst)-start == room {
				s.trail.dropped.Add(1)
				continue
			}
			dst = append(dst, g[i])
			s.stampAudit(&dst[len(dst)-1], now)
		}
	}
	half := false
	if s.opts.Sync != SyncAlways {
		s.trail.buf = dst
		half = len(dst) >= max(s.opts.AuditBuffer/2, minEarlyCommit)
	}
	s.trail.mu.Unlock()
	if half {
		// Half full: a group commit now, so a load that fills the buffer
		// within an interval is written rather than dropped.
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
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

// minEarlyCommit is the fewest buffered records that start a group commit
// before its interval: fewer are not worth an fsync of their own, and a
// buffer that small (a test's) just drops past it.
const minEarlyCommit = 64

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
// s.trail.mu must be held.
func (s *Store) stampAudit(rec *policy.AuditRecord, now int64) {
	var ns int64
	if rec.Time.IsZero() {
		ns = max(now, s.trail.last)
		s.trail.last = ns
	} else {
		ns = max(rec.Time.UnixNano(), 0)
	}
	rec.Time = time.Unix(0, ns)
	s.trail.seq++
	rec.Seq = s.trail.seq
}

// auditSynced updates the in-memory view of the trail after a SyncAlways
// commit of recs; when it failed (err), the records wait in the buffer for
// the flusher, or are dropped when it is full.
func (s *Store) auditSynced(recs []policy.AuditRecord, err error) {
	s.trail.mu.Lock()
	defer s.trail.mu.Unlock()
	if err != nil {
		s.log.Error("breakerstore: audit records not committed; retrying in the next flush",
			"err", s.writeErr("commit audit", err), "records", len(recs))
		room := max(s.opts.AuditBuffer-len(s.trail.buf), 0)
		if len(recs) > room {
			s.trail.dropped.Add(uint64(len(recs) - room))
			recs = recs[:room]
		}
		s.trail.buf = append(s.trail.buf, recs...)
		return
	}
	s.stats.syncMutations.Add(1)
	s.stats.records.Add(uint64(len(recs)))
	for _, rec := range recs {
		if ns := rec.Time.UnixNano(); s.trail.count == 0 || ns < s.trail.oldest {
			s.trail.oldest = ns
		}
		s.trail.count++
	}
}

// takeAudit empties the buffer for a group commit.
func (s *Store) takeAudit() []policy.AuditRecord {
	s.trail.mu.Lock()
	defer s.trail.mu.Unlock()
	recs := s.trail.buf
	// The next interval likely appends as many: size for it at once rather
	// than growing (and copying) the buffer from nothing again, and reuse
	// the buffer the last group commit wrote (recycleAudit) rather than
	// allocating (and zeroing, and collecting) megabytes at every flush.
	want := min(cap(recs), s.opts.AuditBuffer)
	next := s.trail.spare
	s.trail.spare = nil
	if cap(next) < want {
		next = make([]policy.AuditRecord, 0, want)
	}
	s.trail.buf = next[:0]
	return recs
}

// recycleAudit keeps recs, a buffer takeAudit gave that its group commit
// has written, for the next takeAudit. Its records are overwritten as the
// buffer fills again (until then they pin their strings, at most one
// buffer's worth).
func (s *Store) recycleAudit(recs []policy.AuditRecord) {
	s.trail.mu.Lock()
	if cap(recs) > cap(s.trail.spare) {
		s.trail.spare = recs[:0]
	}
	s.trail.mu.Unlock()
}

// requeueAudit puts records of a failed group commit back in front of the
// buffer, dropping what no longer fits.
func (s *Store) requeueAudit(recs []policy.AuditRecord) {
	if len(recs) == 0 {
		return
	}
	s.trail.mu.Lock()
	defer s.trail.mu.Unlock()
	merged := append(recs, s.trail.buf...)
	if over := len(merged) - s.opts.AuditBuffer; over > 0 {
		merged = merged[:s.opts.AuditBuffer]
		s.trail.dropped.Add(uint64(over))
	}
	s.trail.buf = merged
}

// auditSweepDue reports whether records on disk are past the retention age
// or the record cap, so the flusher must delete some.
func (s *Store) auditSweepDue(now int64) bool {
	s.trail.mu.Lock()
	defer s.trail.mu.Unlock()
	if s.trail.count == 0 {
		return false
	}
	return s.trail.count > s.opts.AuditMaxRecords || s.trail.oldest < now-int64(s.opts.AuditRetention)
}

// auditCommitted updates the in-memory view of the disk after a group
// commit that wrote n records, deleted del and left oldest first.
func (s *Store) auditCommitted(n, del int, oldest int64) {
	s.trail.mu.Lock()
	s.trail.count = max(s.trail.count+n-del, 0)
	s.trail.oldest = oldest
	s.trail.mu.Unlock()
	s.trail.deleted.Add(uint64(del))
}

// logAuditDrops logs the records dropped since the last call; s.group.flushMu
// must be held.
func (s *Store) logAuditDrops() {
	if d := s.trail.dropped.Load(); d != s.trail.dropLogged {
		s.log.Warn("breakerstore: audit records dropped (buffer full or unindexable)",
			"dropped", d-s.trail.dropLogged, "total", d, "buffer", s.opts.AuditBuffer)
		s.trail.dropLogged = d
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
	if err := s.writeAudit(tx, recs); err != nil {
		return 0, 0, err
	}
	b := tx.Bucket(bucketAuditSeg)
	cutoff := now - int64(s.opts.AuditRetention)
	excess := count + len(recs) - s.opts.AuditMaxRecords
	var gone [][]byte // segments to delete
	var restKey, restValue []byte
	var w auditseg.Encoder
	c := b.Cursor()
	for k, v := c.First(); k != nil && deleted < auditSweepBatch; k, v = c.Next() {
		need := excess - deleted // records still beyond the cap
		if len(k) == auditseg.KeyLen && int64(binary.BigEndian.Uint64(k)) >= cutoff && need <= 0 {
			break
		}
		h, err := auditseg.ParseHeader(v)
		if err == nil && len(k) != auditseg.KeyLen {
			err = errors.New("key is not time and sequence number")
		}
		if err != nil {
			s.log.Error("breakerstore: undecodable audit segment removed", "err", corrupt(bucketAuditSeg, k, err))
			gone = append(gone, bytes.Clone(k))
			continue
		}
		room := auditSweepBatch - deleted
		if (int64(h.Last.NS) < cutoff || need >= h.Count) && h.Count <= room {
			gone = append(gone, bytes.Clone(k))
			deleted += h.Count
			continue
		}
		_, ents, err := auditseg.Entries(k, v)
		if err != nil {
			s.log.Error("breakerstore: undecodable audit segment removed", "err", corrupt(bucketAuditSeg, k, err))
			gone = append(gone, bytes.Clone(k))
			deleted += h.Count
			continue
		}
		m := max(need, 0)
		for m < len(ents) && int64(ents[m].Key.NS) < cutoff {
			m++
		}
		if m = min(m, room, len(ents)); m > 0 {
			gone = append(gone, bytes.Clone(k))
			deleted += m
			if rest := ents[m:]; len(rest) > 0 {
				restKey, restValue = rest[0].Key.Bytes(), w.Encode(rest)
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
	if len(first) == auditseg.KeyLen {
		oldest = int64(binary.BigEndian.Uint64(first))
	}
	return deleted, oldest, nil
}

// writeAudit hands recs to the audit sink (sink.go), then writes them as
// segments, and the highest sequence number, in tx. It is idempotent, as
// bbolt's Batch requires: run again on the same state it writes the same
// keys and values (and the sink skips what it has).
func (s *Store) writeAudit(tx *bbolt.Tx, recs []policy.AuditRecord) error {
	if len(recs) == 0 {
		return nil
	}
	if err := s.sinkAudit(recs); err != nil {
		return err
	}
	var w auditseg.Encoder
	if err := insertSegments(&w, tx.Bucket(bucketAuditSeg), auditseg.FromRecords(recs)); err != nil {
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

// loadAudit reads the trail's size, oldest time, last stamp and sequence
// number from the segments' keys and headers; records are read only by
// queries.
func (s *Store) loadAudit(tx *bbolt.Tx) error {
	s.trail.count = 0
	if b := tx.Bucket(bucketAuditSeg); b != nil {
		var last auditseg.Key
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != auditseg.KeyLen {
				return corrupt(bucketAuditSeg, k, errors.New("key is not time and sequence number"))
			}
			h, err := auditseg.ParseHeader(v)
			if err != nil {
				return corrupt(bucketAuditSeg, k, err)
			}
			if s.trail.count == 0 {
				s.trail.oldest = int64(binary.BigEndian.Uint64(k))
			}
			s.trail.count += h.Count
			last = h.Last
		}
		if s.trail.count > 0 {
			s.trail.last, s.trail.seq = int64(last.NS), last.Seq
		}
	}
	if v := tx.Bucket(bucketMeta).Get(keyAuditSeq); v != nil {
		if len(v) != 8 {
			return corrupt(bucketMeta, keyAuditSeq, fmt.Errorf("%d bytes, want 8", len(v)))
		}
		s.trail.seq = max(s.trail.seq, binary.BigEndian.Uint64(v))
	}
	return nil
}

// checkAudit decodes every audit segment and checks it in full (see
// auditseg.Check), and that the segments are in order and do not overlap;
// Check uses it. The records of a file of the previous layout, which Open
// moves into segments, are decoded too.
func checkAudit(tx *bbolt.Tx) error {
	if b := tx.Bucket(bucketAuditSeg); b != nil {
		var prev *auditseg.Key
		err := b.ForEach(func(k, v []byte) error {
			last, err := auditseg.Check(k, v, prev)
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
			if _, err := auditseg.DecodeRecord(k, v); err != nil {
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
	after := auditseg.Key{NS: uint64(max(q.After.Time.UnixNano(), 0)), Seq: q.After.Seq}
	// inRange reports whether a record of key k is in [Start, End) and
	// after q.After.
	inRange := func(k auditseg.Key) bool {
		ns := int64(k.NS)
		return ns >= startNs && ns < endNs && (!hasAfter || k.Compare(after) > 0)
	}

	// Holding group.flushMu while the read transaction starts means every record
	// is either in the buffer copy or in the transaction's snapshot.
	s.group.flushMu.Lock()
	var out []policy.AuditRecord
	s.trail.mu.Lock()
	for i := range s.trail.buf {
		rec := &s.trail.buf[i]
		if (q.CallID == "" || rec.CallID == q.CallID) && (q.Tenant == "" || rec.Tenant == q.Tenant) &&
			inRange(auditseg.Key{NS: uint64(max(rec.Time.UnixNano(), 0)), Seq: rec.Seq}) {
			out = append(out, *rec)
		}
	}
	s.trail.mu.Unlock()
	tx, err := s.db.Begin(false)
	s.group.flushMu.Unlock()
	if err != nil {
		return nil, policy.AuditCursor{}, storageErr("query audit", err)
	}
	defer func() { _ = tx.Rollback() }()

	seek := auditseg.Key{NS: uint64(startNs)}
	if hasAfter && after.Compare(seek) > 0 {
		seek = after
	}
	c := tx.Bucket(bucketAuditSeg).Cursor()
	fromDisk := 0
segments:
	for k, v := segAt(c, seek.Bytes()); k != nil && fromDisk <= limit; k, v = c.Next() {
		if len(k) != auditseg.KeyLen {
			return nil, policy.AuditCursor{}, corrupt(bucketAuditSeg, k, errors.New("key is not time and sequence number"))
		}
		if int64(binary.BigEndian.Uint64(k)) >= endNs {
			break
		}
		h, err := auditseg.ParseHeader(v)
		if err != nil {
			return nil, policy.AuditCursor{}, corrupt(bucketAuditSeg, k, err)
		}
		if h.Last.Compare(seek) < 0 ||
			q.CallID != "" && !h.MayHold('c', q.CallID) || q.Tenant != "" && !h.MayHold('t', q.Tenant) {
			continue
		}
		r := auditseg.NewReader(auditseg.KeyOf(k), &h)
		for fromDisk <= limit {
			e, ok, err := r.Next()
			if err != nil {
				return nil, policy.AuditCursor{}, corrupt(bucketAuditSeg, k, err)
			}
			if !ok {
				break
			}
			if int64(e.Key.NS) >= endNs {
				break segments
			}
			if !inRange(e.Key) {
				continue
			}
			tenant, callID, ok := auditseg.Names(e.Body)
			if !ok {
				return nil, policy.AuditCursor{}, corrupt(bucketAuditSeg, k, errors.New("undecodable record"))
			}
			if q.CallID != "" && string(callID) != q.CallID || q.Tenant != "" && string(tenant) != q.Tenant {
				continue
			}
			rec, err := auditseg.DecodeRecord(e.Key.Bytes(), e.Body)
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
