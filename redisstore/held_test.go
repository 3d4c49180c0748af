package redisstore_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
)

// outcomeCalls counts the calls of policyd_outcomes a client sends, per
// tenant (read from the hash tag of the call's first key), alone or in a
// pipeline, once their reply is in.
type outcomeCalls struct {
	mu    sync.Mutex
	n     map[string]int
	order []string      // the tenants of the calls, in the order sent
	sent  chan struct{} // when set, told of each call (without waiting)
}

func (c *outcomeCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *outcomeCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		c.count(cmd)
		return err
	}
}

func (c *outcomeCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return err
	}
}

func (c *outcomeCalls) count(cmd redis.Cmder) {
	a := cmd.Args()
	if len(a) < 4 || cmd.Name() != "fcall" || a[1] != "policyd_outcomes" {
		return
	}
	key, _ := a[3].(string)
	tenant, _, _ := strings.Cut(strings.TrimPrefix(key, "{="), "}")
	c.mu.Lock()
	c.n[tenant]++
	c.order = append(c.order, tenant)
	sent := c.sent
	c.mu.Unlock()
	select {
	case sent <- struct{}{}:
	default:
	}
}

// take returns the calls per tenant since the last take.
func (c *outcomeCalls) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n, c.order = map[string]int{}, nil
	return n
}

// sentOrder returns the tenants of the calls since the last take, in the
// order sent.
func (c *outcomeCalls) sentOrder() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.order)
}

// heldStore opens a Store with BatchOutcomes on a client counted by calls.
// Its FlushInterval is an hour, so within a test only FlushHeld, a
// batch's size or Close flushes; opts completes the options.
func heldStore(t *testing.T, addr string, calls *outcomeCalls, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	return heldStoreOn(t, redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute}), calls, opts)
}

