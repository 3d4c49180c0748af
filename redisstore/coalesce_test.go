package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// backgroundTrips are the round trips a replica makes whatever its
// requests (the feeds, the heartbeat, the breaker cache's reads, a new
// connection's handshake), as policybench replicas-sweep leaves them out.
var backgroundTrips = map[string]bool{"xread": true, "zadd": true, "zrange": true, "zremrangebyscore": true,
	"pipeline zadd": true, "smembers": true, "policyd_read": true, "hello": true, "pipeline client": true}

// requestTrips are the round trips of s since before that are not
// background ones, by call.
func requestTrips(s *Store, before map[string]uint64) map[string]uint64 {
	got := map[string]uint64{}
	for call, n := range s.RoundTrips() {
		if d := n - before[call]; d > 0 && !backgroundTrips[call] {
			got[call] = d
		}
	}
	return got
}

// until yields until cond holds; the test fails if it does not within a
// minute (a guard against a hang, not a timing assertion).
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	give := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(give) {
			t.Fatalf("waited a minute for %s", what)
		}
		runtime.Gosched()
	}
}

// full reports whether q has as many round trips in flight as it takes,
// sent (not gathering calls to go with them): a call made now waits in the
// queue for the next one.
func (q *coalescer) full() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.trips == q.maxTrips() && !q.gathering
}

// TestConcurrentNextDelaysShareARoundTrip: NextDelays asked while
// another's call is in flight (Redis stopped, so that all of them are
// asked before it ends) go to Redis together in the next round trip, one
// pipeline, and each gets its own answer: a budget spend of its own (the
// tenant's tokens counted down once per call, no two alike) that its
// attempt record replays; the one call among them that Redis refuses
// (NOTFOUND) fails alone.
func TestConcurrentNextDelaysShareARoundTrip(t *testing.T) {
	srv := redistest.Standalone(t)
	shareARoundTrip(t, []*redistest.Server{srv}, redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}))
}

// TestConcurrentNextDelaysShareARoundTripCluster is the same over the
// tenants of a Cluster of three masters: one pipeline, split by master.
func TestConcurrentNextDelaysShareARoundTripCluster(t *testing.T) {
	nodes := redistest.ClusterNodes(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr)
	}
	shareARoundTrip(t, nodes, redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true}))
}

