package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/test/bufconn"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/clients/go/policyclient"
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
		// The clients tell the daemon's time and skip their waits: a clock
		// moved by every worker's wait for a lease would run minutes ahead
		// of the daemon's, which then refuses the calls' origin times and
		// leaves the decisions to the clients.
		clients[i], _ = newClient(t, d, func(cfg *policyclient.Config) {
			cfg.Now, cfg.Sleep = time.Now, func(ctx context.Context, _ time.Duration) error { return ctx.Err() }
		})
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
	for i, c := range clients {
		if n := c.Stats().LocalDecisions; n != 0 {
			t.Errorf("client %d decided %d times locally; policyd answers every decision here", i, n)
		}
	}
	if m := up.most.Load(); m > 3 {
		t.Fatalf("the upstream saw %d requests at once; the ceiling is 3", m)
	}
	// A target without a ceiling still costs no Admit on the CLOSED path.
	before := clients[0].Stats().AdmitRPCs
	if res, err := clients[0].Do(context.Background(), policyclient.Call{Target: "elsewhere", SubmissionID: "doc-x"},
		func(context.Context, policyclient.Attempt) error { return nil }); err != nil || !res.OK() {
		t.Fatalf("Do(elsewhere): %+v, %v", res, err)
	}
	if n := clients[0].Stats().AdmitRPCs - before; n != 0 {
		t.Fatalf("%d Admit RPCs for a target without a ceiling, want 0", n)
	}
	if before == 0 {
		t.Fatalf("no Admit RPCs for a target with a ceiling")
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
// learns of a ceiling set after it started from policyd's next answer
// about the target (here NextDelay's), and from then on asks for leases,
// returning them with the outcome.
func TestCeilingSetLaterIsLearnt(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, nil)
	do := func(id string, fn func(context.Context, policyclient.Attempt) error) {
		t.Helper()
		if res, err := c.Do(context.Background(), policyclient.Call{Target: "portal", SubmissionID: id, Idempotent: true}, fn); err != nil || !res.OK() {
			t.Fatalf("Do: %+v, %v", res, err)
		}
	}
	ok := func(context.Context, policyclient.Attempt) error { return nil }
	do("doc-1", ok)
	if n := c.Stats().AdmitRPCs; n != 0 {
		t.Fatalf("%d Admit RPCs without a ceiling, want 0", n)
	}
	setCeiling(t, d, "portal", 2)
	// Attempt 1 still takes the fast path; its failure's NextDelay says
	// the target has a ceiling, so attempt 2 asks Admit for a lease.
	do("doc-2", func(_ context.Context, a policyclient.Attempt) error {
		if a.Number == 1 {
			return policyclient.HTTPError(503, nil)
		}
		return nil
	})
	if n := c.Stats().AdmitRPCs; n != 1 {
		t.Fatalf("%d Admit RPCs after the ceiling was learnt, want 1", n)
	}
	do("doc-3", ok)
	if n := c.Stats().AdmitRPCs; n != 2 {
		t.Fatalf("%d Admit RPCs for the next call, want 2", n)
	}
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := d.store.Pool(policy.BreakerKey{Tenant: "acme", Target: "portal"})
	if err != nil || st.InFlight != 0 {
		t.Fatalf("pool %+v, %v: want every lease returned by the outcomes", st, err)
	}
}

// fixedClock is a clock and a sleeper for the client and the daemon at
// once: time moves only by the client's sleeps.
type fixedClock struct {
	mu  sync.Mutex
	now time.Time
	d   []time.Duration
}

func (c *fixedClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fixedClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.d = append(c.d, d)
	c.mu.Unlock()
	return ctx.Err()
}

func (c *fixedClock) all() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.d...)
}

// TestRateCeilingIsWaitedOut: under max_rate 10/s (burst 1) a client's
// calls wait the exact GCRA wait before their attempts, without counting
// an attempt: 5 calls at one instant make 5 attempts and wait 100ms
// before each but the first. The daemon and the client share one fake
// clock, which the client's waits move.
func TestRateCeilingIsWaitedOut(t *testing.T) {
	sl := &fixedClock{now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(t.TempDir(), "policyd.db"), FlushInterval: time.Hour, Clock: sl})
	if err != nil {
		t.Fatal(err)
	}
	gs := server.New(store, server.Config{Clock: sl, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	conn, err := dialBufconn(lis)
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