// heldStoreOn is heldStore over the client c, which it closes at the
// test's end.
func heldStoreOn(t *testing.T, c redis.UniversalClient, calls *outcomeCalls, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	c.AddHook(calls)
	t.Cleanup(func() { _ = c.Close() })
	opts.Client, opts.BatchOutcomes, opts.FlushInterval = c, true, time.Hour
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

// request is one ReportOutcome's updates for tenant's breaker on geo: a
// success with its attempt tally and failures transient failures after
// it.
func request(tenant string, failures int) []policy.OutcomeUpdate {
	key := policy.BreakerKey{Tenant: tenant, Target: "geo"}
	ups := []policy.OutcomeUpdate{{Key: key, Breaker: policy.Default().Breaker, Result: policy.ResultSuccess,
		Tally: policy.AttemptTally{Tenant: tenant, Target: "geo", Attempt: 1, Success: true}}}
	for range failures {
		ups = append(ups, policy.OutcomeUpdate{Key: key, Breaker: policy.Default().Breaker, Result: policy.ResultTransientFailure})
	}
	return ups
}

// apply applies ups with deposits, failing t on an error or a refusal.
func apply(t *testing.T, s *redisstore.Store, ups []policy.OutcomeUpdate, deposits map[string]int) {
	t.Helper()
	n, err := s.ApplyOutcomes(ups, deposits)
	if err != nil || n != len(ups) {
		t.Fatalf("ApplyOutcomes = %d, %v; want %d, nil", n, err, len(ups))
	}
	for i := range ups {
		if ups[i].Refused != nil {
			t.Fatalf("ApplyOutcomes: update %d refused: %v", i, ups[i].Refused)
		}
	}
}

// checkGeo checks tenant's breaker on geo (consecutive failures) and its
// attempt statistics (successes on attempt 1) as s reads them.
func checkGeo(t *testing.T, what string, s *redisstore.Store, tenant string, consecutive int, successes uint64, since time.Time) {
	t.Helper()
	b, err := s.Breaker(policy.BreakerKey{Tenant: tenant, Target: "geo"})
	if err != nil {
		t.Fatalf("%s: Breaker(%s/geo) = %v, want nil", what, tenant, err)
	}
	if int(b.ConsecutiveFailures) != consecutive {
		t.Errorf("%s: %s/geo has %d consecutive failures, want %d", what, tenant, b.ConsecutiveFailures, consecutive)
	}
	st, err := s.AttemptStats(tenant, "geo", since)
	if err != nil || len(st) != 1 {
		t.Fatalf("%s: AttemptStats(%s, geo) = %+v, %v; want one entry", what, tenant, st, err)
	}
	if got := st[0].Successes[0]; got != successes {
		t.Errorf("%s: %s/geo counts %d successes on attempt 1, want %d", what, tenant, got, successes)
	}
}

// TestHeldOutcomesOneCallPerTenantPerFlush reports 40 requests of outcomes
// for each of two tenants within one flush interval: none is sent before
// the flush, which is one call of policyd_outcomes per tenant, and the
// breakers and attempt statistics then count every outcome once, in the
// order reported.
func TestHeldOutcomesOneCallPerTenantPerFlush(t *testing.T) {
	srv := redistest.Standalone(t)
	calls := &outcomeCalls{n: map[string]int{}}
	t0 := time.Now()
	oneCallPerTenantPerFlush(t, heldStore(t, srv.Addr, calls, redisstore.Options{Clock: func() time.Time { return t0 }}), calls, t0)
}

// TestHeldOutcomesOneCallPerTenantPerFlushCluster is the same on a
// 3-master Cluster: each tenant's held batch is one call on its slot.
func TestHeldOutcomesOneCallPerTenantPerFlushCluster(t *testing.T) {
	addrs := redistest.Cluster(t)
	calls := &outcomeCalls{n: map[string]int{}}
	t0 := time.Now()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	oneCallPerTenantPerFlush(t, heldStoreOn(t, c, calls, redisstore.Options{Clock: func() time.Time { return t0 }}), calls, t0)
}

// oneCallPerTenantPerFlush is the case of the two tests above on s, whose
// client calls counts, at the fixed time t0.
func oneCallPerTenantPerFlush(t *testing.T, s *redisstore.Store, calls *outcomeCalls, t0 time.Time) {
	t.Helper()
	tenants := []string{"acme", "beta"}
	// A breaker new to the replica is sent at once (it may be past the
	// tenant's cap, an error its caller sees).
	for _, tn := range tenants {
		apply(t, s, request(tn, 0), nil)
	}
	if got := calls.take(); got["acme"] != 1 || got["beta"] != 1 {
		t.Fatalf("calls for new breakers = %v, want one per tenant", got)
	}
	const requests = 40
	for i := range requests {
		for _, tn := range tenants {
			// The last request ends on three failures in a row.
			failures := 1
			if i == requests-1 {
				failures = 3
			}
			apply(t, s, request(tn, failures), map[string]int{tn: 1})
		}
	}
	if got := calls.take(); len(got) != 0 {
		t.Fatalf("calls before the flush = %v, want none", got)
	}
	s.FlushHeld()
	if got := calls.take(); got["acme"] != 1 || got["beta"] != 1 || len(got) != 2 {
		t.Fatalf("calls of the flush = %v, want one per tenant", got)
	}
	for _, tn := range tenants {
		checkGeo(t, "after the flush", s, tn, 3, requests+1, t0)
	}
	s.FlushHeld()
	if got := calls.take(); len(got) != 0 {
		t.Fatalf("calls of an empty flush = %v, want none", got)
	}
}

// TestHeldOutcomesSentBeforeAnAnswerThatNeedsThem: a batch whose answer
// needs the engine (a final disposition of a run) is sent at once, after
// the tenant's held outcomes in the same pipeline, and its refusal is
// the caller's answer.
func TestHeldOutcomesSentBeforeAnAnswerThatNeedsThem(t *testing.T) {
	h := newHeldRun(t, 0)
	apply(t, h.s, h.final(), nil)
	if got := h.calls.take(); got["acme"] != 2 {
		t.Fatalf("calls for a final disposition = %v, want two for acme (the held batch, then the final's)", got)
	}
	h.checkFinal(t)
}

// heldRun is a Store holding a batch of acme's outcomes (a success, then a
// success and two failures of acme/geo) and a run of acme's for a final
// disposition of doc-1 to end, the calls it sends counted from then on.
type heldRun struct {
	s     *redisstore.Store
	calls *outcomeCalls
	run   policy.Run
	t0    time.Time
}

// newHeldRun opens a heldRun, with the store's timeout when not 0.
func newHeldRun(t *testing.T, timeout time.Duration) *heldRun {
	t.Helper()
	srv := redistest.Standalone(t)
	h := &heldRun{calls: &outcomeCalls{n: map[string]int{}}, t0: time.Now()}
	h.s = heldStore(t, srv.Addr, h.calls, redisstore.Options{Timeout: timeout, Clock: func() time.Time { return h.t0 }})
	var err error
	if h.run, err = h.s.OpenRun(policy.Run{Tenant: "acme", Pool: 10, Cutoff: h.t0.Add(time.Hour)}); err != nil {
		t.Fatalf("OpenRun = %v, want nil", err)
	}
	apply(t, h.s, request("acme", 0), nil)
	apply(t, h.s, request("acme", 2), nil) // held: the breaker is known
	h.calls.take()
	return h
}

// final is the update that ends doc-1 SUCCEEDED.
func (h *heldRun) final() []policy.OutcomeUpdate {
	return []policy.OutcomeUpdate{{RunID: h.run.ID, CallID: "doc-1", Final: policy.DispositionSucceeded}}
}

// checkFinal checks that the engine applied the held batch and then the
// final: acme/geo's counts, and doc-1 ended (another final refused).
func (h *heldRun) checkFinal(t *testing.T) {
	t.Helper()
	checkGeo(t, "after the final", h.s, "acme", 2, 2, h.t0)
	again := []policy.OutcomeUpdate{{RunID: h.run.ID, CallID: "doc-1", Final: policy.DispositionDeadLetter, Stop: policy.StopAttemptsExhausted}}
	if _, err := h.s.ApplyOutcomes(again, nil); err != nil || again[0].Refused == nil {
		t.Fatalf("ApplyOutcomes(DEAD_LETTER of a SUCCEEDED call) = %v, refused %v; want the final refused", err, again[0].Refused)
	}
}

// behindFlush runs f, which asks the store something, while s's flush lock
// is held as by a flush whose round trip Redis does not answer, and fails t
// unless f returns nil well within the 10 s it waits (a bound on the
// failure, not a wait: the answer is due at the store's 50 ms); then it
// lets the flush end.
func behindFlush(t *testing.T, s *redisstore.Store, what string, f func() error) {
	t.Helper()
	release := redisstore.HoldHeldSending(s)
	defer release()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s behind a flush in flight = %v, want nil (answered as in degraded mode)", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still waiting 10s for a flush in flight; its bound was 50ms", what)
	}
}

