package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// replica is a real policyd (server and bbolt store of its own) on a
// loopback port, which counts the decision RPCs that reach it. The client
// behaviour under test does not depend on the replicas sharing state, so
// each has its own file.
type replica struct {
	addr  string
	gs    *server.Server
	admin pb.AdminServiceClient

	decisions atomic.Int64 // NextDelay and Admit calls received
	answered  atomic.Int64 // of those, answered while the replica served
	// holdNext, when set, holds the first NextDelay that arrives until its
	// connection is cut, and closes held then.
	holdNext atomic.Bool
	held     chan struct{}
	// holdClaim does the same for the first ClaimKey.
	holdClaim atomic.Bool
	// notServing makes the health service answer NOT_SERVING, while the
	// replica still answers every other call.
	notServing atomic.Bool
	// watched receives a value when a WatchBreakers stream opens; with
	// watchGate set, the stream then waits for it to close.
	watched   chan struct{}
	watchGate atomic.Pointer[chan struct{}]
}

func startReplica(t *testing.T) *replica {
	t.Helper()
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(t.TempDir(), "policyd.db"), FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{held: make(chan struct{}), watched: make(chan struct{}, 16)}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r.gs = server.New(store, server.Config{Logger: quiet}, grpc.ChainUnaryInterceptor(r.unary), grpc.ChainStreamInterceptor(r.stream))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = lis.Addr().String()
	go func() { _ = r.gs.Serve(lis) }()
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.admin = pb.NewAdminServiceClient(conn)
	t.Cleanup(func() {
		conn.Close()
		r.gs.Stop()
		store.Close()
	})
	return r
}

func (r *replica) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	switch info.FullMethod {
	case pb.RetryPolicyService_NextDelay_FullMethodName:
		r.decisions.Add(1)
		if r.holdNext.CompareAndSwap(true, false) {
			close(r.held)
			<-ctx.Done() // the connection is cut under the call
			return nil, ctx.Err()
		}
	case pb.RetryPolicyService_Admit_FullMethodName:
		r.decisions.Add(1)
	case pb.RetryPolicyService_ClaimKey_FullMethodName:
		if r.holdClaim.CompareAndSwap(true, false) {
			close(r.held)
			<-ctx.Done()
			return nil, ctx.Err()
		}
		return handler(ctx, req)
	default:
		return handler(ctx, req)
	}
	resp, err := handler(ctx, req)
	if err == nil && ctx.Err() == nil {
		r.answered.Add(1)
	}
	return resp, err
}

func (r *replica) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	switch info.FullMethod {
	case healthpb.Health_Watch_FullMethodName:
		if r.notServing.Load() {
			if err := ss.SendMsg(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}); err != nil {
				return err
			}
			<-ss.Context().Done()
			return ss.Context().Err()
		}
	case pb.RetryPolicyService_WatchBreakers_FullMethodName:
		r.watched <- struct{}{}
		if gate := r.watchGate.Load(); gate != nil {
			<-*gate
		}
	}
	return handler(srv, ss)
}

// forceOpen forces tenant acme's breaker of target OPEN on r.
func (r *replica) forceOpen(t *testing.T, target string) {
	t.Helper()
	if _, err := r.admin.ForceBreaker(context.Background(), &pb.ForceBreakerRequest{
		Key: &pb.BreakerKey{Tenant: "acme", Target: target}, State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
		t.Fatal(err)
	}
}

func startReplicas(t *testing.T, n int) ([]*replica, []string) {
	t.Helper()
	var rs []*replica
	var addrs []string
	for range n {
		r := startReplica(t)
		rs, addrs = append(rs, r), append(addrs, r.addr)
	}
	return rs, addrs
}

// dialReplicas is a client of every replica in addrs, on a fake clock.
func dialReplicas(t *testing.T, addrs []string, mod func(*policyclient.Config)) *policyclient.Client {
	t.Helper()
	sl := newSleeps()
	cfg := policyclient.Config{Tenant: "acme", Sleep: sl.Sleep, Now: sl.Now, DecisionTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&cfg)
	}
	c, err := policyclient.DialReplicas(addrs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	if !cfg.NoWatch {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Ready(ctx); err != nil {
			t.Fatalf("Ready: %v", err)
		}
	}
	return c
}

// waitFor waits for ch, failing the test after 10s.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s never happened", what)
	}
}

