package redisstore_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
)

// TestNextDelayIsOneCall counts, on a real server, what fresh NextDelays
// of calls without a fallback chain or a lease cost: one function call
// each (policyd_nextdelay) and no other command on the request path,
// RETRYs and STOPs alike; the audit records, and the STOPs' attempt
// tallies, go with the replica's next flush, counted apart: one
// policyd_outcomes call for the tenant's held batch.
func TestNextDelayIsOneCall(t *testing.T) {
	srv := redistest.Standalone(t)
	nextDelayIsOneCall(t, statsOf(t, srv.Addr), func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) })
}

// TestNextDelayIsOneCallCluster is the same on a Cluster of three masters.
func TestNextDelayIsOneCallCluster(t *testing.T) {
	addrs := redistest.Cluster(t)
	nextDelayIsOneCall(t, statsOf(t, addrs...), func() redis.UniversalClient {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	})
}

func nextDelayIsOneCall(t *testing.T, stats serverStats, client func() redis.UniversalClient) {
	// The flusher's interval is an hour: nothing flushes on its own while
	// the NextDelays are counted.
	opts := redisstore.Options{Timeout: 2 * time.Second, BatchOutcomes: true, FlushInterval: time.Hour}
	r := []*replica{newReplicaWith(t, client, opts), newReplicaWith(t, client, opts), newReplicaWith(t, client, opts)}
	ctx := context.Background()
	// The calls spread over 100 targets, 3 failures at most each: no breaker
	// trips (5 consecutive failures).
	call := func(id string, target int) *pb.CallRef {
		return &pb.CallRef{Tenant: "acme", Target: "t" + strconv.Itoa(target), CallId: id, Idempotent: true}
	}
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	for i, rp := range r { // a replica's first call of a tenant follows its stream
		if _, err := rp.workers.Admit(ctx, &pb.AdmitRequest{Call: call("warm"+strconv.Itoa(i), 0), Attempt: 1}); err != nil {
			t.Fatal(err)
		}
		rp.store.FlushHeld()
		rp.trips.take()
	}
	const n = 120 // 80 retries: the default budget (100 tokens) grants them all
	before := stats.calls(t)
	stops := 0
	for i := range n {
		// attempt 3 of 3 is a STOP (ATTEMPTS_EXHAUSTED), counted in the
		// attempt statistics; attempts 1 and 2 are RETRYs.
		attempt := uint32(1 + i/3%3) // over the replicas alike

		resp, err := r[i%3].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("c"+strconv.Itoa(i), i%100), Attempt: attempt, Failure: fail503})
		if err != nil {
			t.Fatalf("NextDelay %d = %v", i, err)
		}
		want := pb.Decision_DECISION_RETRY
		if attempt == 3 {
			want, stops = pb.Decision_DECISION_STOP, stops+1
		}
		if resp.GetDecision() != want {
			t.Fatalf("NextDelay %d (attempt %d) = %v, want %v", i, attempt, resp.GetDecision(), want)
		}
	}
	after := stats.calls(t)
	trips, by := 0, map[string]int{}
	for _, rp := range r {
		m, cmds := rp.trips.take()
		trips += m
		for k, v := range cmds {
			by[k] += v
		}
	}
	fcalls := after["fcall"] - before["fcall"]
	t.Logf("%d fresh NextDelays (%d STOPs) over 3 replicas: %d round trips from the replicas (%v), %d FCALLs on the server",
		n, stops, trips, by, fcalls)
	if trips != n || by["fcall"] != n || len(by) != 1 {
		t.Errorf("%d fresh NextDelays took %d round trips (%v), want %d: one function call each and nothing else", n, trips, by, n)
	}
	if fcalls != n {
		t.Errorf("%d fresh NextDelays: %d FCALLs on the server, want %d", n, fcalls, n)
	}

	// Calls of a run: one function call too, once the replica has read
	// the run (its cut-off never changes: KnownRun); their call-table
	// notes are held with the tallies.
	if _, err := r[0].admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "nightly", Tenant: "acme", RetryPool: 1000,
		CutoffTime: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	inRun := func(id string, target int) *pb.CallRef { c := call(id, target); c.RunId = "nightly"; return c }
	for i, rp := range r {
		if _, err := rp.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: inRun("warm"+strconv.Itoa(i), 0), Attempt: 1, Failure: fail503}); err != nil {
			t.Fatal(err)
		}
		rp.trips.take()
	}
	const inRuns = 30
	before = stats.calls(t)
	for i := range inRuns {
		if _, err := r[i%3].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: inRun("n"+strconv.Itoa(i), 50+i), Attempt: 1, Failure: fail503}); err != nil {
			t.Fatalf("NextDelay of a run %d = %v", i, err)
		}
	}
	fcalls = stats.calls(t)["fcall"] - before["fcall"]
	trips, by = 0, map[string]int{}
	for _, rp := range r {
		m, cmds := rp.trips.take()
		trips += m
		for k, v := range cmds {
			by[k] += v
		}
	}
	t.Logf("%d fresh NextDelays of a run's calls: %d round trips (%v), %d FCALLs on the server", inRuns, trips, by, fcalls)
	if trips != inRuns || by["fcall"] != inRuns || len(by) != 1 || fcalls != inRuns {
		t.Errorf("%d fresh NextDelays of a run's calls took %d round trips (%v, %d FCALLs on the server), want one function call each", inRuns, trips, by, fcalls)
	}

	// The flush, apart: each replica's held batch of the tenant's tallies
	// and notes (one function call, and the notes' calls in its pipeline),
	// and its buffered audit records.
	for _, rp := range r {
		rp.store.FlushHeld()
	}
	flushed := 0
	for _, rp := range r {
		m, cmds := rp.trips.take()
		flushed += m
		if m != 1 {
			t.Errorf("a replica's flush of held NextDelay tallies and notes: %d round trips (%v), want one pipeline", m, cmds)
		}
	}
	t.Logf("the flush of the held tallies: %d round trips over 3 replicas", flushed)
	adv, err := r[0].admin.AdviseTargets(ctx, &pb.AdviseTargetsRequest{Tenant: "acme", Since: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatalf("AdviseTargets: %v", err)
	}
	var counted uint64
	for _, a := range adv.GetAdvice() {
		counted += a.GetFailuresByAttempt()[2]
	}
	if counted != uint64(stops) {
		t.Errorf("after the flush, %d calls ended at attempt 3 in the attempt statistics, want %d", counted, stops)
	}
	// A query flushes the replica's own audit buffer; another replica's
	// records are there once it has flushed.
	for _, rp := range r {
		if _, err := rp.admin.QueryAudit(ctx, &pb.QueryAuditRequest{CallId: "c0"}); err != nil {
			t.Fatalf("QueryAudit: %v", err)
		}
	}
	for _, rp := range r {
		for i := range 3 {
			q, err := rp.admin.QueryAudit(ctx, &pb.QueryAuditRequest{CallId: "c" + strconv.Itoa(i)})
			if err != nil || len(q.GetRecords()) != 1 || q.GetRecords()[0].GetEvent() != pb.AuditEvent_AUDIT_EVENT_DECISION {
				t.Errorf("QueryAudit(c%d) = %v, %v; want its decision once the replicas' buffers are flushed", i, q.GetRecords(), err)
			}
		}
	}
}

