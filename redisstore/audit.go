package redisstore

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/policy"
)

// Audit page sizes, as breakerstore's.
const (
	DefaultAuditPage = 100
	MaxAuditPage     = 10_000
)

// Keys of a tenant's audit trail beside its stream (keyAudit), under its
// tag: the stream's count of records and head (policyd.lua's audit keeps
// them), and the chunk ids it added lately.
func keyAuditMeta(tenant string) string   { return tag(tenant) + ":auditmeta" }
func keyAuditChunks(tenant string) string { return tag(tenant) + ":auditchunks" }

// auditBuffer holds the records appended since the last flush, and the
// chunks of records a flush packed and could not write.
type auditBuffer struct {
	mu      sync.Mutex
	recs    []policy.AuditRecord
	spare   []policy.AuditRecord // the slice recs was before the last flush took it, for the next
	back    []auditChunk         // chunks a commit could not write (Changes.Commit), before recs
	waiting int                  // records in back and pending
	dropped uint64               // records dropped because the buffer was full, since the last flush logged them
	// droppedTotal and buffered are dropped's sum since the start and
	// the records waiting (recs and waiting), for the metrics.
	droppedTotal atomic.Uint64
	buffered     atomic.Int64

	// flushMu makes flushes one at a time, so they write in order; it
	// guards the fields below.
	flushMu sync.Mutex
	pending []auditChunk // chunks not written: sent again as they are, first, at the next flush
	queue   []auditChunk // the chunks of one flush
	packer  auditPacker
}

// auditChunk is one call of policyd_audit: a chunk of one tenant's
// records, packed as an entry's field "b" (appendAuditChunk), or that
// compressed, as field "z" (auditPacker.compress).
type auditChunk struct {
	tenant string
	id     string // drawn by the replica: the library adds a chunk id once
	n      int    // the records in body
	field  string // the entry's field body goes in: auditChunkField or auditZChunkField
	body   []byte
	owned  bool // body is the chunk's own, not the packer's buffer
}

// own returns c with a body of its own, to outlive the packer's buffer.
func (c auditChunk) own() auditChunk {
	if !c.owned {
		c.body, c.owned = slices.Clone(c.body), true
	}
	return c
}

// The bounds of the audit writes: a chunk holds at most maxAuditChunk
// records and, but for a record larger alone, auditChunkBytes packed; a
// round trip carries at most auditCallsPerTrip chunks and, but for one
// chunk alone, auditTripBytes, so Redis runs it in a few milliseconds
// and it ends well within the store's timeout under load (with
// appendfsync always a round trip also waits for the AOF's fsync: in
// policybench's report phase 512 KiB ones timed out 8 to 40 times in 6 s,
// 128 KiB ones 1 to 3 times, writing as many records); the flusher's flush
// sends at most auditTripsPerFlush round trips (4 MiB: at about 35 bytes
// a record, over a million records a second a replica at the default
// interval, more than one Redis takes with appendfsync always), so it
// never holds up the held outcomes' flush behind it for long; the rest
// waits for the next one.
const (
	auditChunkBytes    = 128 << 10
	auditTripBytes     = 128 << 10
	auditCallsPerTrip  = 32
	auditTripsPerFlush = 32
)

// auditPacker packs records into chunks, reusing its buffers from one
// pack to the next. It belongs to one goroutine at a time.
type auditPacker struct {
	group  map[string]int // tenant -> its index in open
	open   []int          // per tenant: its chunk being filled, an index in chunks
	chunks []auditChunk
	lens   []int   // per chunk: its body's length
	last   []int32 // per chunk: its last record so far, an index in recs
	ends   []int   // per chunk: where its next record goes in buf
	of     []int32 // per record: its chunk
	sizes  []int32 // per record: its packed length
	buf    []byte  // every chunk's body, one after another
	zbuf   []byte  // the compressed bodies, one after another
}

// pack returns recs as chunks: each of one tenant, its records in their
// order, a tenant's chunks in the order of their records, each with a
// fresh id, compressed where that makes it smaller (compress); their
// bodies are the packer's until the next pack.
func (w *auditPacker) pack(recs []policy.AuditRecord) []auditChunk {
	return w.compress(w.packRaw(recs))
}