// TestReplicasSurviveTheDeathOfOne: a client of three replicas spreads its
// decisions over all three; when one is stopped with a decision in flight,
// that decision and every later one are answered by the other two, within
// the decision timeout (none is decided locally, which is what a decision
// past the timeout would be).
func TestReplicasSurviveTheDeathOfOne(t *testing.T) {
	rs, addrs := startReplicas(t, 3)
	c := dialReplicas(t, addrs, nil)
	dead := rs[0]
	dead.holdNext.Store(true)

	const workers, perPhase = 6, 10
	killed := make(chan struct{})
	var wg sync.WaitGroup
	results := make(chan policyclient.Result, 2*workers*perPhase)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2 * perPhase {
				if i == perPhase {
					<-killed
				}
				fn, _ := script(policyclient.HTTPError(503, nil))
				// A target per call: the 503s must not open a breaker.
				target := fmt.Sprintf("geo-%d-%d", w, i)
				res, err := c.Do(context.Background(), policyclient.Call{Target: target, Idempotent: true}, fn)
				if err != nil {
					t.Errorf("Do: %v", err)
				}
				results <- res
			}
		}()
	}
	waitFor(t, dead.held, "a NextDelay held on the replica to stop")
	dead.gs.Stop()
	before := []int64{dead.decisions.Load(), rs[1].decisions.Load(), rs[2].decisions.Load()}
	// A call already in the stopped server's transport may still reach its
	// interceptor (Stop does not wait for handlers), but its connection is
	// gone: what must not happen is an answer from it.
	answeredBefore := dead.answered.Load()
	close(killed)
	wg.Wait()
	close(results)

	n := 0
	for res := range results {
		n++
		if !res.OK() || res.Attempts != 2 || res.Local {
			t.Errorf("call %d: got %v after %d attempts (local %v), want success after 2 decided by policyd",
				n, res.Disposition, res.Attempts, res.Local)
		}
	}
	if n != 2*workers*perPhase {
		t.Errorf("calls: got %d, want %d", n, 2*workers*perPhase)
	}
	if got := c.Stats().LocalDecisions; got != 0 {
		t.Errorf("local decisions: got %d, want 0", got)
	}
	after := []int64{dead.decisions.Load(), rs[1].decisions.Load(), rs[2].decisions.Load()}
	t.Logf("decision RPCs per replica: %v at the stop, %v at the end", before, after)
	if got := dead.answered.Load() - answeredBefore; before[0] == 0 || got != 0 {
		t.Errorf("stopped replica: %d decisions before the stop and %d answered after, want some before and none after", before[0], got)
	}
	for i := 1; i < 3; i++ {
		if after[i] == before[i] {
			t.Errorf("replica %d: no decision after the stop, want the calls spread over both survivors", i)
		}
	}
}

// TestReplicasSkipOneNotServing: a replica whose health says NOT_SERVING
// (as policyd's does from the start of a drain) gets no decision, though
// it would answer.
func TestReplicasSkipOneNotServing(t *testing.T) {
	rs, addrs := startReplicas(t, 3)
	rs[0].notServing.Store(true)
	c := dialReplicas(t, addrs, func(cfg *policyclient.Config) { cfg.NoWatch = true }) // every attempt asks Admit
	for i := range 30 {
		fn, _ := script(policyclient.HTTPError(503, nil))
		if res, _ := c.Do(context.Background(), policyclient.Call{Target: fmt.Sprint("geo-", i), Idempotent: true}, fn); !res.OK() || res.Local {
			t.Fatalf("got %v (local %v), want success decided by policyd", res.Disposition, res.Local)
		}
	}
	got := []int64{rs[0].decisions.Load(), rs[1].decisions.Load(), rs[2].decisions.Load()}
	if got[0] != 0 || got[1] == 0 || got[2] == 0 {
		t.Errorf("decision RPCs per replica: got %v, want none on the NOT_SERVING replica 0 and some on 1 and 2", got)
	}
}