// TestNextDelayCountsTheHeldResultsFirst: with outcomes held for the
// flush, a NextDelay decided in one call takes its breaker's held results
// along, so the breaker counts a success reported before the failure
// first. Four failures, a reported success, then a fifth failure leave the
// breaker (5 in a row trip it) CLOSED with one failure in a row; counted
// in the engine's order instead, the success would come after the five
// failures and the breaker would be OPEN. Failed before the held results
// went with the call.
func TestNextDelayCountsTheHeldResultsFirst(t *testing.T) {
	srv := redistest.Standalone(t)
	r := newReplicaWith(t, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) },
		redisstore.Options{Timeout: 2 * time.Second, BatchOutcomes: true, FlushInterval: time.Hour})
	ctx := context.Background()
	call := func(id string) *pb.CallRef {
		return &pb.CallRef{Tenant: "acme", Target: "geo", CallId: id, Idempotent: true}
	}
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	nextDelay := func(id string) *pb.NextDelayResponse {
		t.Helper()
		resp, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call(id), Attempt: 1, Failure: fail503})
		if err != nil {
			t.Fatalf("NextDelay %s: %v", id, err)
		}
		return resp
	}
	for i := range 4 {
		nextDelay("f" + strconv.Itoa(i))
	}
	if _, err := r.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("s"), Attempt: 1, Success: true, Latency: durationpb.New(time.Millisecond)}}}); err != nil {
		t.Fatalf("ReportOutcome: %v", err)
	}
	if resp := nextDelay("f4"); resp.GetBreakerState() != pb.BreakerState_BREAKER_STATE_CLOSED {
		t.Fatalf("the fifth failure, after a reported success: breaker %v, want CLOSED", resp.GetBreakerState())
	}
	r.store.FlushHeld()
	br, err := r.store.Breaker(policy.BreakerKey{Tenant: "acme", Target: "geo"})
	if err != nil || br.State != policy.BreakerClosed || br.ConsecutiveFailures != 1 {
		t.Errorf("after the flush: breaker %v with %d in a row, %v; want CLOSED with 1", br.State, br.ConsecutiveFailures, err)
	}
}