// The smallest body compress compresses: below it the few bytes saved
// are not worth a call (a decision's commit writes one or two records).
const auditCompressMin = 256

// compress replaces the body of each chunk of at least auditCompressMin
// bytes by its S2 block (field "z") when that is smaller, into w's
// buffer. Why S2 (klauspost/compress) and not zstd: on the report
// phase's chunks (about 13 KB of 270 records) S2 packs 4.3x in 9 µs and
// zstd's fastest level 6.4x in 45 µs; the replica pays the compressing
// on the decision path's cores, Redis saves in proportion to the bytes
// (its AOF writes and fsyncs, its memory, each AOF rewrite), and the
// first 4x of the bytes is most of what there is to save.
func (w *auditPacker) compress(chunks []auditChunk) []auditChunk {
	total := 0
	for i := range chunks {
		chunks[i].field = auditChunkField
		if len(chunks[i].body) >= auditCompressMin {
			total += s2.MaxEncodedLen(len(chunks[i].body))
		}
	}
	if total == 0 {
		return chunks
	}
	w.zbuf = slices.Grow(w.zbuf[:0], total)[:total]
	off := 0
	for i := range chunks {
		c := &chunks[i]
		if len(c.body) < auditCompressMin {
			continue
		}
		end := off + s2.MaxEncodedLen(len(c.body))
		if z := s2.Encode(w.zbuf[off:end], c.body); len(z) < len(c.body) {
			c.body, c.field = z[:len(z):len(z)], auditZChunkField
		}
		off = end
	}
	return chunks
}

// packRaw is pack without compress: every body as appendAuditChunk packs
// it, all of them in w.buf.
func (w *auditPacker) packRaw(recs []policy.AuditRecord) []auditChunk {
	if w.group == nil {
		w.group = map[string]int{}
	}
	clear(w.group)
	w.open, w.chunks, w.lens, w.last = w.open[:0], w.chunks[:0], w.lens[:0], w.last[:0]
	w.of, w.sizes = w.of[:0], w.sizes[:0]
	for i := range recs {
		r := &recs[i]
		g, ok := w.group[r.Tenant]
		if !ok {
			g = len(w.open)
			w.group[r.Tenant] = g
			w.open = append(w.open, -1)
		}
		c := w.open[g]
		size := 0
		if c >= 0 {
			size = auditRecordSize(r, &recs[w.last[c]])
		}
		if c < 0 || w.chunks[c].n == maxAuditChunk ||
			w.lens[c]+uvarintLen(uint64(size))+size+uvarintLen(uint64(w.chunks[c].n+1)) > auditChunkBytes {
			c = len(w.chunks)
			w.open[g] = c
			w.chunks = append(w.chunks, auditChunk{tenant: r.Tenant, id: newPermitID().String()})
			w.lens = append(w.lens, 0)
			w.last = append(w.last, -1)
			size = auditRecordSize(r, nil)
		}
		w.chunks[c].n++
		w.lens[c] += uvarintLen(uint64(size)) + size
		w.last[c] = int32(i)
		w.of = append(w.of, int32(c))
		w.sizes = append(w.sizes, int32(size))
	}
	total := 0
	for c := range w.chunks {
		w.lens[c] += uvarintLen(uint64(w.chunks[c].n))
		total += w.lens[c]
	}
	w.buf = slices.Grow(w.buf[:0], total)[:total]
	w.ends = w.ends[:0]
	off := 0
	for c := range w.chunks {
		w.last[c] = -1
		end := off + w.lens[c]
		w.chunks[c].body = w.buf[off:end:end]
		w.ends = append(w.ends, off+binary.PutUvarint(w.buf[off:], uint64(w.chunks[c].n)))
		off = end
	}
	for i := range recs {
		c, size := w.of[i], int(w.sizes[i])
		at := w.ends[c]
		at += binary.PutUvarint(w.buf[at:], uint64(size))
		var prev *policy.AuditRecord
		if l := w.last[c]; l >= 0 {
			prev = &recs[l]
		}
		appendAuditRecord(w.buf[at:at:at+size], &recs[i], prev)
		w.ends[c], w.last[c] = at+size, int32(i)
	}
	return w.chunks
}

