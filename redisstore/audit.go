package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/policy"
)

// Audit page sizes, as breakerstore's.
const (
	DefaultAuditPage = 100
	MaxAuditPage     = 10_000
)

// auditBuffer holds the records appended since the last flush.
type auditBuffer struct {
	mu      sync.Mutex
	recs    []policy.AuditRecord
	dropped uint64 // records dropped because the buffer was full
}

// AppendAudit adds records to the fleet's audit trail, stamping their time
// (when zero) with the replica's clock. It does not wait for Redis: the
// records are buffered and written by the flusher every FlushInterval,
// one policyd_audit call per tenant (per auditChunk records); past
// MaxAuditBuffer waiting records new ones are dropped, logged and
// counted. A query on this replica sees them at once, on another replica
// after the flush.
func (s *Store) AppendAudit(recs ...policy.AuditRecord) {
	if len(recs) == 0 || s.closed.Load() {
		return
	}
	now := s.opts.Clock()
	b := &s.audit
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range recs {
		if len(b.recs) >= s.opts.MaxAuditBuffer {
			b.dropped++
			continue
		}
		if r.Time.IsZero() {
			r.Time = now
		}
		b.recs = append(b.recs, r)
	}
}

// flushAudit writes the buffered records (writeAudit), at most
// auditTripsPerFlush round trips of them unless all is set (QueryAudit
// and Close write them all), each bounded by the store's timeout within
// ctx. Those not written wait for the next flush, in their order and
// before the records appended since, as many as MaxAuditBuffer allows:
// past it the oldest are dropped and counted.
func (s *Store) flushAudit(ctx context.Context, all bool) {
	b := &s.audit
	b.mu.Lock()
	recs, dropped := b.recs, b.dropped
	b.recs, b.dropped = nil, 0
	b.mu.Unlock()
	if dropped > 0 {
		s.log.Warn("redisstore: audit records dropped: the buffer was full", "dropped", dropped)
	}
	if len(recs) == 0 {
		return
	}
	trips := auditTripsPerFlush
	if all {
		trips = len(recs) // more than it takes
	}
	if left, err := s.writeAudit(ctx, recs, trips); len(left) > 0 {
		if err != nil && s.health.up() { // while down, the transition was logged
			s.log.Warn("redisstore: audit records not written; retrying", "records", len(left), "of", len(recs), "err", err)
		}
		b.mu.Lock()
		b.recs = append(left, b.recs...)
		if over := len(b.recs) - s.opts.MaxAuditBuffer; over > 0 {
			b.recs = b.recs[over:]
			b.dropped += uint64(over)
		}
		b.mu.Unlock()
	}
}

// The audit flush's bounds: a policyd_audit call carries at most
// auditChunk records (one argument each, packed by appendAuditEntry), a
// round trip at most auditCallsPerTrip calls, and the flusher's flush at
// most auditTripsPerFlush round trips (16,384 records: 163,840 a second a
// replica at the default interval), so it never holds up the held
// outcomes' flush behind it for long; the rest waits for the next one.
const (
	auditChunk         = 1024
	auditCallsPerTrip  = 8
	auditTripsPerFlush = 2
)

// writeAudit appends recs to their tenants' audit streams: one call of
// policyd_audit per tenant and auditChunk records, in the records' order,
// sent auditCallsPerTrip calls a round trip (one pipeline; on a Cluster,
// one per master), each round trip bounded by the store's timeout, at
// most trips of them, until one fails. Each call adds its records with
// MAXLEN ~ AuditMaxRecords and trims its stream by age (MINID ~
// AuditRetention). It returns the records not written (those of the calls
// that failed or were not sent), in their order, and the error that
// stopped it.
func (s *Store) writeAudit(ctx context.Context, recs []policy.AuditRecord, trips int) ([]policy.AuditRecord, error) {
	// Entry ids are the server's time, whatever Options.Clock says: trim
	// by the wall clock.
	oldest := strconv.FormatInt(time.Now().Add(-s.opts.AuditRetention).UnixMilli(), 10)
	// The records of each tenant, in order; tenants in order of their
	// first record; then the calls, a tenant's chunks after one another.
	var tenants []string
	byTenant := map[string][]int{}
	for i := range recs {
		t := recs[i].Tenant
		if _, ok := byTenant[t]; !ok {
			tenants = append(tenants, t)
		}
		byTenant[t] = append(byTenant[t], i)
	}
	type call struct {
		tenant string
		recs   []int
		cmd    *redis.Cmd
	}
	var calls []call
	for _, t := range tenants {
		for idx := byTenant[t]; len(idx) > 0; {
			n := min(len(idx), auditChunk)
			calls = append(calls, call{tenant: t, recs: idx[:n]})
			idx = idx[n:]
		}
	}
	var err error
	sent := 0 // calls confirmed or failed
	for trip := 0; trip < trips && sent < len(calls) && err == nil; trip++ {
		batch := calls[sent:min(sent+auditCallsPerTrip, len(calls))]
		tctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
		_, err = s.c.Pipelined(tctx, func(p redis.Pipeliner) error {
			l := s.lib.on(p)
			var buf []byte // the round trip's records, packed one after another
			for i := range batch {
				c := &batch[i]
				args := make([]any, 0, 2+len(c.recs))
				args = append(args, s.opts.AuditMaxRecords, oldest)
				for _, r := range c.recs {
					start := len(buf)
					buf = appendAuditEntry(buf, &recs[r])
					args = append(args, buf[start:len(buf):len(buf)])
				}
				c.cmd = l.run(tctx, "policyd_audit", []string{keyAudit(c.tenant)}, args...)
			}
			return nil
		})
		cancel()
		sent += len(batch)
	}
	var left []int
	for _, c := range calls {
		if c.cmd == nil || c.cmd.Err() != nil || err != nil && c.cmd.Val() == nil {
			left = append(left, c.recs...)
		}
	}
	if len(left) == 0 {
		return nil, nil
	}
	slices.Sort(left) // the records' order, across tenants
	out := make([]policy.AuditRecord, len(left))
	for j, i := range left {
		out[j] = recs[i]
	}
	return out, err
}