// TestRoundTripsCountsEachCall: Store.RoundTrips (the daemon's
// policyd_store_round_trips_total) counts a fresh NextDelay as one
// policyd_nextdelay round trip, and nothing else on the request's path.
func TestRoundTripsCountsEachCall(t *testing.T) {
	srv := redistest.Standalone(t)
	r := newReplicaWith(t, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) },
		redisstore.Options{Timeout: 2 * time.Second, BatchOutcomes: true, FlushInterval: time.Hour})
	ctx := context.Background()
	fail := &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "warm", Idempotent: true},
		Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}}
	if _, err := r.workers.NextDelay(ctx, fail); err != nil { // the replica follows the tenant's stream
		t.Fatal(err)
	}
	// The feed, the heartbeat, the cache's reads and a new connection's
	// handshake (go-redis's pipeline of CLIENT SETINFO) are not the
	// request's.
	background := map[string]bool{"xread": true, "zadd": true, "zrange": true, "zremrangebyscore": true,
		"smembers": true, "policyd_read": true, "hello": true, "pipeline client": true}
	before := r.store.RoundTrips()
	fail.Call.CallId = "c1"
	if _, err := r.workers.NextDelay(ctx, fail); err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for call, n := range r.store.RoundTrips() {
		if d := n - before[call]; d > 0 && !background[call] {
			got[call] = d
		}
	}
	if len(got) != 1 || got["policyd_nextdelay"] != 1 {
		t.Errorf("round trips of one fresh NextDelay: %v, want policyd_nextdelay 1 and nothing else", got)
	}
}

// durations is a RoundTripObserver that keeps what it observes.
type durations struct {
	mu   sync.Mutex
	secs []float64
}

func (d *durations) Observe(s float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.secs = append(d.secs, s)
}

// TestRoundTripObserverTimesEachRoundTrip: Options.RoundTripObserver (the
// daemon's policyd_store_round_trip_seconds) takes one duration for each
// round trip the replica counts, its blocking feed reads (xread) left out,
// and the NextDelays' policyd_nextdelay round trips among them.
func TestRoundTripObserverTimesEachRoundTrip(t *testing.T) {
	srv := redistest.Standalone(t)
	obs := &durations{}
	r := newReplicaWith(t, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) },
		redisstore.Options{Timeout: 2 * time.Second, BatchOutcomes: true, RoundTripObserver: obs})
	ctx := context.Background()
	for i := range 5 {
		if _, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo",
			CallId: "c" + strconv.Itoa(i), Idempotent: true}, Attempt: 1,
			Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}}); err != nil {
			t.Fatal(err)
		}
	}
	r.stop() // every round trip has ended
	trips := r.store.RoundTrips()
	var counted uint64
	for call, n := range trips {
		if call != "xread" {
			counted += n
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if trips["xread"] == 0 || trips["policyd_nextdelay"] < 5 {
		t.Fatalf("round trips %v: want the feed's xreads and the 5 NextDelays'", trips)
	}
	if uint64(len(obs.secs)) != counted {
		t.Errorf("%d round trips timed, %d counted besides the xreads (%v); want each timed once", len(obs.secs), counted, trips)
	}
	for _, s := range obs.secs {
		if !(s > 0) {
			t.Errorf("a round trip timed at %gs; want a duration > 0", s)
		}
	}
}

// TestNextDelayWaitsForTheEngineOnce: a NextDelay whose one call ends at
// the store's timeout (Redis stopped) is answered in degraded mode from
// that, with no other round trip: the batch path's calls would each wait
// out the timeout again while fewer than DownAfter calls in a row have
// failed. Failed before (policyd_nextdelay, then hgetall and policyd_record
// waiting in turn).
func TestNextDelayWaitsForTheEngineOnce(t *testing.T) {
	srv := redistest.Standalone(t)
	r := newReplicaWith(t, func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	}, redisstore.Options{Timeout: 50 * time.Millisecond, DownAfter: 3, BatchOutcomes: true, FlushInterval: time.Hour})
	ctx := context.Background()
	req := &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "warm", Idempotent: true},
		Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}}
	if _, err := r.workers.NextDelay(ctx, req); err != nil { // the replica follows the tenant and knows the breaker
		t.Fatal(err)
	}
	background := map[string]bool{"xread": true, "zadd": true, "zrange": true, "zremrangebyscore": true,
		"pipeline zadd": true, "smembers": true, "policyd_read": true, "hello": true, "pipeline client": true}
	srv.Pause(t)
	defer srv.Resume(t)
	before := r.store.RoundTrips()
	req.Call.CallId = "c1"
	resp, err := r.workers.NextDelay(ctx, req)
	if err != nil || !resp.GetDegraded() || resp.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("NextDelay with Redis stopped: %v, %v; want a degraded RETRY", resp, err)
	}
	got := map[string]uint64{}
	for call, n := range r.store.RoundTrips() {
		if d := n - before[call]; d > 0 && !background[call] {
			got[call] = d
		}
	}
	if len(got) != 1 || got["policyd_nextdelay"] != 1 {
		t.Errorf("round trips of a NextDelay with Redis stopped: %v, want the one policyd_nextdelay", got)
	}
}

