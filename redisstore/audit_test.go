package redisstore_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
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
	sizes  []auditTrip // the round trips', in order
}

// auditTrip is one round trip's calls of policyd_audit: the records and
// the chunk's bytes of each.
type auditTrip struct{ records, bytes []int }

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
	var trip auditTrip
	for _, cmd := range cmds {
		a := cmd.Args()
		if cmd.Name() == "fcall" && len(a) > 3 && a[1] == "policyd_audit" {
			c.calls[a[3].(string)]++
			audit = true
			trip.records = append(trip.records, a[10].(int))
			trip.bytes = append(trip.bytes, len(a[11].([]byte)))
		} else {
			others = append(others, cmd.Name())
		}
	}
	if audit {
		c.trips++
		c.others = append(c.others, others...)
		c.sizes = append(c.sizes, trip)
	}
}

// takeSizes returns the round trips' sizes since the last take.
func (c *auditCalls) takeSizes() []auditTrip {
	c.mu.Lock()
	defer c.mu.Unlock()
	sizes := c.sizes
	c.sizes = nil
	return sizes
}

func (c *auditCalls) take() (calls map[string]int, trips int, others []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls, trips, others = c.calls, c.trips, c.others
	c.calls, c.trips, c.others, c.sizes = map[string]int{}, 0, nil, nil
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

// randomHex returns n random hex digits of rng.
func randomHex(rng *rand.Rand, n int) string {
	const digits = "0123456789abcdef"
	b := make([]byte, n)
	for i := range b {
		b[i] = digits[rng.IntN(len(digits))]
	}
	return string(b)
}

// TestAuditChunksAreStoredCompressed: a flush's chunk of many records is
// stored compressed (field z, a fraction of its records' bytes), a chunk
// of one record as it is (field b), both read back unchanged; a field z
// damaged in Redis is a refusal naming its entry, never a panic or
// records made up.
func TestAuditChunksAreStoredCompressed(t *testing.T) {
	srv := redistest.Standalone(t)
	s := auditStore(t, srv.Addr, &auditCalls{calls: map[string]int{}}, redisstore.Options{})
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = raw.Close() })
	ctx := context.Background()
	t0 := time.Now().Truncate(time.Microsecond)
	many, one := records("acme", 300, t0), records("beta", 1, t0)
	s.AppendAudit(many...)
	s.AppendAudit(one...)
	s.FlushAudit()
	packed := 0
	for i := range many {
		packed += len(redisstore.PackAuditEntry(many[i]))
	}
	entries := func(stream string) []redis.XMessage {
		t.Helper()
		es, err := raw.XRange(ctx, stream, "-", "+").Result()
		if err != nil || len(es) != 1 {
			t.Fatalf("XRANGE %s = %d entries, %v; want 1", stream, len(es), err)
		}
		return es
	}
	acme := entries("{=acme}:audit")[0]
	z, ok := acme.Values["z"].(string)
	if _, b := acme.Values["b"]; !ok || b {
		t.Fatalf("the chunk of %d records has fields %v, want n and z", len(many), slices.Sorted(maps.Keys(acme.Values)))
	}
	if len(z) > packed/3 {
		t.Errorf("the chunk of %d records (%d bytes packed alone) is %d bytes compressed, want at most a third", len(many), packed, len(z))
	}
	if beta := entries("{=beta}:audit")[0]; beta.Values["b"] == nil || beta.Values["z"] != nil {
		t.Errorf("the chunk of one record has fields %v, want n and b", slices.Sorted(maps.Keys(beta.Values)))
	}
	if got := queryAll(t, s, "acme"); !sameRecords(got, many) {
		t.Errorf("QueryAudit(acme) = %v, want %v", callIDs(got), callIDs(many))
	}
	if got := queryAll(t, s, "beta"); !sameRecords(got, one) {
		t.Errorf("QueryAudit(beta) = %v, want %v", callIDs(got), callIDs(one))
	}
	damaged := []byte(z)
	damaged[len(damaged)/2] ^= 0xff
	if err := raw.XAdd(ctx, &redis.XAddArgs{Stream: "{=acme}:audit", ID: "*", Values: []any{"n", "3", "z", damaged[:len(damaged)/2]}}).Err(); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.QueryAudit(policy.AuditQuery{Tenant: "acme", Limit: 1000})
	if err == nil || !strings.Contains(err.Error(), "does not decode") {
		t.Errorf("QueryAudit over a damaged field z = %v, want an entry that does not decode", err)
	}
}

