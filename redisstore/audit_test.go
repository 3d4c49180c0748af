package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
)

// auditCalls counts the calls of policyd_audit a client sends, per
// tenant's stream, the round trips that carry them, and the other
// commands sent with them.
type auditCalls struct {
	mu     sync.Mutex
	calls  map[string]int // by stream key
	trips  int
	others []string
}

func (c *auditCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *auditCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (c *auditCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.count(cmds)
		return next(ctx, cmds)
	}
}

func (c *auditCalls) count(cmds []redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	audit := false
	var others []string
	for _, cmd := range cmds {
		a := cmd.Args()
		if cmd.Name() == "fcall" && len(a) > 3 && a[1] == "policyd_audit" {
			c.calls[a[3].(string)]++
			audit = true
		} else {
			others = append(others, cmd.Name())
		}
	}
	if audit {
		c.trips++
		c.others = append(c.others, others...)
	}
}

func (c *auditCalls) take() (calls map[string]int, trips int, others []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls, trips, others = c.calls, c.trips, c.others
	c.calls, c.trips, c.others = map[string]int{}, 0, nil
	return calls, trips, others
}

// auditStore opens a Store whose flusher never runs within a test (an
// hour's FlushInterval): FlushAudit, QueryAudit and Close flush.
func auditStore(t *testing.T, addr string, calls *auditCalls, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	c.AddHook(calls)
	t.Cleanup(func() { _ = c.Close() })
	opts.Client, opts.FlushInterval = c, time.Hour
	if opts.Timeout == 0 {
		opts.Timeout = 2 * time.Second
	}
	s, err := redisstore.Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("Open = %v, want nil", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// records returns n audit records of tenant, calls call-0 to call-(n-1),
// every field set; every third one was sent to a fallback.
func records(tenant string, n int, t0 time.Time) []policy.AuditRecord {
	out := make([]policy.AuditRecord, n)
	for i := range out {
		out[i] = policy.AuditRecord{Time: t0.Add(time.Duration(i) * time.Microsecond), Event: policy.AuditDecision,
			Tenant: tenant, Target: "geo", CallID: fmt.Sprintf("call-%d", i), RunID: "run-1", Attempt: uint32(1 + i%3),
			Classification: "transient:503", Verdict: policy.VerdictRetry, Delay: time.Duration(i) * time.Millisecond,
			Stop: policy.StopDeadline, Disposition: policy.DispositionDeadLetter, Detail: fmt.Sprintf("detail %d", i)}
		if i%3 == 0 {
			out[i].Target, out[i].PrimaryTarget = "geo-b", "geo"
		}
	}
	return out
}

// TestAuditOneCallPerTenantPerFlush: the audit records buffered between
// two flushes are one policyd_audit call per tenant (per 1,024 records),
// all in one round trip, and read back unchanged and in order.
func TestAuditOneCallPerTenantPerFlush(t *testing.T) {
	srv := redistest.Standalone(t)
	calls := &auditCalls{calls: map[string]int{}}
	s := auditStore(t, srv.Addr, calls, redisstore.Options{})
	t0 := time.Now().Truncate(time.Microsecond)
	acme, beta, gamma := records("acme", 200, t0), records("beta", 2200, t0), records("gamma", 1, t0)
	for i := range 200 { // interleaved, as many requests' records are
		s.AppendAudit(acme[i])
		s.AppendAudit(beta[11*i : 11*i+11]...)
	}
	s.AppendAudit(gamma...)
	if n, trips, _ := calls.take(); len(n) != 0 || trips != 0 {
		t.Fatalf("before the flush: %d round trips with calls %v, want none", trips, n)
	}
	s.FlushAudit()
	n, trips, others := calls.take()
	want := map[string]int{"{=acme}:audit": 1, "{=beta}:audit": 3, "{=gamma}:audit": 1}
	if fmt.Sprint(n) != fmt.Sprint(want) || trips != 1 || len(others) != 0 {
		t.Errorf("a flush of 200, 2,200 and 1 records of three tenants: calls %v in %d round trips (and %v); want %v in one", n, trips, others, want)
	}
	if b := s.AuditBuffered(); b != 0 {
		t.Errorf("after the flush %d records buffered, want 0", b)
	}
	for _, want := range [][]policy.AuditRecord{acme, beta, gamma} {
		got := queryAll(t, s, want[0].Tenant)
		if !sameRecords(got, want) {
			t.Errorf("QueryAudit(%s) = %d records, want the %d appended, unchanged and in order; first got %+v, want %+v",
				want[0].Tenant, len(got), len(want), got[0], want[0])
		}
	}
}

// TestAuditFlushIsBounded: a flush sends at most 2 round trips of 8
// calls of 1,024 records; the records past them wait, in order, for the
// next flush (a query writes them all first).
func TestAuditFlushIsBounded(t *testing.T) {
	srv := redistest.Standalone(t)
	calls := &auditCalls{calls: map[string]int{}}
	s := auditStore(t, srv.Addr, calls, redisstore.Options{})
	recs := records("acme", 20*1024+1, time.Now().Truncate(time.Microsecond))
	s.AppendAudit(recs...)
	for i, want := range []struct{ calls, trips, buffered int }{{16, 2, 4*1024 + 1}, {5, 1, 0}} {
		s.FlushAudit()
		n, trips, _ := calls.take()
		if n["{=acme}:audit"] != want.calls || trips != want.trips || s.AuditBuffered() != want.buffered {
			t.Errorf("flush %d: %d calls in %d round trips, %d records left; want %d in %d, %d left",
				i+1, n["{=acme}:audit"], trips, s.AuditBuffered(), want.calls, want.trips, want.buffered)
		}
	}
	if got := queryAll(t, s, "acme"); !sameRecords(got, recs) {
		t.Errorf("QueryAudit = %d records, want the %d appended, in order", len(got), len(recs))
	}
}

// TestAuditFlushWritesWhatTheCommitWrites: a record written by a flush
// (policyd_audit) and the same record written by a decision's commit (an
// XADD in its pipeline) read back the same through QueryAudit, with and
// without a primary target.
func TestAuditFlushWritesWhatTheCommitWrites(t *testing.T) {
	srv := redistest.Standalone(t)
	s := auditStore(t, srv.Addr, &auditCalls{calls: map[string]int{}}, redisstore.Options{})
	t0 := time.Now().Truncate(time.Microsecond)
	flushed, committed := records("acme", 3, t0), records("beta", 3, t0)
	s.AppendAudit(flushed...)
	s.FlushAudit()
	u := s.Begin()
	u.AppendAudit(committed...)
	if err := u.Commit(); err != nil {
		t.Fatal(err)
	}
	got := queryAll(t, s, "acme")
	want := queryAll(t, s, "beta")
	for i := range want {
		want[i].Tenant = "acme"
	}
	if !sameRecords(got, want) || len(got) != 3 {
		t.Errorf("flushed records read back as %+v, the committed ones as %+v; want the same", got, want)
	}
}

// TestAuditWaitsWhileTheEngineIsDown: records flushed while Redis is
// stopped (SIGSTOP) wait in the buffer, in order, up to MaxAuditBuffer
// (records appended past it are dropped and counted), and are written at
// the first flush after SIGCONT.
func TestAuditWaitsWhileTheEngineIsDown(t *testing.T) {
	srv := redistest.Standalone(t)
	calls := &auditCalls{calls: map[string]int{}}
	s := auditStore(t, srv.Addr, calls, redisstore.Options{Timeout: 50 * time.Millisecond, DownAfter: 1,
		DownFor: time.Hour, MaxAuditBuffer: 10})
	t0 := time.Now().Truncate(time.Microsecond)
	recs := records("acme", 14, t0)
	srv.Pause(t)
	s.AppendAudit(recs[:8]...)
	s.FlushAudit() // times out: the engine is down from it
	if s.Up() {
		t.Fatalf("Up after a flush that timed out with DownAfter 1: true, want false")
	}
	s.AppendAudit(recs[8:]...) // 2 more fit, 4 are dropped
	s.FlushAudit()             // refused at once, the engine down
	if b := s.AuditBuffered(); b != 10 {
		t.Errorf("records buffered while down = %d, want MaxAuditBuffer's 10", b)
	}
	srv.Resume(t)
	eventually(t, "the engine up again", func() bool { return s.Up() })
	s.FlushAudit()
	got := queryAll(t, s, "acme")
	// The flush that timed out may have been read by the server before it
	// stopped answering, and run after SIGCONT: its records then appear
	// twice, as with the pipelined XADDs before.
	seen := map[string]bool{}
	got = slices.DeleteFunc(got, func(r policy.AuditRecord) bool {
		dup := seen[r.CallID]
		seen[r.CallID] = true
		return dup
	})
	if !sameRecords(got, recs[:10]) {
		t.Errorf("after SIGCONT: %d records (%v), want the first 10 in order", len(got), got)
	}
}

// queryAll returns every record of tenant's audit trail.
func queryAll(t *testing.T, s *redisstore.Store, tenant string) []policy.AuditRecord {
	t.Helper()
	var out []policy.AuditRecord
	q := policy.AuditQuery{Tenant: tenant, Limit: 1000}
	for {
		recs, next, err := s.QueryAudit(q)
		if err != nil {
			t.Fatalf("QueryAudit(%s) = %v", tenant, err)
		}
		out = append(out, recs...)
		if next.IsZero() {
			return out
		}
		q.After = next
	}
}

// sameRecords compares records but for their Seq, which the stream's
// entry ids give.
func sameRecords(got, want []policy.AuditRecord) bool {
	return slices.EqualFunc(got, want, func(a, b policy.AuditRecord) bool {
		a.Seq, b.Seq = 0, 0
		return a.Time.Equal(b.Time) && func() bool { a.Time, b.Time = time.Time{}, time.Time{}; return a == b }()
	})
}