// TestAdmitOfARunsCallMakesNoRoundTrip: an Admit of a call of a run, on a
// CLOSED breaker, is answered from the replica's cache as any other, the
// run's cut-off taken from what the replica knows of the run (KnownRun:
// it never changes), not read again at every Admit (server/cutoff_test.go
// has the refusal past it). It was one HGETALL of the run an Admit, and a
// second wait for the engine in an Admit whose run read timed out.
func TestAdmitOfARunsCallMakesNoRoundTrip(t *testing.T) {
	srv := redistest.Standalone(t)
	r := newReplicaWith(t, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) },
		redisstore.Options{Timeout: 2 * time.Second, BatchOutcomes: true, FlushInterval: time.Hour})
	ctx := context.Background()
	if _, err := r.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "nightly", Tenant: "acme", RetryPool: 10,
		CutoffTime: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	inRun := func(run, id string) *pb.AdmitRequest {
		return &pb.AdmitRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: id, RunId: run}, Attempt: 1}
	}
	if a, err := r.workers.Admit(ctx, inRun("nightly", "warm")); err != nil || !a.GetAdmitted() {
		t.Fatalf("Admit of a run's call = %v, %v; want it admitted", a, err) // the replica follows the tenant
	}
	before := r.store.RoundTrips()
	for i := range 20 {
		if a, err := r.workers.Admit(ctx, inRun("nightly", "c"+strconv.Itoa(i))); err != nil || !a.GetAdmitted() {
			t.Fatalf("Admit of a run's call = %v, %v; want it admitted", a, err)
		}
	}
	background := map[string]bool{"xread": true, "zadd": true, "zrange": true, "zremrangebyscore": true,
		"smembers": true, "policyd_read": true, "hello": true, "pipeline client": true}
	got := map[string]uint64{}
	for call, n := range r.store.RoundTrips() {
		if d := n - before[call]; d > 0 && !background[call] {
			got[call] = d
		}
	}
	if len(got) != 0 {
		t.Errorf("round trips of 20 Admits of a run's calls on a CLOSED breaker: %v, want none", got)
	}
	if a, err := r.workers.Admit(ctx, inRun("nightly", "cut")); err != nil || !a.GetRunCutoffTime().IsValid() {
		t.Errorf("Admit of a run's call = %v, %v; want the run's cut-off in the answer", a, err)
	}
	if _, err := r.workers.Admit(ctx, &pb.AdmitRequest{Call: &pb.CallRef{Tenant: "other", Target: "geo", CallId: "x", RunId: "nightly"},
		Attempt: 1}); status.Code(err) != codes.NotFound {
		t.Errorf("Admit of a call naming another tenant's run: %v, want NOT_FOUND", err)
	}
}