// TestAuditFlushCarriesAReportLoad: the records of 120,000 outcomes of
// policybench's report phase (a call id of a client's sequence each, one
// detail) are written by one flush, within its 32 round trips of 128 KiB
// (4 MiB): packed one by one they take 9.5 MB. Before chunks were
// compressed one flush wrote 65,536 of them, and three replicas under
// policybench's report phase dropped a tenth of their records.
func TestAuditFlushCarriesAReportLoad(t *testing.T) {
	srv := redistest.Standalone(t)
	s := auditStore(t, srv.Addr, &auditCalls{calls: map[string]int{}}, redisstore.Options{MaxAuditBuffer: 1 << 20})
	t0 := time.Now().Truncate(time.Microsecond)
	recs := make([]policy.AuditRecord, 120_000)
	rng := rand.New(rand.NewPCG(3, 4))
	packed := 0
	for i := range recs {
		recs[i] = policy.AuditRecord{Time: t0.Add(time.Duration(i) * 3 * time.Microsecond), Event: policy.AuditOutcome,
			Tenant: "bench-t" + strconv.Itoa(i%8), Target: fmt.Sprintf("api-%02d", rng.IntN(16)),
			CallID: fmt.Sprintf("c1-18ed59024a709285-%d", i), Attempt: 1, Detail: "attempt succeeded"}
		packed += len(redisstore.PackAuditEntry(recs[i]))
	}
	s.AppendAudit(recs...)
	s.FlushAudit()
	if left := s.AuditBuffered(); left != 0 {
		t.Errorf("after one flush of %d records (%d bytes packed alone): %d left", len(recs), packed, left)
	}
	for tenant := range 8 {
		got := queryAll(t, s, "bench-t"+strconv.Itoa(tenant))
		if len(got) != len(recs)/8 {
			t.Errorf("bench-t%d: %d records, want %d", tenant, len(got), len(recs)/8)
		}
	}
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

// TestAuditFlushIsBounded: a chunk holds at most 1,024 records and 128
// KiB (but for one record larger alone), a round trip at most 32 chunks
// and 128 KiB (but for one chunk alone), a flush at most 32 round trips;
// the records past them wait, in order, for the next flush.
func TestAuditFlushIsBounded(t *testing.T) {
	srv := redistest.Standalone(t)
	calls := &auditCalls{calls: map[string]int{}}
	s := auditStore(t, srv.Addr, calls, redisstore.Options{})
	t0 := time.Now().Truncate(time.Microsecond)
	recs := records("acme", 40_000, t0)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range recs {
		// 121 to 520 bytes a record, most of them random hex, which
		// compressing leaves as large: the bounds are the bytes sent.
		recs[i].Detail = randomHex(rng, 100+i%400)
	}
	recs[7].Detail = strings.Repeat("x", 200<<10) // a record larger than a chunk
	var small []policy.AuditRecord                // 40 tenants of one record: 40 chunks
	for i := range 40 {
		small = append(small, records(fmt.Sprintf("t%d", i), 1, t0)...)
	}
	s.AppendAudit(recs...)
	s.AppendAudit(small...)
	for flush := 1; s.AuditBuffered() > 0; flush++ {
		if flush > 10 {
			t.Fatalf("%d records left after 10 flushes", s.AuditBuffered())
		}
		s.FlushAudit()
		sizes := calls.takeSizes()
		_, trips, _ := calls.take()
		for i, trip := range sizes {
			total := 0
			for j, n := range trip.records {
				if b := trip.bytes[j]; n > 1024 || n > 1 && b > 128<<10 {
					t.Errorf("flush %d, round trip %d: a chunk of %d records in %d bytes, want at most 1,024 and 128 KiB", flush, i, n, b)
				}
				total += trip.bytes[j]
			}
			if n := len(trip.records); n > 32 || n > 1 && total > 128<<10 {
				t.Errorf("flush %d, round trip %d: %d chunks of %d bytes, want at most 32 and 128 KiB", flush, i, n, total)
			}
		}
		if flush == 1 && (trips != 32 || s.AuditBuffered() == 0) {
			t.Errorf("flush 1 of %d records: %d round trips, %d records left; want 32, some left", len(recs)+len(small), trips, s.AuditBuffered())
		}
		if trips > 32 {
			t.Errorf("flush %d: %d round trips, want at most 32", flush, trips)
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
// stopped (SIGSTOP) wait, in order, and are written at the first flush
// after SIGCONT, each once; of the records appended within one flush
// interval, those past MaxAuditBuffer are dropped and counted.
func TestAuditWaitsWhileTheEngineIsDown(t *testing.T) {
	srv := redistest.Standalone(t)
	calls := &auditCalls{calls: map[string]int{}}
	s := auditStore(t, srv.Addr, calls, redisstore.Options{Timeout: 50 * time.Millisecond, DownAfter: 1,
		DownFor: time.Hour, MaxAuditBuffer: 10})
	t0 := time.Now().Truncate(time.Microsecond)
	recs := records("acme", 20, t0)
	srv.Pause(t)
	s.AppendAudit(recs[:8]...)
	s.FlushAudit() // times out: the engine is down from it
	if s.Up() || s.Downs() != 1 {
		t.Fatalf("after a flush that timed out with DownAfter 1: Up %v, Downs %d; want false, 1", s.Up(), s.Downs())
	}
	s.AppendAudit(recs[8:]...) // 10 more fit, 2 are dropped
	s.FlushAudit()             // refused at once, the engine down
	if b := s.AuditBuffered(); b != 18 {
		t.Errorf("records buffered while down = %d, want 8 and MaxAuditBuffer's 10", b)
	}
	if d := s.AuditDropped(); d != 2 {
		t.Errorf("records dropped while down = %d, want the 2 past MaxAuditBuffer", d)
	}
	srv.Resume(t)
	// Counted up is not answering yet: a call just after SIGCONT may still
	// time out on a loaded machine, and with DownAfter 1 count the engine
	// down again. Flush until the buffer is written and a read answers.
	eventually(t, "the records written and read back", func() bool {
		if !s.Up() {
			return false
		}
		s.FlushAudit()
		_, _, err := s.QueryAudit(policy.AuditQuery{Tenant: "acme", Limit: 1})
		return err == nil && s.AuditBuffered() == 0
	})
	// The flush that timed out may have reached the server before it
	// stopped answering, and run after SIGCONT: sent again, its chunk adds
	// nothing.
	if got := queryAll(t, s, "acme"); !sameRecords(got, recs[:18]) {
		t.Errorf("after SIGCONT: %d records (%v), want the first 18, once each and in order", len(got), callIDs(got))
	}
}

// TestAuditOutlastsAnOutage: while Redis is stopped, the records of each
// flush interval wait packed (a few bytes each), so an outage of many
// intervals loses none of them, though each interval appends as many as
// MaxAuditBuffer holds unpacked; past MaxAuditWaitingBytes of chunks the
// oldest are dropped, counted, and the newest written at SIGCONT.
func TestAuditOutlastsAnOutage(t *testing.T) {
	for _, c := range []struct {
		name      string
		bytes     int
		wantSaved int // of the last records, in order
	}{
		{"room for all", 0, 2000},
		{"room for some", 8 << 10, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			s := auditStore(t, srv.Addr, &auditCalls{calls: map[string]int{}}, redisstore.Options{Timeout: 50 * time.Millisecond,
				DownAfter: 1, DownFor: time.Hour, MaxAuditBuffer: 100, MaxAuditWaitingBytes: c.bytes})
			t0 := time.Now().Truncate(time.Microsecond)
			recs := records("acme", 2000, t0)
			srv.Pause(t)
			for i := 0; i < len(recs); i += 100 {
				s.AppendAudit(recs[i : i+100]...)
				s.FlushAudit() // the first times out, the others are refused at once
			}
			if s.Up() {
				t.Fatalf("Up while Redis is stopped: true, want false")
			}
			dropped := int(s.AuditDropped())
			if b := s.AuditBuffered(); b+dropped != len(recs) {
				t.Errorf("while down: %d records waiting and %d dropped, want the %d appended", b, dropped, len(recs))
			}
			srv.Resume(t)
			eventually(t, "the engine up again", func() bool { return s.Up() })
			s.FlushAudit()
			got := queryAll(t, s, "acme")
			switch {
			case c.wantSaved == len(recs):
				if dropped != 0 || !sameRecords(got, recs) {
					t.Errorf("after SIGCONT: %d records, %d dropped; want all %d, once each and in order", len(got), dropped, len(recs))
				}
			case dropped == 0 || dropped >= len(recs):
				t.Errorf("with %d bytes for waiting chunks: %d of %d dropped, want some", c.bytes, dropped, len(recs))
			case !sameRecords(got, recs[dropped:]) && !sameRecords(got, append(slices.Clone(recs[:100]), recs[dropped:]...)):
				// The flush that timed out reached the server before it
				// stopped: its chunk, dropped here, may run at SIGCONT.
				t.Errorf("after SIGCONT: %d records, want the %d newest, in order", len(got), len(recs)-dropped)
			}
		})
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

// lostReply is a hook that lets its first pipeline carrying a call of
// policyd_audit reach Redis and run, then reports it timed out, as a
// reply lost on the way back does.
type lostReply struct {
	mu   sync.Mutex
	lost int
}

func (l *lostReply) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (l *lostReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (l *lostReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		l.mu.Lock()
		defer l.mu.Unlock()
		if err != nil || l.lost > 0 || !slices.ContainsFunc(cmds, isAudit) {
			return err
		}
		l.lost++
		lost := fmt.Errorf("reply lost: %w", context.DeadlineExceeded)
		for _, c := range cmds {
			c.SetErr(lost)
		}
		return lost
	}
}

// TestAuditFlushSentAgainIsWrittenOnce: a flush whose reply is lost
// after Redis ran it is sent again at the next flush, and the trail holds
// each of its records once, in order.
func TestAuditFlushSentAgainIsWrittenOnce(t *testing.T) {
	srv := redistest.Standalone(t)
	lost := &lostReply{}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	c.AddHook(lost)
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, FlushInterval: time.Hour, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	t0 := time.Now().Truncate(time.Microsecond)
	acme, beta := records("acme", 1500, t0), records("beta", 3, t0)
	s.AppendAudit(acme...)
	s.AppendAudit(beta...)
	s.FlushAudit() // runs on Redis, its reply lost
	if lost.lost != 1 || s.AuditBuffered() != len(acme)+len(beta) {
		t.Fatalf("after the flush whose reply was lost: %d replies lost, %d records buffered; want 1 and all %d",
			lost.lost, s.AuditBuffered(), len(acme)+len(beta))
	}
	s.AppendAudit(records("acme", 2, t0.Add(time.Second))...) // appended since, written after
	s.FlushAudit()
	if b := s.AuditBuffered(); b != 0 {
		t.Errorf("after the second flush %d records buffered, want 0", b)
	}
	want := append(slices.Clone(acme), records("acme", 2, t0.Add(time.Second))...)
	for _, want := range [][]policy.AuditRecord{want, beta} {
		if got := queryAll(t, s, want[0].Tenant); !sameRecords(got, want) {
			t.Errorf("QueryAudit(%s) = %d records, want the %d appended, each once and in order", want[0].Tenant, len(got), len(want))
		}
	}
}

// BenchmarkAuditFlushOverRedis appends audit records of 8 tenants, a
// flush interval's worth at a time (25,000: 250,000 a second, what one
// replica accepts in policybench's report phase), and flushes them all to
// a real server. It reports per record the round trips carrying
// policyd_audit, the replica's CPU (this process's, getrusage) and
// Redis's (INFO cpu).
func BenchmarkAuditFlushOverRedis(b *testing.B) {
	srv := redistest.Standalone(b)
	calls := &auditCalls{calls: map[string]int{}}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	c.AddHook(calls)
	b.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, FlushInterval: time.Hour,
		Timeout: time.Second, MaxAuditBuffer: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	const perFlush = 25_000
	var batch []policy.AuditRecord
	for i := range 8 {
		batch = append(batch, records(fmt.Sprintf("bench-t%d", i), perFlush/8, time.Now())...)
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
	ctx := context.Background()
	calls.take()
	cpu0, rcpu0, fcall0 := benchSelfCPU(), benchRedisCPU(ctx, c), benchFCallUsec(ctx, c)
	b.ReportAllocs()
	b.ResetTimer()
	for n := b.N; n > 0; n -= perFlush {
		s.AppendAudit(batch[:min(n, perFlush)]...)
		for s.AuditBuffered() > 0 {
			s.FlushAudit()
		}
	}
	b.StopTimer()
	_, trips, _ := calls.take()
	ops := float64(b.N)
	b.ReportMetric(float64(trips)/ops, "roundtrips/record")
	b.ReportMetric(float64((benchSelfCPU()-cpu0).Microseconds())/ops, "replica-cpu-µs/record")
	b.ReportMetric((benchRedisCPU(ctx, c)-rcpu0)*1e6/ops, "redis-cpu-µs/record")
	b.ReportMetric(float64(benchFCallUsec(ctx, c)-fcall0)/ops, "redis-fcall-µs/record")
}

// queryPages returns every record q selects, read in pages of q.Limit.
func queryPages(t *testing.T, s *redisstore.Store, q policy.AuditQuery) []policy.AuditRecord {
	t.Helper()
	var out []policy.AuditRecord
	for pages := 0; ; pages++ {
		if pages > 100_000 {
			t.Fatal("QueryAudit: more than 100,000 pages")
		}
		recs, next, err := s.QueryAudit(q)
		if err != nil {
			t.Fatalf("QueryAudit(%+v) = %v", q, err)
		}
		out = append(out, recs...)
		if next.IsZero() {
			return out
		}
		q.After = next
	}
}

// TestAuditCapIsExactByRecords: AuditMaxRecords counts records, not
// entries: past it the oldest records go, the first ones of a chunk
// included, and a query never returns them.
func TestAuditCapIsExactByRecords(t *testing.T) {
	srv := redistest.Standalone(t)
	s := auditStore(t, srv.Addr, &auditCalls{calls: map[string]int{}}, redisstore.Options{AuditMaxRecords: 1500})
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = raw.Close() })
	ctx := context.Background()
	all := records("acme", 2648, time.Now().Truncate(time.Microsecond))
	from := 0
	for _, step := range []struct{ upTo, entries int }{
		{1024, 1}, // one chunk, under the cap
		{2048, 2}, // two: the first one's 548 oldest records cut
		{2648, 2}, // the first gone whole, the second's 124 oldest cut
	} {
		s.AppendAudit(all[from:step.upTo]...)
		s.FlushAudit()
		from = step.upTo
		want := all[max(0, step.upTo-1500):step.upTo]
		if got := queryAll(t, s, "acme"); !sameRecords(got, want) {
			t.Errorf("after %d records: QueryAudit = %d records (first %s), want the last %d (first %s)",
				step.upTo, len(got), got[0].CallID, len(want), want[0].CallID)
		}
		if n, err := raw.HGet(ctx, "{=acme}:auditmeta", "records").Int(); err != nil || n != len(want) {
			t.Errorf("after %d records: the meta's records = %d, %v; want %d", step.upTo, n, err, len(want))
		}
		if n := raw.XLen(ctx, "{=acme}:audit").Val(); n != int64(step.entries) {
			t.Errorf("after %d records: %d entries, want %d", step.upTo, n, step.entries)
		}
	}
	if err := redisstore.Check(ctx, raw); err != nil {
		t.Errorf("Check of the trail's keys = %v, want nil", err)
	}
}

// TestAuditReadsEntriesWrittenBefore: a stream of entries written before
// chunks (one record each, in field r or one field an attribute) is
// counted once at its first write, trimmed by age and cap with the
// chunks after it, and read with them, in order, also in pages that end
// inside a chunk.
func TestAuditReadsEntriesWrittenBefore(t *testing.T) {
	srv := redistest.Standalone(t)
	s := auditStore(t, srv.Addr, &auditCalls{calls: map[string]int{}}, redisstore.Options{AuditMaxRecords: 6})
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = raw.Close() })
	ctx := context.Background()
	t0 := time.Now().Truncate(time.Microsecond)
	old := records("acme", 4, t0)
	fields := func(r policy.AuditRecord) []any {
		return []any{"t", r.Time.UnixNano(), "ev", int(r.Event), "tenant", r.Tenant, "target", r.Target,
			"call", r.CallID, "run", r.RunID, "attempt", r.Attempt, "class", r.Classification,
			"verdict", int(r.Verdict), "delay", int64(r.Delay), "stop", int(r.Stop), "disp", int(r.Disposition),
			"detail", r.Detail, "primary", r.PrimaryTarget}
	}
	for i, e := range []struct {
		id     string
		values []any
	}{
		{"1000-0", fields(old[0])}, // 1970: past the retention
		{"*", []any{"r", redisstore.PackAuditEntry(old[1])}},
		{"*", fields(old[2])},
		{"*", []any{"r", redisstore.PackAuditEntry(old[3])}},
	} {
		if err := raw.XAdd(ctx, &redis.XAddArgs{Stream: "{=acme}:audit", ID: e.id, Values: e.values}).Err(); err != nil {
			t.Fatalf("XADD entry %d: %v", i, err)
		}
	}
	fresh := records("acme", 5, t0.Add(time.Second))
	for i := range fresh {
		fresh[i].CallID = fmt.Sprintf("new-%d", i)
	}
	s.AppendAudit(fresh...)
	s.FlushAudit()
	// 1 gone by age; of the 3 left and 5 new, the 2 oldest by the cap.
	want := append(slices.Clone(old[3:]), fresh...)
	if got := queryAll(t, s, "acme"); !sameRecords(got, want) {
		t.Errorf("QueryAudit = %v, want %v", callIDs(got), callIDs(want))
	}
	if n, err := raw.HGet(ctx, "{=acme}:auditmeta", "records").Int(); err != nil || n != len(want) {
		t.Errorf("the meta's records = %d, %v; want %d", n, err, len(want))
	}
	for limit := 1; limit <= 4; limit++ {
		if got := queryPages(t, s, policy.AuditQuery{Tenant: "acme", Limit: limit}); !sameRecords(got, want) {
			t.Errorf("QueryAudit in pages of %d = %v, want %v", limit, callIDs(got), callIDs(want))
		}
	}
}

// TestAuditPagesResumeInsideChunks: pages of any size over the chunks of
// two tenants return every record once, in the trail's order.
func TestAuditPagesResumeInsideChunks(t *testing.T) {
	srv := redistest.Standalone(t)
	s := auditStore(t, srv.Addr, &auditCalls{calls: map[string]int{}}, redisstore.Options{})
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = raw.Close() })
	// Listed as a replica lists the tenants it uses.
	if err := raw.SAdd(context.Background(), "{policyd}:tenants", "acme", "beta").Err(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Truncate(time.Microsecond)
	for range 3 {
		s.AppendAudit(records("acme", 700, t0)...)
		s.AppendAudit(records("beta", 300, t0)...)
		s.FlushAudit()
	}
	whole := queryPages(t, s, policy.AuditQuery{Limit: redisstore.MaxAuditPage})
	if len(whole) != 3000 {
		t.Fatalf("QueryAudit in one page: %d records, want 3000", len(whole))
	}
	for _, limit := range []int{1, 7, 300, 701, 1024, 1025} {
		got := queryPages(t, s, policy.AuditQuery{Limit: limit})
		if !slices.Equal(got, whole) {
			t.Errorf("QueryAudit in pages of %d: %d records, want the %d of one page, in its order", limit, len(got), len(whole))
		}
	}
}

// callIDs lists the records' call ids.
func callIDs(recs []policy.AuditRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.CallID
	}
	return out
}