func shareARoundTrip(t *testing.T, servers []*redistest.Server, c redis.UniversalClient) {
	t.Cleanup(func() { _ = c.Close() })
	now := time.Now() // fixed: the buckets do not refill
	// The timeout (a minute) is longer than the test keeps Redis stopped.
	s, err := Open(context.Background(), Options{Client: c, Timeout: time.Minute, Clock: func() time.Time { return now },
		BatchOutcomes: true, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	// One round trip in flight, so that every call asked meanwhile waits
	// for it and the count below is exact; with more, two ending together
	// may each take part of the queue (TestCoalescerHandsEveryRoundTripOn).
	s.lib.q.most = 1
	const capacity = 1000
	tenants := []string{"acme", "beta", "gamma", "delta"}
	d := server.NewDecisions(s, server.Config{})
	ctx := context.Background()
	req := func(tenant, id string) *pb.NextDelayRequest {
		return &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: tenant, Target: "t-" + id, CallId: id, Idempotent: true},
			Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}}
	}
	for _, tn := range tenants {
		if _, err := s.SetBudget(policy.TenantBudget{Tenant: tn, Capacity: capacity, DepositRatio: 0.1, MinPerSecond: 1,
			RetryCost: 1, TimeoutCost: 2}); err != nil {
			t.Fatal(err)
		}
		// The replica follows the tenant: its requests make no other call.
		if _, err := d.NextDelay(ctx, req(tn, "warm")); err != nil {
			t.Fatal(err)
		}
	}
	// The replica reloads each budget from the changes feed, an HGET each,
	// in the background: all of them before the count below starts.
	until(t, "the budgets reloaded", func() bool { return s.RoundTrips()["hget"] >= uint64(len(tenants)) })
	for _, srv := range servers {
		srv.Pause(t)
	}
	before := s.RoundTrips()
	type answer struct {
		tenant, id string
		resp       *pb.NextDelayResponse
		err        error
	}
	const n = 12
	answers := make([]answer, n)
	var wg sync.WaitGroup
	ask := func(i int) {
		defer wg.Done()
		a := &answers[i]
		a.tenant, a.id = tenants[i%len(tenants)], "c"+strconv.Itoa(i)
		a.resp, a.err = d.NextDelay(ctx, req(a.tenant, a.id))
	}
	wg.Add(1)
	go ask(0)
	until(t, "the first NextDelay's call in flight", s.lib.q.full)
	for i := 1; i < n; i++ {
		wg.Add(1)
		go ask(i)
	}
	var readErr error
	wg.Add(1)
	go func() { // a read Redis refuses, in the same round trip
		defer wg.Done()
		ctx, cancel := s.call()
		defer cancel()
		_, readErr = s.lib.runROSlice(ctx, "policyd_key_read", []string{keyIdem("acme", "never-claimed")})
	}()
	until(t, "every other call queued", func() bool { return s.lib.q.queued() == n })
	for _, srv := range servers {
		srv.Resume(t)
	}
	wg.Wait()

	got := requestTrips(s, before)
	var total uint64
	for _, v := range got {
		total += v
	}
	if total != 2 || got["policyd_nextdelay"] != 1 {
		t.Errorf("round trips of %d concurrent calls: %v, want the first's policyd_nextdelay and one pipeline", n+1, got)
	}
	if !redisNotFound(readErr) {
		t.Errorf("policyd_key_read of a key never claimed: %v, want its own NOTFOUND", readErr)
	}
	tokens := map[string][]float64{}
	for _, a := range answers {
		if a.err != nil || a.resp.GetDecision() != pb.Decision_DECISION_RETRY || a.resp.GetDegraded() {
			t.Fatalf("NextDelay %s/%s: %v, %v; want a RETRY from the engine", a.tenant, a.id, a.resp, a.err)
		}
		tokens[a.tenant] = append(tokens[a.tenant], a.resp.GetTenantBudgetRemaining())
		replay, err := d.NextDelay(ctx, req(a.tenant, a.id))
		if err != nil || replay.GetTenantBudgetRemaining() != a.resp.GetTenantBudgetRemaining() ||
			replay.GetDelay().AsDuration() != a.resp.GetDelay().AsDuration() {
			t.Errorf("NextDelay %s/%s asked again: %v, %v; want its first answer replayed: %v", a.tenant, a.id, replay, err, a.resp)
		}
	}
	for _, tn := range slices.Sorted(maps.Keys(tokens)) {
		got := slices.Sorted(slices.Values(tokens[tn]))
		var want []float64
		for i := range len(got) { // after the warm-up's retry
			want = append(want, capacity-1-float64(len(got)-i))
		}
		if !slices.Equal(got, want) {
			t.Errorf("tokens left after each of %s's NextDelays: %v, want %v (one spend each)", tn, got, want)
		}
	}
}

// TestCoalescedCallsWithRedisStoppedAreUnavailable: with Redis stopped,
// every one of concurrent calls ends with ErrUnavailable at its timeout,
// queued or sent, and NextDelays asked meanwhile are answered in degraded
// mode.
func TestCoalescedCallsWithRedisStoppedAreUnavailable(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s, err := Open(context.Background(), Options{Client: c, Timeout: 50 * time.Millisecond, BatchOutcomes: true, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	d := server.NewDecisions(s, server.Config{})
	ctx := context.Background()
	req := func(id string) *pb.NextDelayRequest {
		return &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: id, Idempotent: true},
			Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}}
	}
	if _, err := d.NextDelay(ctx, req("warm")); err != nil {
		t.Fatal(err)
	}
	srv.Pause(t)
	const n = 16
	reads := make([]error, n)
	degraded := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			ctx, cancel := s.call()
			defer cancel()
			_, reads[i] = s.lib.runROSlice(ctx, "policyd_key_read", []string{keyIdem("acme", "k"+strconv.Itoa(i))})
		}()
		go func() {
			defer wg.Done()
			resp, err := d.NextDelay(ctx, req("c"+strconv.Itoa(i)))
			degraded[i] = err == nil && resp.GetDegraded()
		}()
	}
	wg.Wait()
	for i := range n {
		if !errors.Is(reads[i], ErrUnavailable) {
			t.Errorf("call %d with Redis stopped: %v, want ErrUnavailable", i, reads[i])
		}
		if !degraded[i] {
			t.Errorf("NextDelay %d with Redis stopped: not answered in degraded mode", i)
		}
	}
}

// endable is a context whose deadline passes when the test says so
// (expire): a queued call's deadline, moved without a clock.
type endable struct {
	context.Context
	done chan struct{}
}