// TestNextDelayWaitingForAFlushWaitsOnce: a NextDelay that finds a flush of
// held outcomes in flight waits for it (the breaker counts the held
// results first), and that wait counts in its own bound: when the flush's
// round trip keeps it past the store's timeout, as it does while the
// engine stops answering, it decides in degraded mode at once, without a
// round trip of its own and without taking the held results. It waited
// for the flush, then up to the timeout again in its own call
// (policybench replicas --store-timeout 20ms, stop-redis: NextDelays of
// 42 ms).
func TestNextDelayWaitingForAFlushWaitsOnce(t *testing.T) {
	srv := redistest.Standalone(t)
	r := newReplicaWith(t, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) },
		redisstore.Options{Timeout: 50 * time.Millisecond, BatchOutcomes: true, FlushInterval: time.Hour, DownAfter: 1000})
	ctx := context.Background()
	fail := &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "warm", Idempotent: true},
		Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}}
	eventually(t, "a NextDelay answered by the engine (a store call of 50ms may time out on a loaded machine)", func() bool {
		resp, err := r.workers.NextDelay(ctx, fail)
		return err == nil && !resp.GetDegraded()
	})
	waits := make(chan context.Context, 1)
	redisstore.OnHeldWait(r.store, func(c context.Context) {
		select {
		case waits <- c:
		default:
		}
	})
	release := redisstore.HoldHeldSending(r.store) // a flush in flight, its round trip unanswered
	before := r.store.RoundTrips()
	type answer struct {
		resp *pb.NextDelayResponse
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		req := &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "c1", Idempotent: true},
			Attempt: 1, Failure: fail.Failure}
		resp, err := r.workers.NextDelay(ctx, req)
		done <- answer{resp, err}
	}()
	callCtx := <-waits // the NextDelay waits for the flush
	<-callCtx.Done()   // and its time runs out meanwhile
	release()
	a := <-done
	if a.err != nil || !a.resp.GetDegraded() {
		t.Errorf("NextDelay whose time went waiting for a flush = %v, %v; want an answer flagged degraded", a.resp, a.err)
	}
	if n := r.store.RoundTrips()["policyd_nextdelay"] - before["policyd_nextdelay"]; n != 0 {
		t.Errorf("NextDelay whose time went waiting for a flush made %d policyd_nextdelay round trips, want none", n)
	}
}

// TestNextDelayWaitsForAFlushNoLongerThanItsBound: a NextDelay that finds
// a flush of held outcomes in flight stops waiting for it at its own
// deadline and decides in degraded mode, the flush still in flight. It
// waited for the flush's end instead: when Redis stopped, a request
// queued behind a flush that itself waited for a request's call held it
// up to two timeouts (policybench replicas, stop-redis: NextDelays of
// 91-107 ms at --store-timeout 50ms).
func TestNextDelayWaitsForAFlushNoLongerThanItsBound(t *testing.T) {
	srv := redistest.Standalone(t)
	r := newReplicaWith(t, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) },
		redisstore.Options{Timeout: 50 * time.Millisecond, BatchOutcomes: true, FlushInterval: time.Hour, DownAfter: 1000})
	ctx := context.Background()
	fail := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	eventually(t, "a NextDelay answered by the engine (a store call of 50ms may time out on a loaded machine)", func() bool {
		resp, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "warm",
			Idempotent: true}, Attempt: 1, Failure: fail})
		return err == nil && !resp.GetDegraded()
	})
	release := redisstore.HoldHeldSending(r.store) // a flush in flight, its round trip unanswered
	defer release()
	done := make(chan *pb.NextDelayResponse, 1)
	go func() {
		resp, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "c1",
			Idempotent: true}, Attempt: 1, Failure: fail})
		if err != nil {
			t.Errorf("NextDelay behind a flush in flight: %v", err)
		}
		done <- resp
	}()
	select {
	case resp := <-done:
		if !resp.GetDegraded() {
			t.Errorf("NextDelay behind a flush in flight past its deadline = %v; want an answer flagged degraded", resp)
		}
	case <-time.After(10 * time.Second): // a bound on the failure, not a wait: the answer is due at 50ms
		t.Fatal("NextDelay still waiting 10s for a flush in flight; its deadline was 50ms")
	}
}