// TestWatchResumesOnAnotherReplicaFromItsSnapshot: when the replica that
// serves the client's WatchBreakers stops, the watch subscribes to another
// replica and the cache becomes that replica's snapshot: a breaker OPEN
// only on the stopped replica is forgotten, the new replica's own OPEN
// breaker and one forced OPEN while the client was between streams are
// known, all without an Admit RPC.
func TestWatchResumesOnAnotherReplicaFromItsSnapshot(t *testing.T) {
	rs, addrs := startReplicas(t, 3)
	targets := []string{"only-on-0", "only-on-1", "only-on-2"}
	for i, r := range rs {
		r.forceOpen(t, targets[i])
	}
	c := dialReplicas(t, addrs, nil)
	// Find the replica the watch follows.
	var w int
	select {
	case <-rs[0].watched:
	case <-rs[1].watched:
		w = 1
	case <-rs[2].watched:
		w = 2
	case <-time.After(10 * time.Second):
		t.Fatal("no replica saw the watch")
	}
	ctx := context.Background()
	fastFails := func(target string) bool {
		t.Helper()
		fn, calls := script()
		res, err := c.Do(ctx, policyclient.Call{Target: target, Idempotent: true}, fn)
		if err != nil {
			t.Fatalf("Do %s: %v", target, err)
		}
		if res.Disposition == policyclient.CircuitOpen && calls.Load() == 0 {
			return true
		}
		if !res.OK() {
			t.Fatalf("Do %s: got %v, want circuit_open or success", target, res.Disposition)
		}
		return false
	}
	if !fastFails(targets[w]) {
		t.Fatalf("before the stop: %s, OPEN on the watched replica %d, was let through", targets[w], w)
	}

	// The survivors hold the next subscription until a breaker has been
	// forced OPEN on them, so it is forced while the client has no stream.
	gate := make(chan struct{})
	var survivors []*replica
	for i, r := range rs {
		if i != w {
			r.watchGate.Store(&gate)
			survivors = append(survivors, r)
		}
	}
	rs[w].gs.Stop()
	var next int
	select {
	case <-survivors[0].watched:
	case <-survivors[1].watched:
		next = 1
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not subscribe again")
	}
	for _, r := range survivors {
		r.forceOpen(t, "forced-in-the-gap")
	}
	close(gate)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Ready(rctx); err != nil {
		t.Fatalf("Ready after the stop: %v", err)
	}

	admits := c.Stats().AdmitRPCs
	var nextIndex int
	for i, r := range rs {
		if r == survivors[next] {
			nextIndex = i
		}
	}
	for i, target := range targets {
		if want := i == nextIndex; fastFails(target) != want {
			t.Errorf("after the move from replica %d to %d: %s fast-fails %v, want %v", w, nextIndex, target, !want, want)
		}
	}
	if !fastFails("forced-in-the-gap") {
		t.Errorf("a breaker forced OPEN between the two streams was let through")
	}
	if got := c.Stats().AdmitRPCs - admits; got != 0 {
		t.Errorf("Admit RPCs after the watch resumed: got %d, want 0 (all answered from the cache)", got)
	}
}

// TestAClaimOnAReplicaThatDiesGoesToAnother: a ClaimKey in flight on a
// replica that is stopped is sent to another replica, as a decision is,
// within the decision timeout: the call's write is made under a claim
// (a survivor holds the key's record; the replicas here do not share a
// store, so which state it is in depends on where CompleteKey went)
// rather than without the idempotency ledger.
func TestAClaimOnAReplicaThatDiesGoesToAnother(t *testing.T) {
	rs, addrs := startReplicas(t, 3)
	c := dialReplicas(t, addrs, func(cfg *policyclient.Config) { cfg.NoWatch = true })
	for _, r := range rs {
		r.holdClaim.Store(true)
	}
	res := make(chan policyclient.Result, 1)
	go func() {
		r, err := c.Do(context.Background(), policyclient.Call{Target: "grants-portal", IdempotencyKey: "doc-1", CallID: "doc-1"},
			func(_ context.Context, a policyclient.Attempt) error { a.SetResultRef("rec-1"); return nil })
		if err != nil {
			t.Error(err)
		}
		res <- r
	}()
	var dead *replica
	select {
	case <-rs[0].held:
		dead = rs[0]
	case <-rs[1].held:
		dead = rs[1]
	case <-rs[2].held:
		dead = rs[2]
	case <-time.After(10 * time.Second):
		t.Fatal("no ClaimKey reached a replica")
	}
	for _, r := range rs {
		r.holdClaim.Store(false)
	}
	dead.gs.Stop()
	r := <-res
	if !r.OK() || r.Local {
		t.Fatalf("got %v (local %v), want success", r.Disposition, r.Local)
	}
	recorded := 0
	for _, s := range rs {
		if s == dead {
			continue
		}
		if _, err := pb.NewRetryPolicyServiceClient(dialConn(t, s.addr)).GetKey(context.Background(),
			&pb.GetKeyRequest{Tenant: "acme", IdempotencyKey: "doc-1"}); err == nil {
			recorded++
		}
	}
	if recorded == 0 {
		t.Errorf("no survivor holds a record of doc-1: the write went without a claim")
	}
}

// dialConn is a plaintext connection to addr, closed at the end of the test.
func dialConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