// AppendAudit adds records to the fleet's audit trail, stamping their time
// (when zero) with the replica's clock. It does not wait for Redis: the
// records are buffered and written by the flusher every FlushInterval,
// one policyd_audit call per tenant (per chunk of up to 1,024 records);
// past MaxAuditBuffer records not yet packed by a flush new ones are
// dropped, logged and counted. A query on this replica sees them at once,
// on another replica after the flush.
func (s *Store) AppendAudit(recs ...policy.AuditRecord) {
	if len(recs) == 0 || s.closed.Load() {
		return
	}
	b := &s.audit
	b.mu.Lock()
	defer b.mu.Unlock()
	s.addAudit(recs, s.opts.Clock())
}

// appendAuditOf is AppendAudit of the records of ups, in their order,
// under one hold of the buffer and without gathering them first.
func (s *Store) appendAuditOf(ups []policy.OutcomeUpdate) {
	if s.closed.Load() {
		return
	}
	b := &s.audit
	b.mu.Lock()
	defer b.mu.Unlock()
	now := s.opts.Clock()
	for i := range ups {
		s.addAudit(ups[i].Audit, now)
	}
}

// addAudit buffers recs, stamped with now where their time is zero, or
// counts them dropped past MaxAuditBuffer records not packed yet (a flush
// packs them every FlushInterval, written or not); s.audit.mu is held.
func (s *Store) addAudit(recs []policy.AuditRecord, now time.Time) {
	b := &s.audit
	for _, r := range recs {
		if len(b.recs) >= s.opts.MaxAuditBuffer {
			b.dropped++
			b.droppedTotal.Add(1)
			continue
		}
		if r.Time.IsZero() {
			r.Time = now
		}
		b.recs = append(b.recs, r)
	}
	b.buffered.Store(int64(len(b.recs) + b.waiting))
}

// AuditDropped returns the audit records this replica dropped since it
// started because its buffer was full (Options.MaxAuditBuffer): records
// appended faster than its flushes wrote them, or waiting while the
// engine did not answer.
func (s *Store) AuditDropped() uint64 { return s.audit.droppedTotal.Load() }

// AuditBuffered returns the audit records waiting for this replica's
// next flush.
func (s *Store) AuditBuffered() int { return int(s.audit.buffered.Load()) }

// requeueAudit gives chunks a commit could not write to the next flush,
// which sends them as they are (their ids: a chunk Redis did run adds
// nothing again).
func (s *Store) requeueAudit(chunks []auditChunk) {
	b := &s.audit
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range chunks {
		b.back = append(b.back, c.own())
		b.waiting += c.n
	}
	b.buffered.Store(int64(len(b.recs) + b.waiting))
}