func (c *endable) expire()               { close(c.done) }
func (c *endable) Done() <-chan struct{} { return c.done }
func (c *endable) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// TestQueuedCallPastItsDeadlineIsNotSent: a call whose deadline passes
// while it waits for the round trip in flight gets ErrUnavailable at once
// and is never sent; neither the round trip in flight nor the calls after
// it are disturbed.
func TestQueuedCallPastItsDeadlineIsNotSent(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s, err := Open(context.Background(), Options{Client: c, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	s.lib.q.most = 1 // one round trip in flight: the next call waits
	srv.Pause(t)
	before := s.RoundTrips()
	first := make(chan error, 1)
	go func() {
		ctx, cancel := s.call()
		defer cancel()
		_, err := s.lib.runROSlice(ctx, "policyd_key_read", []string{keyIdem("acme", "first")})
		first <- err
	}()
	until(t, "the first call in flight", s.lib.q.full)
	late := &endable{Context: context.Background(), done: make(chan struct{})}
	queued := make(chan error, 1)
	go func() {
		queued <- s.lib.q.do(late, redis.NewCmd(late, "set", "{acme}:never-sent", "1"))
	}()
	until(t, "the second call queued", func() bool { return s.lib.q.queued() == 1 })
	late.expire()
	if err := <-queued; !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a queued call past its deadline: %v, want ErrUnavailable for the deadline", err)
	}
	srv.Resume(t)
	if err := <-first; !redisNotFound(err) {
		t.Errorf("the call in flight: %v, want its NOTFOUND", err)
	}
	if got := requestTrips(s, before); fmt.Sprint(got) != "map[policyd_key_read:1]" {
		t.Errorf("round trips: %v, want the first call's alone", got)
	}
	if n, err := c.Exists(context.Background(), "{acme}:never-sent").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS of the key the expired call would set: %d, %v; want 0", n, err)
	}
	ctx, cancel := s.call()
	defer cancel()
	if _, err := s.lib.runROSlice(ctx, "policyd_key_read", []string{keyIdem("acme", "next")}); !redisNotFound(err) {
		t.Errorf("a call after them: %v, want its NOTFOUND", err)
	}
}

// TestCoalescedCallsOfAFailedMasterFailAlone: on a Cluster, a round trip
// that carries calls to several masters keeps the replies of the masters
// that answered; only the calls of the master that failed (killed while
// stopped, a call of its in flight) are ErrUnavailable. Failed before the
// pipeline hook kept them: every call of the round trip was unavailable.
func TestCoalescedCallsOfAFailedMasterFailAlone(t *testing.T) {
	nodes := redistest.ClusterNodes(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	h := &health{clock: time.Now, b: engineBreaker{Threshold: 100, Cooldown: time.Second}}
	var trips roundTrips
	c.AddHook(h.hook(&trips))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q := &coalescer{c: c, base: ctx, most: 1} // the next call waits for the first's round trip
	var failing, answering string             // tenants on the master killed and on another
	for i := 0; failing == "" || answering == ""; i++ {
		tn := "t" + strconv.Itoa(i)
		m, err := c.MasterForKey(ctx, keyIdem(tn, "k"))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case m.Options().Addr == nodes[0].Addr && failing == "":
			failing = tn
		case m.Options().Addr != nodes[0].Addr && answering == "":
			answering = tn
		}
	}
	nodes[0].Pause(t)
	cmds := []*redis.Cmd{redis.NewCmd(ctx, "get", keyIdem(failing, "first")),
		redis.NewCmd(ctx, "set", keyIdem(failing, "k"), "1"), redis.NewCmd(ctx, "set", keyIdem(answering, "k"), "1")}
	errs := make([]error, len(cmds))
	var wg sync.WaitGroup
	do := func(i int) {
		defer wg.Done()
		if errs[i] = q.do(ctx, cmds[i]); errs[i] == nil {
			errs[i] = cmds[i].Err()
		}
	}
	wg.Add(1)
	go do(0)
	until(t, "the first call in flight", q.full)
	wg.Add(2)
	go do(1)
	go do(2)
	until(t, "the other two queued", func() bool { return q.queued() == 2 })
	nodes[0].Kill()
	wg.Wait()
	for i, what := range []string{"the call in flight", "the queued call to the failed master"} {
		if !errors.Is(errs[i], ErrUnavailable) {
			t.Errorf("%s: %v, want ErrUnavailable", what, errs[i])
		}
	}
	if errs[2] != nil || cmds[2].Val() != "OK" {
		t.Errorf("the queued call to a master that answered: %v, %v; want its own OK", cmds[2].Val(), errs[2])
	}
}