// TestAuditOfACallInTheOrderItsRecordsWereMade: a call decided on one
// replica and closed on another has its records in two replicas'
// buffers; the closing replica's flush lands first. A query by call id,
// on any replica, gives them in the order they were made, not in the
// order the flushes landed (TestReplicasOverGRPCCluster read FINAL before
// DECISION when the replicas' flushers ran so).
func TestAuditOfACallInTheOrderItsRecordsWereMade(t *testing.T) {
	srv := redistest.Standalone(t)
	decider := auditStore(t, srv.Addr, &auditCalls{calls: map[string]int{}}, redisstore.Options{})
	closer := auditStore(t, srv.Addr, &auditCalls{calls: map[string]int{}}, redisstore.Options{})
	t0 := time.Now()
	rec := func(ev policy.AuditEvent, at time.Duration) policy.AuditRecord {
		return policy.AuditRecord{Time: t0.Add(at), Event: ev, Tenant: "acme", Target: "geo", CallID: "doc-1", Attempt: 1}
	}
	decider.AppendAudit(rec(policy.AuditDecision, 0))
	closer.AppendAudit(rec(policy.AuditFinal, time.Millisecond))
	closer.FlushAudit()
	decider.FlushAudit()
	for name, s := range map[string]*redisstore.Store{"decider": decider, "closer": closer} {
		got, _, err := s.QueryAudit(policy.AuditQuery{Tenant: "acme", CallID: "doc-1"})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Event != policy.AuditDecision || got[1].Event != policy.AuditFinal {
			t.Errorf("QueryAudit(doc-1) on the %s = %v, want its DECISION, then its FINAL", name, got)
		}
	}
}