// TestCloseFlushesHeldOutcomes: a replica's Close sends what it holds, one
// call per tenant, and another replica then reads it.
func TestCloseFlushesHeldOutcomes(t *testing.T) {
	srv := redistest.Standalone(t)
	calls := &outcomeCalls{n: map[string]int{}}
	t0 := time.Now()
	clock := func() time.Time { return t0 }
	s := heldStore(t, srv.Addr, calls, redisstore.Options{Clock: clock})
	apply(t, s, request("acme", 0), nil)
	for range 10 {
		apply(t, s, request("acme", 1), nil)
	}
	calls.take()
	other := heldStore(t, srv.Addr, &outcomeCalls{n: map[string]int{}}, redisstore.Options{Clock: clock})
	checkGeo(t, "another replica before the Close", other, "acme", 0, 1, t0)
	if err := s.Close(); err != nil {
		t.Fatalf("Close = %v, want nil", err)
	}
	if got := calls.take(); got["acme"] != 1 || len(got) != 1 {
		t.Fatalf("calls of the Close = %v, want one for acme", got)
	}
	checkGeo(t, "another replica after the Close", other, "acme", 1, 11, t0)
}

// TestHeldFlushWhileRedisPausedReplaysOnce: a flush while Redis is
// stopped (SIGSTOP) ends at the store's timeout and queues the batch;
// after SIGCONT it replays once: the batch the stopped server read before
// it stopped answering and the replay count once together.
func TestHeldFlushWhileRedisPausedReplaysOnce(t *testing.T) {
	srv := redistest.Standalone(t)
	calls := &outcomeCalls{n: map[string]int{}}
	start := time.Now()
	s := heldStore(t, srv.Addr, calls, redisstore.Options{Timeout: 50 * time.Millisecond, DownAfter: 1,
		DownFor: 20 * time.Millisecond, Heartbeat: 10 * time.Millisecond})
	apply(t, s, request("acme", 0), nil)
	for range 10 {
		apply(t, s, request("acme", 1), nil)
	}
	srv.Pause(t)
	s.FlushHeld()
	if q := s.Queued(); q != 1 {
		t.Fatalf("Queued after a flush while paused = %d, want 1", q)
	}
	srv.Resume(t)
	eventually(t, "the queue replayed", func() bool { return s.Up() && s.Queued() == 0 })
	if d := s.Dropped(); d != 0 {
		t.Fatalf("Dropped = %d, want 0", d)
	}
	checkGeo(t, "after the replay", s, "acme", 1, 11, start.Add(-time.Minute))
}