// flushAudit writes the buffered records (writeAudit), at most
// auditTripsPerFlush round trips of them unless all is set (QueryAudit
// and Close write them all), each bounded by the store's timeout within
// ctx; one flush runs at a time. The chunks not written wait for the next
// flush and go first then, as they are: a chunk whose answer was lost
// after Redis ran it adds nothing the second time (its id). The chunks
// wait packed, a few bytes a record, so an outage of many flush
// intervals loses none; past MaxAuditWaitingBytes of them the oldest are
// dropped and counted.
func (s *Store) flushAudit(ctx context.Context, all bool) {
	b := &s.audit
	b.flushMu.Lock()
	defer b.flushMu.Unlock()
	b.mu.Lock()
	recs, back, dropped := b.recs, b.back, b.dropped
	b.recs, b.spare, b.back, b.dropped = b.spare[:0], nil, nil, 0
	b.mu.Unlock()
	if dropped > 0 {
		s.log.Warn("redisstore: audit records dropped: the buffer was full", "dropped", dropped)
	}
	if len(recs) == 0 && len(back) == 0 && len(b.pending) == 0 {
		b.mu.Lock()
		b.spare = recs
		b.mu.Unlock()
		return
	}
	b.queue = append(append(b.queue[:0], b.pending...), back...)
	b.queue = append(b.queue, b.packer.pack(recs)...)
	clear(b.pending) // the queue holds them
	b.mu.Lock()
	b.spare = recs[:0] // packed: the next flush's buffer
	b.mu.Unlock()
	trips := auditTripsPerFlush
	if all {
		trips = len(b.queue) // more than it takes
	}
	left, err := s.writeAudit(ctx, b.queue, trips, b.pending[:0])
	clear(b.queue) // the bodies' references
	waiting, bytes := 0, 0
	for _, c := range left {
		waiting, bytes = waiting+c.n, bytes+len(c.body)
	}
	if len(left) > 0 && err != nil && s.health.up() { // while down, the transition was logged
		s.log.Warn("redisstore: audit records not written; retrying", "records", waiting, "chunks", len(left), "err", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.back { // requeued during the flush
		waiting, bytes = waiting+c.n, bytes+len(c.body)
	}
	for len(left) > 0 && bytes > s.opts.MaxAuditWaitingBytes {
		waiting, bytes = waiting-left[0].n, bytes-len(left[0].body)
		b.dropped += uint64(left[0].n)
		b.droppedTotal.Add(uint64(left[0].n))
		left[0] = auditChunk{}
		left = left[1:]
	}
	b.pending, b.waiting = left, waiting
	b.buffered.Store(int64(len(b.recs) + b.waiting))
}

// writeAudit sends chunks, each one call of policyd_audit, in their
// order, at most auditCallsPerTrip and auditTripBytes a round trip (one
// pipeline; on a Cluster, one per master), each round trip bounded by the
// store's timeout, at most trips of them, until one fails. It appends the
// chunks not written (failed, or not sent), in their order and with
// bodies of their own, to left, and returns it with the error that
// stopped it.
func (s *Store) writeAudit(ctx context.Context, chunks []auditChunk, trips int, left []auditChunk) ([]auditChunk, error) {
	var err error
	i := 0
	for trip := 0; trip < trips && i < len(chunks) && err == nil; trip++ {
		j, size := i, 0
		for j < len(chunks) && j-i < auditCallsPerTrip && (j == i || size+len(chunks[j].body) <= auditTripBytes) {
			size += len(chunks[j].body)
			j++
		}
		batch := chunks[i:j]
		tctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
		var cmds []redis.Cmder
		cmds, err = s.c.Pipelined(tctx, func(p redis.Pipeliner) error {
			l := s.lib.on(p)
			for k := range batch {
				s.queueAudit(tctx, l, &batch[k])
			}
			return nil
		})
		cancel()
		for k := range batch {
			if k >= len(cmds) || cmds[k].Err() != nil {
				left = append(left, batch[k].own())
			}
		}
		i = j
	}
	for ; i < len(chunks); i++ {
		left = append(left, chunks[i].own())
	}
	return left, err
}

// queueAudit queues c's call of policyd_audit on l, which adds c as one
// entry of its tenant's stream (once per chunk id), then trims the stream
// to AuditMaxRecords records and by age to AuditRetention: the one writer
// of the trail (the flush and Changes.Commit call it).
func (s *Store) queueAudit(ctx context.Context, l lib, c *auditChunk) *redis.Cmd {
	field := c.field
	if field == "" {
		field = auditChunkField
	}
	return l.run(ctx, "policyd_audit", []string{keyAudit(c.tenant), keyAuditMeta(c.tenant), keyAuditChunks(c.tenant)},
		s.opts.AuditMaxRecords, s.opts.AuditRetention.Milliseconds(), c.id, c.n, c.body, field)
}

// appendAuditRecords appends the records of stream entry m to dst: a
// chunk (field "b", or "z" compressed: auditentry.go), one record packed
// in field "r", or, as written before that, one field an attribute.
func appendAuditRecords(dst []policy.AuditRecord, m redis.XMessage) ([]policy.AuditRecord, error) {
	seq, err := packID(m.ID)
	if err != nil {
		return dst, err
	}
	v, ok := m.Values[auditChunkField].(string)
	if z, zok := m.Values[auditZChunkField].(string); zok {
		if v, err = decompressAuditChunk(z); err != nil {
			return dst, fmt.Errorf("%w: entry %s", err, m.ID)
		}
		ok = true
	}
	if ok {
		c, _ := m.Values[auditCountField].(string)
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 || n > maxAuditChunk || seq&(1<<20-1)+uint64(n) > 1<<20 {
			return dst, fmt.Errorf("%w: entry %s holds %q records, want 1 to %d within its millisecond's sequence", errAuditEntry, m.ID, c, maxAuditChunk)
		}
		if dst, err = decodeAuditChunk(dst, v, n, seq); err != nil {
			return dst, fmt.Errorf("%w: entry %s", err, m.ID)
		}
		return dst, nil
	}
	if v, ok := m.Values[auditEntryField].(string); ok {
		r, err := decodeAuditEntry(v)
		if err != nil {
			return dst, fmt.Errorf("%w: entry %s", err, m.ID)
		}
		r.Seq = seq
		return append(dst, r), nil
	}
	return append(dst, decodeAuditFields(m, seq)), nil
}

// decodeAuditFields reads an entry of one field an attribute, as they
// were written before field "r".
func decodeAuditFields(m redis.XMessage, seq uint64) policy.AuditRecord {
	str := func(f string) string { v, _ := m.Values[f].(string); return v }
	num := func(f string) int64 { n, _ := strconv.ParseInt(str(f), 10, 64); return n }
	return policy.AuditRecord{Time: time.Unix(0, num("t")), Seq: seq, Event: policy.AuditEvent(num("ev")),
		Tenant: str("tenant"), Target: str("target"), CallID: str("call"), RunID: str("run"),
		Attempt: uint32(num("attempt")), Classification: str("class"), Verdict: policy.Verdict(num("verdict")),
		Delay: time.Duration(num("delay")), Stop: policy.StopReason(num("stop")),
		Disposition: policy.Disposition(num("disp")), Detail: str("detail"), PrimaryTarget: str("primary")}
}

// packID packs a stream id "ms-seq" into one number that sorts as ids
// do: ms<<20 | seq.
func packID(id string) (uint64, error) {
	ms, seq, ok := strings.Cut(id, "-")
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil || b >= 1<<20 {
		return 0, fmt.Errorf("redisstore: stream id %q", id)
	}
	return a<<20 | b, nil
}

// auditResumeID is the stream id to read from for the records after the
// one of Seq seq: the id of the entry that may hold it, which is at most
// maxAuditChunk-1 before it in its millisecond.
func auditResumeID(seq uint64) string {
	ms, n := seq>>20, seq&(1<<20-1)
	n -= min(n, maxAuditChunk-1)
	return strconv.FormatUint(ms, 10) + "-" + strconv.FormatUint(n, 10)
}

// QueryAudit returns the records q selects, from every replica, in the
// trail's order (the audit streams' order: entry id, then tenant; a
// query by call id gives the call's records of a page in the order they
// were made, whichever replica's flush landed first), and the cursor of
// the next page, zero at the end. Records of this replica not
// yet flushed are written first, so a query sees every record appended
// here before it; other replicas' records appear once they flush. Without
// q.Tenant it reads the streams of every tenant any replica has used.
func (s *Store) QueryAudit(q policy.AuditQuery) ([]policy.AuditRecord, policy.AuditCursor, error) {
	if err := s.check(); err != nil {
		return nil, policy.AuditCursor{}, err
	}
	if err := checkName("call_id", q.CallID, true); err != nil {
		return nil, policy.AuditCursor{}, err
	}
	if err := checkName("tenant", q.Tenant, true); err != nil {
		return nil, policy.AuditCursor{}, err
	}
	s.flushAudit(s.ctx, true)
	limit := q.Limit
	if limit <= 0 {
		limit = DefaultAuditPage
	}
	limit = min(limit, MaxAuditPage)
	start, after := "-", uint64(0)
	switch {
	case !q.After.IsZero():
		start, after = auditResumeID(q.After.Seq), q.After.Seq
	case !q.Start.IsZero():
		start = strconv.FormatInt(q.Start.UnixMilli(), 10)
	}
	tenants := []string{q.Tenant}
	if q.Tenant == "" {
		var err error
		if tenants, err = s.auditTenants(); err != nil {
			return nil, policy.AuditCursor{}, err
		}
	}
	var out []policy.AuditRecord
	for _, t := range tenants {
		recs, err := s.readAudit(t, start, after, q, limit+1)
		if err != nil {
			return nil, policy.AuditCursor{}, err
		}
		out = append(out, recs...)
	}
	slices.SortFunc(out, func(a, b policy.AuditRecord) int {
		if c := cmp.Compare(a.Seq, b.Seq); c != 0 {
			return c
		}
		return cmp.Compare(a.Tenant, b.Tenant)
	})
	page, next := out, policy.AuditCursor{}
	if len(out) > limit {
		// A page ends after every record of its last entry id, so records
		// of other tenants at the same id are not skipped by the next page.
		n := limit
		for n < len(out) && out[n].Seq == out[limit-1].Seq {
			n++
		}
		if n < len(out) {
			page, next = out[:n], out[n-1].Cursor()
		}
	}
	if q.CallID != "" {
		// One call's records come from the replicas that decided and
		// closed it, each buffered until its replica's flush: the streams
		// hold them in the order the flushes landed. Within the page they
		// are given in the order they were made (their time, then the
		// trail's).
		slices.SortStableFunc(page, func(a, b policy.AuditRecord) int { return a.Time.Compare(b.Time) })
	}
	return page, next, nil
}

// readAudit reads up to limit records of tenant's stream from the entry
// start on that q selects, after the Seq after (0: from start) and not cut
// by the cap (the head entry's records its meta says are gone). Entries
// are read a few at a time, as many as the records still wanted need at
// the records an entry held so far, so a chunk's thousand records are not
// read for ten; each read is one MULTI of the meta and the entries.
func (s *Store) readAudit(tenant, start string, after uint64, q policy.AuditQuery, limit int) ([]policy.AuditRecord, error) {
	ctx, cancel := s.call()
	defer cancel()
	var out, recs []policy.AuditRecord
	entries, seen := 0, 0 // read so far, and their records
	for len(out) < limit {
		count := 8
		if seen > 0 {
			count = (limit - len(out)) * entries / seen
		}
		count = min(max(count, 1), 512)
		var head *redis.SliceCmd
		var read *redis.XMessageSliceCmd
		_, err := s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			head = p.HMGet(ctx, keyAuditMeta(tenant), "head", "skip")
			read = p.XRangeN(ctx, keyAudit(tenant), start, "+", int64(count))
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("redisstore: read audit of %q: %w", tenant, err)
		}
		cut, err := auditCut(head.Val())
		if err != nil {
			return nil, fmt.Errorf("redisstore: read audit of %q: %s: %w", tenant, keyAuditMeta(tenant), err)
		}
		msgs := read.Val()
		for _, m := range msgs {
			if recs, err = appendAuditRecords(recs[:0], m); err != nil {
				return nil, fmt.Errorf("redisstore: read audit of %q: %w", tenant, err)
			}
			entries, seen = entries+1, seen+len(recs)
			for _, r := range recs {
				if r.Seq < cut || r.Seq <= after {
					continue
				}
				if !q.End.IsZero() && !r.Time.Before(q.End) {
					return out[:min(len(out), limit)], nil
				}
				if (q.CallID == "" || r.CallID == q.CallID) && (q.Start.IsZero() || !r.Time.Before(q.Start)) {
					out = append(out, r)
				}
			}
		}
		if len(msgs) < count {
			break
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
	return out[:min(len(out), limit)], nil
}

// auditCut is the first Seq the cap leaves of a stream, from its meta's
// head and skip (HMGET): the head entry's first record and skip more; 0
// without a meta.
func auditCut(v []any) (uint64, error) {
	head, _ := v[0].(string)
	if head == "" {
		return 0, nil
	}
	seq, err := packID(head)
	skip, err2 := strconv.ParseUint(fmt.Sprint(v[1]), 10, 20)
	if err != nil || err2 != nil {
		return 0, fmt.Errorf("head %v skip %v: want an entry id and a count", v[0], v[1])
	}
	return seq + skip, nil
}

// auditTenants returns the tenants with an audit stream: every tenant a
// replica used, and the empty tenant.
func (s *Store) auditTenants() ([]string, error) {
	t, err := s.tenants()
	if err != nil {
		return nil, err
	}
	if !slices.Contains(t, "") {
		t = append([]string{""}, t...)
	}
	return t, nil
}