// TestCoalescerHandsEveryRoundTripOn: many callers through a coalescer of
// several round trips in flight all get their replies, and once they are
// done no round trip is counted in flight. Failed before a call told to
// lead left the queue at once: two round trips ending together both told
// the first call waiting to lead, one of them lost its place, and once
// every place was lost each call waited forever.
func TestCoalescerHandsEveryRoundTripOn(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: 16})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	for _, most := range []int{2, 4} {
		q := &coalescer{c: c, base: ctx, most: most}
		const callers, calls = 32, 200
		errs := make(chan error, callers)
		for i := range callers {
			go func() {
				for j := range calls {
					key := "{acme}:n" + strconv.Itoa(i)
					cmd := redis.NewIntCmd(ctx, "incr", key)
					if err := q.do(ctx, cmd); err != nil || cmd.Err() != nil || cmd.Val() != int64(j+1) {
						errs <- fmt.Errorf("caller %d call %d: %v, %v, %d", i, j, err, cmd.Err(), cmd.Val())
						return
					}
				}
				errs <- nil
			}()
		}
		for range callers {
			select {
			case err := <-errs:
				if err != nil {
					t.Fatalf("%d round trips in flight: %v", most, err)
				}
			case <-time.After(time.Minute): // a guard against the hang, not a timing
				t.Fatalf("%d round trips in flight: callers still waiting after a minute, %d round trips counted in flight, %d queued",
					most, q.inFlight(), q.queued())
			}
		}
		if n := q.inFlight(); n != 0 || q.queued() != 0 {
			t.Errorf("%d round trips in flight: after every call, %d counted in flight and %d queued; want none", most, n, q.queued())
		}
		c.FlushAll(ctx)
	}
}

// inFlight is the number of round trips q counts in flight.
func (q *coalescer) inFlight() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.trips
}

// tripSizes is a go-redis hook that records each round trip's number of
// commands: 1 for a command alone, the pipeline's length for a pipeline;
// a new connection's handshake (HELLO, CLIENT SETINFO) left out.
type tripSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (h *tripSizes) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *tripSizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.add([]redis.Cmder{cmd}); return next(ctx, cmd) }
}

func (h *tripSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.add(cmds); return next(ctx, cmds) }
}

func (h *tripSizes) add(cmds []redis.Cmder) {
	if len(cmds) > 0 && (cmds[0].Name() == "hello" || cmds[0].Name() == "client") {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sizes = append(h.sizes, len(cmds))
}

// take returns the sizes recorded since the last take.
func (h *tripSizes) take() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.sizes
	h.sizes = nil
	return s
}

// isGathering reports whether a call going out is yielding for others.
func (q *coalescer) isGathering() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.gathering
}

// TestCoalescerGathersReadyCalls: a call that finds a round trip free
// yields before it sends, and the calls made during its yield (requests
// ready to run on the replica) go with it, one pipeline, each with its
// own reply; a call with nothing made during its yield goes alone, as
// without a coalescer. The yield is the test's: it returns once the other
// calls are queued, as runtime.Gosched returns once the goroutines ready
// to run have had the processor.
func TestCoalescerGathersReadyCalls(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	sizes := &tripSizes{}
	c.AddHook(sizes)
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil { // the connection's handshake, not counted below
		t.Fatal(err)
	}
	sizes.take()
	q := &coalescer{c: c, base: ctx}
	const n = 8
	var first sync.Once
	q.yield = func() {
		first.Do(func() { until(t, "the other calls queued", func() bool { return q.queued() == n-1 }) })
	}
	replies := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	call := func(i int) {
		defer wg.Done()
		cmd := redis.NewStringCmd(ctx, "echo", "call "+strconv.Itoa(i))
		if errs[i] = q.do(ctx, cmd); errs[i] == nil {
			replies[i], errs[i] = cmd.Result()
		}
	}
	wg.Add(1)
	go call(0)
	until(t, "the first call yielding", q.isGathering)
	for i := 1; i < n; i++ {
		wg.Add(1)
		go call(i)
	}
	wg.Wait()
	for i := range n {
		if want := "call " + strconv.Itoa(i); errs[i] != nil || replies[i] != want {
			t.Errorf("call %d: %q, %v; want its own reply %q", i, replies[i], errs[i], want)
		}
	}
	if got := sizes.take(); !slices.Equal(got, []int{n}) {
		t.Errorf("round trips of %d calls made during the first one's yield: %v commands; want one pipeline of %d", n, got, n)
	}
	cmd := redis.NewStringCmd(ctx, "echo", "alone")
	if err := q.do(ctx, cmd); err != nil || cmd.Val() != "alone" {
		t.Errorf("a call alone: %q, %v; want its reply", cmd.Val(), err)
	}
	if got := sizes.take(); !slices.Equal(got, []int{1}) {
		t.Errorf("round trips of a call with nothing made during its yield: %v commands; want it alone", got)
	}
	if q.inFlight() != 0 || q.queued() != 0 {
		t.Errorf("after every call: %d round trips counted in flight, %d queued; want none", q.inFlight(), q.queued())
	}
}
