package policyclient_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/policyd/policyd/breakerstore"
	policyclient "github.com/policyd/policyd/clients/go"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

func setCeiling(t *testing.T, d *daemon, target string, n uint32) {
	t.Helper()
	noTrip := uint32(10000)
	if _, err := d.admin.SetPolicy(context.Background(), &pb.SetPolicyRequest{Tenant: "acme", Target: target,
		Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: &n},
			// The test's 503s must not trip the breaker: only the ceiling is under test.
			Breaker: &pb.BreakerSettings{ConsecutiveFailures: &noTrip}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
}

// upstream is a fake upstream that counts the requests inside it at once.
type upstream struct {
	inside, most, calls atomic.Int32
}

func (u *upstream) serve(fail bool) error {
	n := u.inside.Add(1)
	for m := u.most.Load(); n > m && !u.most.CompareAndSwap(m, n); m = u.most.Load() {
	}
	u.calls.Add(1)
	for range 20 {
		runtime.Gosched() // give the other workers a chance to pile in
	}
	u.inside.Add(-1)
	if fail {
		return policyclient.HTTPError(503, nil)
	}
	return nil
}

// TestCeilingHoldsAcrossWorkers: 16 goroutines of one client and 16 of
// another, over real gRPC, against a ceiling of 3: the fake upstream never
// sees more than 3 requests at once, every call ends in success (a third
// of first attempts fail with 503 and are retried), and every lease is
// returned by the outcomes and NextDelay.
func TestCeilingHoldsAcrossWorkers(t *testing.T) {
	d := startDaemon(t, nil)
	setCeiling(t, d, "portal", 3)
	var up upstream
	clients := make([]*policyclient.Client, 2)
	for i := range clients {
		clients[i], _ = newClient(t, d, nil)
		if !policyclient.FlowControlled(clients[i], "portal") {
			t.Fatalf("client %d: portal not known flow-controlled after the watch snapshot", i)
		}
		if policyclient.FlowControlled(clients[i], "elsewhere") {
			t.Fatalf("client %d: elsewhere known flow-controlled; it has no ceiling", i)
		}
	}
	var wg sync.WaitGroup
	var failed atomic.Int32
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%2]
			for j := range 10 {
				res, err := c.Do(context.Background(), policyclient.Call{Target: "portal", SubmissionID: fmt.Sprint("doc-", w, "-", j), Idempotent: true},
					func(_ context.Context, a policyclient.Attempt) error { return up.serve(a.Number == 1 && j%3 == 0) })
				if err != nil || !res.OK() {
					failed.Add(1)
					t.Errorf("worker %d call %d: %+v, %v", w, j, res, err)
				}
			}
		}()
	}
	wg.Wait()
	if m := up.most.Load(); m > 3 {
		t.Fatalf("the upstream saw %d requests at once; the ceiling is 3", m)
	}
	for _, c := range clients {
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	br, err := d.admin.GetBreaker(context.Background(), &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "portal"}})
	if err != nil {
		t.Fatal(err)
	}
	if n := br.GetBreaker().GetLeasesInFlight(); n != 0 {
		t.Fatalf("%d leases still out after every call ended; want all returned", n)
	}
	if s := br.GetBreaker().GetStrayReleases(); s != 0 {
		t.Fatalf("%d stray releases; the clients returned leases they did not hold", s)
	}
	t.Logf("%d upstream calls, at most %d at once", up.calls.Load(), up.most.Load())
}

// TestCeilingSetLaterIsLearnt: a client that skips Admit while CLOSED
// learns of a ceiling set after it started from its next outcome report,
// and from then on asks for leases.
func TestCeilingSetLaterIsLearnt(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, nil)
	ok := func(context.Context, policyclient.Attempt) error { return nil }
	do := func(id string) {
		t.Helper()
		if res, err := c.Do(context.Background(), policyclient.Call{Target: "portal", SubmissionID: id}, ok); err != nil || !res.OK() {
			t.Fatalf("Do: %+v, %v", res, err)
		}
	}
	do("doc-1")
	if n := c.Stats().AdmitRPCs; n != 0 {
		t.Fatalf("%d Admit RPCs without a ceiling, want 0", n)
	}
	setCeiling(t, d, "portal", 2)
	do("doc-2") // still on the fast path: nothing told the client yet
	policyclient.FlushOutcomes(context.Background(), c)
	if !policyclient.FlowControlled(c, "portal") {
		t.Fatalf("portal not flow-controlled after an outcome report of it")
	}
	do("doc-3")
	if n := c.Stats().AdmitRPCs; n != 1 {
		t.Fatalf("%d Admit RPCs after the ceiling was learnt, want 1", n)
	}
	policyclient.FlushOutcomes(context.Background(), c)
	st, err := d.store.Pool(policy.BreakerKey{Tenant: "acme", Target: "portal"})
	if err != nil || st.InFlight != 0 {
		t.Fatalf("pool %+v, %v: want the lease returned by the outcome", st, err)
	}
}

// TestRateCeilingIsWaitedOut: under max_rate 10/s (burst 1) a client's
// calls wait the exact GCRA wait before their attempts, without counting
// an attempt: 5 calls at one instant make 5 attempts and wait 100ms
// before each but the first. The daemon and the client share one fake
// clock, which the client's waits move.
func TestRateCeilingIsWaitedOut(t *testing.T) {
	sl := newSleeps()
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(t.TempDir(), "policyd.db"), FlushInterval: time.Hour, Clock: sl})
	if err != nil {
		t.Fatal(err)
	}
	gs := server.New(store, server.Config{Clock: sl, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///policyd",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); gs.Stop(); store.Close() })
	rate := 10.0
	if _, err := pb.NewAdminServiceClient(conn).SetPolicy(context.Background(), &pb.SetPolicyRequest{Tenant: "acme", Target: "portal",
		Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxRate: &rate}}}); err != nil {
		t.Fatal(err)
	}
	c, err := policyclient.New(conn, policyclient.Config{Tenant: "acme", Sleep: sl.Sleep, Now: sl.Now, DecisionTimeout: 2 * time.Second,
		NoWatch: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	for i := range 5 {
		res, err := c.Do(context.Background(), policyclient.Call{Target: "portal", SubmissionID: fmt.Sprint("doc-", i)},
			func(context.Context, policyclient.Attempt) error { return nil })
		if err != nil || !res.OK() || res.Attempts != 1 {
			t.Fatalf("call %d: %+v, %v; want success in 1 attempt", i, res, err)
		}
	}
	want := []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond}
	if got := sl.all(); !slices.Equal(got, want) {
		t.Fatalf("waits %v, want %v", got, want)
	}
	if st := c.Stats(); st.Attempts != 5 {
		t.Fatalf("%d attempts counted, want 5: waiting for the rate is no attempt", st.Attempts)
	}
}