// TestReplayStopsAtTheFirstBatchNotTaken: a replay whose batch Redis does
// not take (a timeout, or the engine's breaker refusing while its one call
// is out) stops there, and that batch keeps its place at the head of the
// queue. Before, the batch went to the back and the replay went on with
// the next: one timeout after another while Redis was stopped, or, while
// another call held the breaker's one slot, a loop building and refusing
// every queued batch until the engine's state changed, which held a
// replica's only P for tens of milliseconds at a time under the
// stop-redis fault test; and the queue came back out of order.
func TestReplayStopsAtTheFirstBatchNotTaken(t *testing.T) {
	srv := redistest.Standalone(t)
	calls := &outcomeCalls{n: map[string]int{}}
	// DownAfter: the engine never goes down here, it stays suspect, and
	// the replay is what decides what is sent.
	s := heldStore(t, srv.Addr, calls, redisstore.Options{Timeout: 100 * time.Millisecond, DownAfter: 1000})
	tenants := []string{"t0", "t1", "t2", "t3", "t4"}
	for _, tn := range tenants {
		apply(t, s, request(tn, 0), nil)
		apply(t, s, request(tn, 1), nil) // held
	}
	srv.Pause(t)
	s.FlushHeld() // one call per tenant, not answered: queued, in order
	if q := s.Queued(); q != len(tenants) {
		t.Fatalf("Queued after a flush while paused = %d, want %d", q, len(tenants))
	}
	calls.take()
	calls.mu.Lock()
	calls.sent = make(chan struct{}, 16)
	calls.mu.Unlock()
	done := make(chan struct{})
	go func() { s.Replay(); close(done) }()
	<-calls.sent // the first batch's call, waiting for a stopped Redis
	select {
	case <-done:
	case <-calls.sent:
		srv.Resume(t)
		<-done
		t.Fatalf("the replay sent another batch after one Redis did not take: %v", calls.sentOrder())
	}
	if q := s.Queued(); q != len(tenants) {
		t.Fatalf("Queued after the replay while paused = %d, want %d", q, len(tenants))
	}
	srv.Resume(t)
	calls.take()
	s.Replay()
	if got := calls.sentOrder(); !slices.Equal(got, tenants) {
		t.Errorf("replayed after SIGCONT: %v, want %v (the queue's order)", got, tenants)
	}
	if q, d := s.Queued(), s.Dropped(); q != 0 || d != 0 {
		t.Errorf("after the replay: Queued %d, Dropped %d; want 0, 0", q, d)
	}
	for _, tn := range tenants {
		checkGeo(t, "after the replay", s, tn, 1, 2, time.Now().Add(-time.Minute))
	}
}

// TestHeldBatchPastItsBoundIsSentBeforeTheInterval: a tenant's held batch
// that passes its size bound (4,096 results) wakes the flusher, which
// sends it in one call long before the hour-long flush interval ends.
func TestHeldBatchPastItsBoundIsSentBeforeTheInterval(t *testing.T) {
	srv := redistest.Standalone(t)
	calls := &outcomeCalls{n: map[string]int{}}
	t0 := time.Now()
	s := heldStore(t, srv.Addr, calls, redisstore.Options{Clock: func() time.Time { return t0 }})
	apply(t, s, request("acme", 0), nil)
	calls.take()
	apply(t, s, request("acme", 100), nil) // under the bound: held
	if got := calls.take(); len(got) != 0 {
		t.Fatalf("calls under the bound = %v, want none", got)
	}
	ups := request("acme", 4000)
	ups[len(ups)-1].Result = policy.ResultSuccess
	apply(t, s, ups, nil)
	got := map[string]int{}
	eventually(t, "the held batch sent", func() bool {
		for tn, n := range calls.take() {
			got[tn] += n
		}
		return got["acme"] > 0
	})
	if got["acme"] != 1 || len(got) != 1 {
		t.Fatalf("calls past the bound = %v, want one for acme", got)
	}
	checkGeo(t, "after the bound's flush", s, "acme", 0, 3, t0)
}