// auditValues encodes r as a stream entry's fields; "primary" (the primary
// target of an attempt sent to a fallback) only when set, so an entry
// without it is one that never left its primary.
func auditValues(r *policy.AuditRecord) []any {
	v := []any{"t", r.Time.UnixNano(), "ev", int(r.Event), "tenant", r.Tenant, "target", r.Target,
		"call", r.CallID, "run", r.RunID, "attempt", r.Attempt, "class", r.Classification,
		"verdict", int(r.Verdict), "delay", int64(r.Delay), "stop", int(r.Stop), "disp", int(r.Disposition),
		"detail", r.Detail}
	if r.PrimaryTarget != "" {
		v = append(v, "primary", r.PrimaryTarget)
	}
	return v
}

// decodeAudit reads a stream entry back, packed in its one field
// (auditentry.go) or, as written before, one field an attribute; Seq is
// the entry id packed as milliseconds << 20 | sequence.
func decodeAudit(m redis.XMessage) (policy.AuditRecord, error) {
	seq, err := packID(m.ID)
	if err != nil {
		return policy.AuditRecord{}, err
	}
	if v, ok := m.Values[auditEntryField].(string); ok {
		r, err := decodeAuditEntry(v)
		if err != nil {
			return policy.AuditRecord{}, fmt.Errorf("%w: entry %s", err, m.ID)
		}
		r.Seq = seq
		return r, nil
	}
	str := func(f string) string { v, _ := m.Values[f].(string); return v }
	num := func(f string) int64 { n, _ := strconv.ParseInt(str(f), 10, 64); return n }
	return policy.AuditRecord{Time: time.Unix(0, num("t")), Seq: seq, Event: policy.AuditEvent(num("ev")),
		Tenant: str("tenant"), Target: str("target"), CallID: str("call"), RunID: str("run"),
		Attempt: uint32(num("attempt")), Classification: str("class"), Verdict: policy.Verdict(num("verdict")),
		Delay: time.Duration(num("delay")), Stop: policy.StopReason(num("stop")),
		Disposition: policy.Disposition(num("disp")), Detail: str("detail"), PrimaryTarget: str("primary")}, nil
}

// packID packs a stream id "ms-seq" into one number that sorts as ids do.
func packID(id string) (uint64, error) {
	ms, seq, ok := strings.Cut(id, "-")
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil || b >= 1<<20 {
		return 0, fmt.Errorf("redisstore: stream id %q", id)
	}
	return a<<20 | b, nil
}

// unpackID is packID's inverse.
func unpackID(n uint64) string {
	return strconv.FormatUint(n>>20, 10) + "-" + strconv.FormatUint(n&(1<<20-1), 10)
}

// QueryAudit returns the records q selects, from every replica, in the
// trail's order (the audit streams' order: entry id, then tenant), and the
// cursor of the next page, zero at the end. Records of this replica not
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
	start := "-"
	switch {
	case !q.After.IsZero():
		start = "(" + unpackID(q.After.Seq)
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
		recs, err := s.readAudit(t, start, q, limit+1)
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
	if len(out) <= limit {
		return out, policy.AuditCursor{}, nil
	}
	// A page ends after every record of its last entry id, so records of
	// other tenants at the same id are not skipped by the next page.
	n := limit
	for n < len(out) && out[n].Seq == out[limit-1].Seq {
		n++
	}
	if n == len(out) {
		return out, policy.AuditCursor{}, nil
	}
	return out[:n], out[n-1].Cursor(), nil
}

// readAudit reads up to limit records of tenant's stream from start that q
// selects.
func (s *Store) readAudit(tenant, start string, q policy.AuditQuery, limit int) ([]policy.AuditRecord, error) {
	ctx, cancel := s.call()
	defer cancel()
	var out []policy.AuditRecord
	for len(out) < limit {
		msgs, err := s.c.XRangeN(ctx, keyAudit(tenant), start, "+", 512).Result()
		if err != nil {
			return nil, fmt.Errorf("redisstore: read audit of %q: %w", tenant, err)
		}
		for _, m := range msgs {
			r, err := decodeAudit(m)
			if err != nil {
				return nil, err
			}
			if !q.End.IsZero() && !r.Time.Before(q.End) {
				return out, nil
			}
			if (q.CallID == "" || r.CallID == q.CallID) && (q.Start.IsZero() || !r.Time.Before(q.Start)) {
				out = append(out, r)
			}
		}
		if len(msgs) < 512 {
			break
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
	return out, nil
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
