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

// appendAudit is AppendAudit; with SyncAlways the records join p, when set,
// instead of being committed on their own.
func (s *Store) appendAudit(p *pending, recs []policy.AuditRecord) {
	if s.closed.Load() || len(recs) == 0 {
		return
	}
	keep := make([]policy.AuditRecord, 0, len(recs)) // never the caller's array
	for _, rec := range recs {
		if err := checkAuditNames(&rec); err != nil {
			s.auditDropped.Add(1)
			s.log.Warn("breakerstore: audit record dropped", "err", err)
			continue
		}
		keep = append(keep, rec)
	}
	s.auditMu.Lock()
	for i := range keep {
		s.stampAudit(&keep[i])
	}
	if s.opts.Sync == SyncAlways {
		s.auditMu.Unlock()
		if p != nil {
			p.audit = append(p.audit, keep...)
			return
		}
		s.commitAudit(keep)
		return
	}
	room := max(s.opts.AuditBuffer-len(s.auditBuf), 0)
	if len(keep) > room {
		s.auditDropped.Add(uint64(len(keep) - room))
		keep = keep[:room]
	}
	s.auditBuf = append(s.auditBuf, keep...)
	s.auditMu.Unlock()
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

// stampAudit sets rec's time (when zero) and sequence number; s.auditMu
// must be held.
func (s *Store) stampAudit(rec *policy.AuditRecord) {
	var ns int64
	if rec.Time.IsZero() {
		ns = max(s.now(), s.auditLast)
		s.auditLast = ns
	} else {
		ns = max(rec.Time.UnixNano(), 0)
	}
	rec.Time = time.Unix(0, ns)
	s.auditSeq++
	rec.Seq = s.auditSeq
}

// commitAudit writes recs in one SyncAlways batch. On failure the records
// go to the buffer for the flusher (or are dropped when it is full).
func (s *Store) commitAudit(recs []policy.AuditRecord) {
	if len(recs) == 0 {
		return
	}
	err := s.db.Batch(func(tx *bbolt.Tx) error {
		if err := s.roomLeft(counterPages); err != nil {
			return err
		}
		s.noteBatchTx(tx)
		return writeAudit(tx, recs)
	})
	s.auditSynced(recs, err)
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
func (s *Store) flushAudit(tx *bbolt.Tx, recs []policy.AuditRecord, now int64, count int) (deleted int, oldest int64, err error) {
	if err := writeAudit(tx, recs); err != nil {
		return 0, 0, err
	}
	main := tx.Bucket(bucketAudit)
	cutoff := now - int64(s.opts.AuditRetention)
	excess := count + len(recs) - s.opts.AuditMaxRecords
	type victim struct {
		key            []byte
		tenant, callID string
	}
	var victims []victim
	c := main.Cursor()
	for k, v := c.First(); k != nil && len(victims) < auditSweepBatch; k, v = c.Next() {
		if len(k) == auditKeyLen && int64(binary.BigEndian.Uint64(k)) >= cutoff && len(victims) >= excess {
			break
		}
		vi := victim{key: bytes.Clone(k)}
		if rec, err := decodeAudit(k, v); err == nil {
			vi.tenant, vi.callID = rec.Tenant, rec.CallID
		} else {
			s.log.Error("breakerstore: undecodable audit record removed", "err", corrupt(bucketAudit, k, err))
		}
		victims = append(victims, vi)
	}
	calls, tenants := tx.Bucket(bucketAuditCall), tx.Bucket(bucketAuditTenant)
	for _, vi := range victims {
		if err := main.Delete(vi.key); err != nil {
			return 0, 0, err
		}
		if vi.callID != "" {
			if err := calls.Delete(indexKey(vi.callID, vi.key)); err != nil {
				return 0, 0, err
			}
		}
		if vi.tenant != "" {
			if err := tenants.Delete(indexKey(vi.tenant, vi.key)); err != nil {
				return 0, 0, err
			}
		}
	}
	first, _ := main.Cursor().First()
	if len(first) == auditKeyLen {
		oldest = int64(binary.BigEndian.Uint64(first))
	}
	return len(victims), oldest, nil
}

// writeAudit puts recs, their index entries and the highest sequence number
// in tx. It is idempotent, as bbolt's Batch requires.
func writeAudit(tx *bbolt.Tx, recs []policy.AuditRecord) error {
	if len(recs) == 0 {
		return nil
	}
	main, calls, tenants := tx.Bucket(bucketAudit), tx.Bucket(bucketAuditCall), tx.Bucket(bucketAuditTenant)
	var top uint64
	byCall := make([][]byte, 0, len(recs))
	byTenant := make([][]byte, 0, len(recs))
	for i := range recs {
		rec := &recs[i]
		k := auditKey(rec.Time.UnixNano(), rec.Seq)
		if err := main.Put(k, encodeAudit(rec)); err != nil {
			return err
		}
		if rec.CallID != "" {
			byCall = append(byCall, indexKey(rec.CallID, k))
		}
		if rec.Tenant != "" {
			byTenant = append(byTenant, indexKey(rec.Tenant, k))
		}
		top = max(top, rec.Seq)
	}
	// The index entries go in key order. bbolt keeps a transaction's
	// inserts in one in-memory node per leaf until the commit splits it, so
	// entries put in record order (their keys scattered across the index)
	// shift that ever-growing node on every put: quadratic in the records
	// of one group commit. In key order each put lands after the last.
	for _, idx := range [...]struct {
		b    *bbolt.Bucket
		keys [][]byte
	}{{calls, byCall}, {tenants, byTenant}} {
		slices.SortFunc(idx.keys, bytes.Compare)
		for _, k := range idx.keys {
			if err := idx.b.Put(k, []byte{}); err != nil {
				return err
			}
		}
	}
	meta := tx.Bucket(bucketMeta)
	if v := meta.Get(keyAuditSeq); len(v) == 8 && binary.BigEndian.Uint64(v) >= top {
		return nil
	}
	return meta.Put(keyAuditSeq, binary.BigEndian.AppendUint64(nil, top))
}

// loadAudit reads the trail's size, oldest time, last stamp and sequence
// number; records are read only by queries.
func (s *Store) loadAudit(tx *bbolt.Tx) error {
	main := tx.Bucket(bucketAudit)
	s.auditCount = main.Stats().KeyN
	c := main.Cursor()
	if k, _ := c.First(); k != nil {
		if len(k) != auditKeyLen {
			return corrupt(bucketAudit, k, errors.New("key is not time and sequence number"))
		}
		s.auditOldest = int64(binary.BigEndian.Uint64(k))
	}
	if k, _ := c.Last(); k != nil {
		if len(k) != auditKeyLen {
			return corrupt(bucketAudit, k, errors.New("key is not time and sequence number"))
		}
		s.auditLast = int64(binary.BigEndian.Uint64(k))
		s.auditSeq = binary.BigEndian.Uint64(k[8:])
	}
	if v := tx.Bucket(bucketMeta).Get(keyAuditSeq); v != nil {
		if len(v) != 8 {
			return corrupt(bucketMeta, keyAuditSeq, fmt.Errorf("%d bytes, want 8", len(v)))
		}
		s.auditSeq = max(s.auditSeq, binary.BigEndian.Uint64(v))
	}
	return nil
}

// checkAudit decodes every audit record and checks that every index entry
// points at one; Check uses it.
func checkAudit(tx *bbolt.Tx) error {
	main := tx.Bucket(bucketAudit)
	err := main.ForEach(func(k, v []byte) error {
		if _, err := decodeAudit(k, v); err != nil {
			return corrupt(bucketAudit, k, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, name := range [][]byte{bucketAuditCall, bucketAuditTenant} {
		err := tx.Bucket(name).ForEach(func(k, _ []byte) error {
			if len(k) < auditKeyLen+1 || k[len(k)-auditKeyLen-1] != 0 {
				return corrupt(name, k, errors.New("key is not name 0x00 time sequence"))
			}
			if main.Get(k[len(k)-auditKeyLen:]) == nil {
				return corrupt(name, k, errors.New("index entry without a record"))
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// QueryAudit returns the audit records that q selects, in the trail's order
// (time, then sequence number), and the cursor to pass as q.After for the
// next page, zero when there is none. Records still waiting for a group
// commit are included, so a query sees every record appended before it.
// q.Limit defaults to DefaultAuditPage and is capped at MaxAuditPage.
// A query by call id reads the by-call index (filtering by tenant when both
// are set), a query by tenant the by-tenant index; a query with neither
// reads the whole trail by time. It is safe for concurrent use.
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
	var after []byte
	if !q.After.IsZero() {
		after = auditKey(q.After.Time.UnixNano(), q.After.Seq)
	}
	match := func(rec *policy.AuditRecord, k []byte) bool {
		ns := rec.Time.UnixNano()
		return (q.CallID == "" || rec.CallID == q.CallID) && (q.Tenant == "" || rec.Tenant == q.Tenant) &&
			ns >= startNs && ns < endNs && (after == nil || bytes.Compare(k, after) > 0)
	}

	// Holding flushMu while the read transaction starts means every record
	// is either in the buffer copy or in the transaction's snapshot.
	s.flushMu.Lock()
	var out []policy.AuditRecord
	s.auditMu.Lock()
	for i := range s.auditBuf {
		rec := &s.auditBuf[i]
		if match(rec, auditKey(rec.Time.UnixNano(), rec.Seq)) {
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

	main := tx.Bucket(bucketAudit)
	name, prefix := bucketAudit, []byte(nil)
	switch {
	case q.CallID != "":
		name, prefix = bucketAuditCall, append([]byte(q.CallID), 0)
	case q.Tenant != "":
		name, prefix = bucketAuditTenant, append([]byte(q.Tenant), 0)
	}
	b := tx.Bucket(name)
	seek := append(bytes.Clone(prefix), auditKey(startNs, 0)...)
	if after != nil && bytes.Compare(after, seek[len(prefix):]) > 0 {
		seek = append(bytes.Clone(prefix), after...)
	}
	c := b.Cursor()
	fromDisk := 0
	for k, v := c.Seek(seek); k != nil && bytes.HasPrefix(k, prefix) && fromDisk <= limit; k, v = c.Next() {
		rk := k[len(prefix):]
		if len(rk) != auditKeyLen {
			return nil, policy.AuditCursor{}, corrupt(name, k, errors.New("key does not end in time and sequence number"))
		}
		if int64(binary.BigEndian.Uint64(rk)) >= endNs {
			break
		}
		if prefix != nil {
			if v = main.Get(rk); v == nil {
				continue // the sweep removes records and their index entries together
			}
		}
		rec, err := decodeAudit(rk, v)
		if err != nil {
			return nil, policy.AuditCursor{}, corrupt(bucketAudit, rk, err)
		}
		if match(&rec, rk) {
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

// auditKey is a record's key: Unix nanoseconds and sequence number,
// big-endian.
func auditKey(ns int64, seq uint64) []byte {
	k := make([]byte, 0, auditKeyLen)
	k = binary.BigEndian.AppendUint64(k, uint64(max(ns, 0)))
	return binary.BigEndian.AppendUint64(k, seq)
}

// indexKey is an index entry's key: name 0x00 record key.
func indexKey(name string, rk []byte) []byte {
	k := make([]byte, 0, len(name)+1+len(rk))
	k = append(k, name...)
	k = append(k, 0)
	return append(k, rk...)
}

// encodeAudit encodes a record without its key: version 1, event,
// verdict, stop reason, disposition (a byte each), attempt (uvarint), delay
// in nanoseconds (varint), then tenant, target, call id, run id,
// classification and detail, each a uvarint length and its bytes.
func encodeAudit(rec *policy.AuditRecord) []byte {
	strs := [...]string{rec.Tenant, rec.Target, rec.CallID, rec.RunID, rec.Classification, rec.Detail}
	n := 5 + 2*binary.MaxVarintLen64
	for _, s := range strs {
		n += binary.MaxVarintLen64 + len(s)
	}
	b := make([]byte, 0, n)
	b = append(b, auditVersion, byte(rec.Event), byte(rec.Verdict), byte(rec.Stop), byte(rec.Disposition))
	b = binary.AppendUvarint(b, uint64(rec.Attempt))
	b = binary.AppendVarint(b, int64(rec.Delay))
	for _, s := range strs {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
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