// TestHeldResultsGoWithARecordOfTheirBreaker: a decision's Record of a
// breaker takes the results of that breaker held for the flush along in
// its own call of policyd_record, in front of its result, so the breaker
// counts them in the order reported (the contract's "order"), with no
// call of policyd_outcomes more; what else the tenant holds waits for the
// flush. Before, the held success was applied after the failure and the
// breaker opened on four failures, a success and a failure.
func TestHeldResultsGoWithARecordOfTheirBreaker(t *testing.T) {
	srv := redistest.Standalone(t)
	calls := &outcomeCalls{n: map[string]int{}}
	t0 := time.Now()
	s := heldStore(t, srv.Addr, calls, redisstore.Options{Clock: func() time.Time { return t0 }})
	key := policy.BreakerKey{Tenant: "acme", Target: "geo"}
	cfg := policy.Default().Breaker
	apply(t, s, request("acme", 0), nil) // a breaker new to the replica: sent at once
	for range cfg.ConsecutiveFailures - 1 {
		if _, err := s.Record(key, cfg, policy.ResultTransientFailure, ""); err != nil {
			t.Fatalf("Record(failure) = %v, want nil", err)
		}
	}
	calls.take()
	apply(t, s, request("acme", 0), map[string]int{"acme": 1}) // held: a success, its tally, a deposit
	snap, err := s.Record(key, cfg, policy.ResultTransientFailure, "")
	if err != nil || snap.State != policy.BreakerClosed || snap.ConsecutiveFailures != 1 {
		t.Fatalf("Record(failure) after a held success = %v with %d in a row, %v; want CLOSED with 1, nil",
			snap.State, snap.ConsecutiveFailures, err)
	}
	if got := calls.take(); len(got) != 0 {
		t.Fatalf("calls of policyd_outcomes before the flush = %v, want none", got)
	}
	s.FlushHeld()
	if got := calls.take(); got["acme"] != 1 || len(got) != 1 {
		t.Fatalf("calls of the flush = %v, want one for acme (the tally and the deposit)", got)
	}
	checkGeo(t, "after the flush", s, "acme", 1, 2, t0)
}

// TestFinalWaitsForAFlushNoLongerThanItsBound: a report that needs the
// engine's answer now (a final disposition: the ledger may refuse it)
// waits for a flush in flight only until its bound (the store's timeout),
// as a decision does, and is answered as in degraded mode; its batch goes
// out once the flush has ended, in its place in line: after the tenant's
// batch held before it, so the engine applies both in the order reported.
// Before, it waited for the flush however long that took: while Redis did
// not answer, a report or a decision's commit waited the flush's timeout
// on top of its own (the stop-redis fault test's answers past 100 ms).
func TestFinalWaitsForAFlushNoLongerThanItsBound(t *testing.T) {
	h := newHeldRun(t, 50*time.Millisecond)
	behindFlush(t, h.s, "ApplyOutcomes of a final", func() error {
		_, err := h.s.ApplyOutcomes(h.final(), nil)
		if got := h.calls.take(); len(got) != 0 {
			t.Errorf("calls while the flush is in flight = %v, want none", got)
		}
		return err
	})
	got := map[string]int{}
	eventually(t, "the final's batch sent after the flush", func() bool {
		for tn, n := range h.calls.take() {
			got[tn] += n
		}
		return got["acme"] >= 2
	})
	if got["acme"] != 2 || len(got) != 1 {
		t.Fatalf("calls after the flush = %v, want two for acme (the held batch, then the final's)", got)
	}
	h.checkFinal(t)
}

// TestCommitWaitsForAFlushNoLongerThanItsBound: a decision's Commit that
// writes a note of its run's call table, behind a flush in flight, waits
// for it only until the request's bound, and the note is written once the
// flush has ended. Before, the Commit waited for the flush: the trace of
// the stop-redis fault test's slowest NextDelays (89-148 ms) put 40-98 ms
// of them there, after the decision's own calls had used its 50 ms.
func TestCommitWaitsForAFlushNoLongerThanItsBound(t *testing.T) {
	srv := redistest.Standalone(t)
	s := heldStore(t, srv.Addr, &outcomeCalls{n: map[string]int{}}, redisstore.Options{Timeout: 50 * time.Millisecond})
	run, err := s.OpenRun(policy.Run{Tenant: "acme", Pool: 10, Cutoff: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("OpenRun = %v, want nil", err)
	}
	behindFlush(t, s, "Commit of a note", func() error {
		u := s.Begin()
		if err := u.NoteCall(run.ID, "doc-1", policy.CallNote{Target: "geo", Attempt: 1, Detail: "retry"}); err != nil {
			return err
		}
		return u.Commit()
	})
	eventually(t, "the note written after the flush", func() bool {
		calls, _, err := s.RunCalls(run.ID, policy.RunCallFilter{}, "", 10)
		return err == nil && len(calls) == 1 && calls[0].CallID == "doc-1"
	})
}
