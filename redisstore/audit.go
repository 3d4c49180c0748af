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
// records are buffered and written by the flusher every FlushInterval, one
// pipeline of XADDs to the tenants' audit streams; past MaxAuditBuffer
// waiting records new ones are dropped, logged and counted. A query on
// this replica sees them at once, on another replica after the flush.
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

// flushAudit writes the buffered records, in one pipeline bounded by the
// store's timeout within ctx.
func (s *Store) flushAudit(ctx context.Context) {
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
	if err := s.writeAudit(ctx, recs); err != nil {
		if s.health.up() { // while down, the transition was logged
			s.log.Warn("redisstore: audit records not written; retrying", "records", len(recs), "err", err)
		}
		b.mu.Lock()
		b.recs = append(recs, b.recs...)
		if over := len(b.recs) - s.opts.MaxAuditBuffer; over > 0 {
			b.recs = b.recs[over:]
			b.dropped += uint64(over)
		}
		b.mu.Unlock()
	}
}

// writeAudit appends recs to their tenants' audit streams in one pipeline
// and trims each stream to the retention by size (MAXLEN ~) and by age
// (MINID ~).
func (s *Store) writeAudit(ctx context.Context, recs []policy.AuditRecord) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	// Entry ids are the server's time, whatever Options.Clock says: trim
	// by the wall clock.
	oldest := strconv.FormatInt(time.Now().Add(-s.opts.AuditRetention).UnixMilli(), 10)
	trimmed := map[string]bool{}
	_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range recs {
			r := &recs[i]
			key := keyAudit(r.Tenant)
			p.XAdd(ctx, &redis.XAddArgs{Stream: key, MaxLen: int64(s.opts.AuditMaxRecords), Approx: true, Values: auditValues(r)})
			if !trimmed[key] {
				trimmed[key] = true
				p.XTrimMinIDApprox(ctx, key, oldest, 0)
			}
		}
		return nil
	})
	return err
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
	s.flushAudit(s.ctx)
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
