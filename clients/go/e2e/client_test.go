package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// daemon is a real policyd (server and bbolt store) reached over bufconn.
type daemon struct {
	gs    *server.Server
	store *breakerstore.Store
	lis   *bufconn.Listener
	conn  *grpc.ClientConn
	admin pb.AdminServiceClient
}

func startDaemon(t testing.TB, wrap func(server.Store) server.Store) *daemon {
	t.Helper()
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(t.TempDir(), "policyd.db"), FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var s server.Store = store
	if wrap != nil {
		s = wrap(store)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	gs := server.New(s, server.Config{Logger: quiet})
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	conn, err := dialBufconn(lis)
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{gs: gs, store: store, lis: lis, conn: conn, admin: pb.NewAdminServiceClient(conn)}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		store.Close()
	})
	return d
}

// dialBufconn connects to the daemon serving lis, in plaintext, with opts.
func dialBufconn(lis *bufconn.Listener, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///policyd", append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)...)
}

// sleeps is the client's clock in tests: Sleep records the wait and moves
// the clock on at once, so no test waits.
// sleeps is the clients' Sleep and Now: a sleep returns at once and moves
// the client's clock on by its length. The clock runs from the real one
// (the daemons here tell real time), so a client that slept d is d ahead
// of the daemon, never behind it: the fleet cool-downs the daemon stamps
// end for the client when its sleep says they should.
type sleeps struct {
	mu    sync.Mutex
	d     []time.Duration
	slept time.Duration
}

func newSleeps() *sleeps { return &sleeps{} }

func (s *sleeps) Sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.slept += d
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Now().Add(s.slept)
}

func (s *sleeps) all() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}

func newClient(t testing.TB, d *daemon, mod func(*policyclient.Config)) (*policyclient.Client, *sleeps) {
	t.Helper()
	sl := newSleeps()
	cfg := policyclient.Config{Tenant: "acme", Sleep: sl.Sleep, Now: sl.Now, DecisionTimeout: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&cfg)
	}
	c, err := policyclient.New(d.conn, cfg)
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
	return c, sl
}

// script is a fake upstream: attempt n returns errs[n-1] (nil: success).
func script(errs ...error) (func(context.Context, policyclient.Attempt) error, *atomic.Int32) {
	var calls atomic.Int32
	return func(_ context.Context, a policyclient.Attempt) error {
		calls.Add(1)
		if a.Number-1 < len(errs) {
			return errs[a.Number-1]
		}
		return nil
	}, &calls
}

func statusErr(code codes.Code) error { return status.Error(code, "upstream said no") }

func TestDoDecisionPaths(t *testing.T) {
	d := startDaemon(t, nil)
	s503 := policyclient.HTTPError(503, nil)
	tests := []struct {
		name        string
		call        policyclient.Call
		errs        []error
		disposition policyclient.Disposition
		stop        string
		reason      string
		attempts    int
	}{
		{"first try", policyclient.Call{Target: "a", Idempotent: true}, nil, policyclient.Succeeded, "", "", 1},
		{"two 503 then success", policyclient.Call{Target: "b", Idempotent: true}, []error{s503, s503}, policyclient.Succeeded, "", "transient:503", 3},
		{"terminal 422", policyclient.Call{Target: "c", Idempotent: true}, []error{policyclient.HTTPError(422, nil)},
			policyclient.FailedTerminal, "TERMINAL", "terminal:422", 1},
		{"unknown error is terminal", policyclient.Call{Target: "d", Idempotent: true}, []error{errors.New("mystery")},
			policyclient.FailedTerminal, "TERMINAL", "unclassified:*errors.errorString", 1},
		{"attempts exhausted", policyclient.Call{Target: "e", Idempotent: true}, []error{s503, s503, s503},
			policyclient.DeadLetter, "ATTEMPTS_EXHAUSTED", "transient:503", 3},
		{"non-idempotent write without key", policyclient.Call{Target: "f"}, []error{s503},
			policyclient.DeadLetter, "NOT_IDEMPOTENT", "unsafe:not_idempotent", 1},
		{"non-idempotent write with a submission id", policyclient.Call{Target: "g", SubmissionID: "doc-1", Payload: []byte("x")}, []error{s503},
			policyclient.Succeeded, "", "transient:503", 2},
		{"connection reset", policyclient.Call{Target: "h", Idempotent: true}, []error{&net.OpError{Op: "read", Err: syscall.ECONNRESET}},
			policyclient.Succeeded, "", "transport:connection_reset", 2},
		{"parse error", policyclient.Call{Target: "i", Idempotent: true}, []error{policyclient.ParseError(errors.New("bad json"))},
			policyclient.FailedTerminal, "TERMINAL", "local:parse", 1},
		{"grpc unavailable", policyclient.Call{Target: "j", Idempotent: true}, []error{statusErr(codes.Unavailable)},
			policyclient.Succeeded, "", "transient:grpc_unavailable", 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := newClient(t, d, nil)
			fn, calls := script(tc.errs...)
			res, err := c.Do(context.Background(), tc.call, fn)
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			if res.Disposition != tc.disposition || res.StopReason.String() != tc.stop || res.Reason != tc.reason || res.Attempts != tc.attempts {
				t.Errorf("got %v/%q/%q after %d attempts, want %v/%q/%q after %d",
					res.Disposition, res.StopReason, res.Reason, res.Attempts, tc.disposition, tc.stop, tc.reason, tc.attempts)
			}
			if int(calls.Load()) != tc.attempts {
				t.Errorf("fn called %d times, want %d", calls.Load(), tc.attempts)
			}
			if res.Local {
				t.Errorf("decided locally with policyd up")
			}
		})
	}
}

func TestDoHonoursRetryAfter(t *testing.T) {
	d := startDaemon(t, nil)
	c, sl := newClient(t, d, nil)
	h := http.Header{}
	h.Set("Retry-After", "7")
	fn, _ := script(policyclient.HTTPError(429, h))
	res, _ := c.Do(context.Background(), policyclient.Call{Target: "geo", Idempotent: true}, fn)
	if !res.OK() {
		t.Fatalf("got %v, want success", res.Disposition)
	}
	waits := sl.all()
	if len(waits) != 1 || waits[0] < 7*time.Second {
		t.Errorf("waits: got %d (first %v), want one wait of at least the 7s Retry-After", len(waits), waits[:min(len(waits), 3)])
	}
}

func TestClosedBreakerCostsNoRPCAndOpenFailsFast(t *testing.T) {
	d := startDaemon(t, nil)
	changed := make(chan policyclient.Event, 16)
	c, _ := newClient(t, d, func(cfg *policyclient.Config) {
		cfg.OnEvent = func(e policyclient.Event) {
			if e.Kind == policyclient.EventBreakerChanged {
				changed <- e
			}
		}
	})
	ctx := context.Background()
	ok, _ := script()
	for range 10 {
		if res, _ := c.Do(ctx, policyclient.Call{Target: "geo", Idempotent: true}, ok); !res.OK() {
			t.Fatalf("got %v, want success", res.Disposition)
		}
	}
	if got := c.Stats().AdmitRPCs; got != 0 {
		t.Errorf("Admit RPCs with the breaker CLOSED: got %d, want 0", got)
	}
	if _, err := d.admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "geo"},
		State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
		t.Fatal(err)
	}
	// The cache learns of the change from the stream; from then on Do
	// refuses without calling fn or policyd.
	timeout := time.After(10 * time.Second)
	for open := false; !open; {
		select {
		case e := <-changed:
			open = e.Target == "geo" && e.Breaker == pb.BreakerState_BREAKER_STATE_OPEN
		case <-timeout:
			t.Fatal("the cache never saw OPEN")
		}
	}
	fn, calls := script()
	res, _ := c.Do(ctx, policyclient.Call{Target: "geo", Idempotent: true}, fn)
	if res.Disposition != policyclient.CircuitOpen || res.StopReason != policyclient.StopCircuitOpen || calls.Load() != 0 || res.Attempts != 0 {
		t.Errorf("open breaker: got %v/%s with %d attempts (fn called %d times), want circuit_open without calling fn",
			res.Disposition, res.StopReason, res.Attempts, calls.Load())
	}
	if got := c.Stats().AdmitRPCs; got != 0 {
		t.Errorf("Admit RPCs while known OPEN: got %d, want 0", got)
	}
	if c.Stats().FastFails == 0 {
		t.Errorf("fast fails: got 0, want the refusal counted")
	}
}

func TestPerAttemptTimeoutReachesFn(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, func(cfg *policyclient.Config) { cfg.AttemptTimeout = 3 * time.Second })
	var left time.Duration
	_, _ = c.Do(context.Background(), policyclient.Call{Target: "geo", Idempotent: true}, func(ctx context.Context, _ policyclient.Attempt) error {
		dl, ok := ctx.Deadline()
		if !ok {
			t.Errorf("fn's context has no deadline")
		}
		left = time.Until(dl)
		return nil
	})
	if left <= 0 || left > 3*time.Second {
		t.Errorf("fn's deadline: %v away, want within the 3s attempt timeout", left)
	}
}

func TestIdempotencyKeyIsStableAcrossAttempts(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, nil)
	var keys []string
	_, _ = c.Do(context.Background(), policyclient.Call{Target: "geo", SubmissionID: "doc-42", Payload: []byte(`{"a":1}`)},
		func(_ context.Context, a policyclient.Attempt) error {
			keys = append(keys, a.IdempotencyKey)
			if a.Number < 3 {
				return policyclient.HTTPError(503, nil)
			}
			return nil
		})
	want := policyclient.IdempotencyKey("doc-42", []byte(`{"a":1}`))
	if len(keys) != 3 || keys[0] != want || keys[1] != want || keys[2] != want {
		t.Errorf("keys: got %v, want %s three times", keys, want)
	}
}

func TestMisuse(t *testing.T) {
	d := startDaemon(t, nil)
	if _, err := policyclient.New(d.conn, policyclient.Config{}); err == nil {
		t.Error("New without a tenant: got nil error")
	}
	if _, err := policyclient.New(d.conn, policyclient.Config{Tenant: "a", DecisionTimeout: -1}); err == nil {
		t.Error("New with a negative timeout: got nil error")
	}
	c, _ := newClient(t, d, func(cfg *policyclient.Config) { cfg.NoWatch = true })
	if _, err := c.Do(context.Background(), policyclient.Call{Target: "t"}, nil); !errors.Is(err, policyclient.ErrNilFunc) {
		t.Errorf("nil fn: got %v, want ErrNilFunc", err)
	}
	if _, err := c.Do(context.Background(), policyclient.Call{}, func(context.Context, policyclient.Attempt) error { return nil }); !errors.Is(err, policyclient.ErrNoTarget) {
		t.Errorf("no target: got %v, want ErrNoTarget", err)
	}
}

// blockingStore never answers NextDelay or Admit until released: policyd
// is up but too slow.
type blockingStore struct {
	server.Store
	release chan struct{}
}

func (b blockingStore) Admit(k policy.BreakerKey, cfg policy.BreakerConfig) (policy.Admission, error) {
	<-b.release
	return b.Store.Admit(k, cfg)
}

func (b blockingStore) Begin() server.Changes { // NextDelay's first step
	<-b.release
	return b.Store.Begin()
}

func TestSlowPolicydFallsBackWithinTheDecisionTimeout(t *testing.T) {
	release := make(chan struct{})
	d := startDaemon(t, func(s server.Store) server.Store { return blockingStore{s, release} })
	defer close(release)
	c, _ := newClient(t, d, func(cfg *policyclient.Config) {
		cfg.DecisionTimeout = 50 * time.Millisecond
		cfg.NoWatch = true
	})
	fn, _ := script(policyclient.HTTPError(503, nil))
	res, _ := c.Do(context.Background(), policyclient.Call{Target: "geo", Idempotent: true}, fn)
	if !res.OK() || !res.Local {
		t.Errorf("got %v local=%v, want success decided locally", res.Disposition, res.Local)
	}
	if c.Stats().LocalDecisions != 1 {
		t.Errorf("local decisions: got %d, want 1", c.Stats().LocalDecisions)
	}
}

// TestPolicydStoppedMidBatch stops the daemon while 32 workers are
// retrying: every call still ends, decided locally from then on.
func TestPolicydStoppedMidBatch(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, func(cfg *policyclient.Config) {
		cfg.DecisionTimeout = 100 * time.Millisecond
		cfg.LocalBudget = 10000
	})
	ctx := context.Background()
	// Breakers that do not trip, so every call needs decisions.
	never := uint32(10000)
	if _, err := d.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Policy: &pb.Policy{
		Breaker: &pb.BreakerSettings{ConsecutiveFailures: &never}}}); err != nil {
		t.Fatal(err)
	}
	const workers, calls = 32, 20
	var done atomic.Int32
	halfway := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				fn, _ := script(policyclient.HTTPError(503, nil))
				res, err := c.Do(ctx, policyclient.Call{Target: fmt.Sprintf("t%d", w%4), Idempotent: true}, fn)
				if err != nil || res.Disposition == 0 {
					t.Errorf("Do: %v %v", res, err)
				}
				if done.Add(1) == workers*calls/4 {
					once.Do(func() { close(halfway) })
				}
			}
		}()
	}
	<-halfway
	d.gs.Stop() // policyd goes away in the middle of the batch
	wg.Wait()
	if done.Load() != workers*calls {
		t.Errorf("finished calls: got %d, want %d", done.Load(), workers*calls)
	}
	st := c.Stats()
	if st.LocalDecisions == 0 {
		t.Errorf("no local decisions after policyd stopped: %+v", st)
	}
	// The outcomes of the calls decided locally cannot reach a stopped
	// policyd; Close says so instead of hanging.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := c.Close(cctx); err == nil {
		t.Errorf("Close with policyd gone: got nil, want the unreported outcomes counted")
	}
}

func TestOutcomesAreNotLostOnClose(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := context.Background()
	if _, err := d.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "batch", Tenant: "acme", RetryPool: 10,
		CutoffTime: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	sl := newSleeps()
	c, err := policyclient.New(d.conn, policyclient.Config{Tenant: "acme", Sleep: sl.Sleep, Now: sl.Now, NoWatch: true,
		BatchSize: 64, FlushInterval: time.Hour}) // only size and Close flush
	if err != nil {
		t.Fatal(err)
	}
	ok, _ := script()
	const n = 1000
	for i := range n {
		if _, err := c.Do(ctx, policyclient.Call{Target: "geo", Idempotent: true, RunID: "batch", CallID: fmt.Sprint(i)}, ok); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	run, err := d.admin.GetRun(ctx, &pb.GetRunRequest{RunId: "batch"})
	if err != nil {
		t.Fatal(err)
	}
	if got := run.GetRun().GetLedger().GetSucceeded(); got != n {
		t.Errorf("succeeded in the ledger: got %d, want %d", got, n)
	}
	if st := c.Stats(); st.OutcomesSent != n || st.OutcomesDropped != 0 || st.ReportBatchesSent < n/64 {
		t.Errorf("stats: got %+v, want %d sent in batches, none dropped", st, n)
	}
}

// TestABatchInFlightAtCloseIsSentOnce: a report batch still in flight when
// Close begins is let finish, not cancelled. Cancelled, it would fail on
// the client after policyd had applied it, and Close's drain would send it
// again: the call's success counted twice and its lease released twice.
// The connection's interceptors hold the batch's answer until Close has
// stopped the client (its breaker watch ends then), and see whether the
// batch's context was cancelled by it.
func TestABatchInFlightAtCloseIsSentOnce(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := context.Background()
	setCeiling(t, d, "portal", 1)
	applied, watchEnded := make(chan struct{}), make(chan struct{})
	var reports, outcomes atomic.Int32
	var cancelled atomic.Bool
	report := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		r, ok := req.(*pb.ReportOutcomeRequest)
		if !ok {
			return invoke(ctx, method, req, reply, cc, opts...)
		}
		outcomes.Add(int32(len(r.GetOutcomes())))
		if reports.Add(1) > 1 {
			return invoke(ctx, method, req, reply, cc, opts...)
		}
		// policyd applies the first batch; its answer waits for Close.
		if err := invoke(context.WithoutCancel(ctx), method, req, reply, cc, opts...); err != nil {
			return err
		}
		close(applied)
		<-watchEnded
		if err := ctx.Err(); err != nil {
			cancelled.Store(true)
			return status.FromContextError(err).Err()
		}
		return nil
	}
	watch := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, stream grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		go func() { <-ctx.Done(); close(watchEnded) }()
		return stream(ctx, desc, cc, method, opts...)
	}
	conn, err := dialBufconn(d.lis, grpc.WithUnaryInterceptor(report), grpc.WithStreamInterceptor(watch))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sl := newSleeps()
	c, err := policyclient.New(conn, policyclient.Config{Tenant: "acme", Sleep: sl.Sleep, Now: sl.Now,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Ready(rctx); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	ok, _ := script()
	// The call's outcome returns its lease, so its batch is sent at once.
	if res, err := c.Do(ctx, policyclient.Call{Target: "portal", Idempotent: true}, ok); err != nil || !res.OK() {
		t.Fatalf("Do: %+v, %v", res, err)
	}
	<-applied
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if cancelled.Load() {
		t.Errorf("Close cancelled the batch in flight")
	}
	if n := outcomes.Load(); n != 1 {
		t.Errorf("outcomes sent: %d in %d batches, want the call's one sent once", n, reports.Load())
	}
	br, err := d.admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "portal"}})
	if err != nil {
		t.Fatal(err)
	}
	if b := br.GetBreaker(); b.GetLeasesInFlight() != 0 || b.GetStrayReleases() != 0 {
		t.Errorf("ceiling after Close: %d leases out, %d stray releases; want 0 and 0", b.GetLeasesInFlight(), b.GetStrayReleases())
	}
}

// TestRunPoolNeverOverspent drives 64 workers through a run whose pool is
// smaller than the retries they want.
func TestRunPoolNeverOverspent(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := context.Background()
	const pool = 50
	if _, err := d.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "r", Tenant: "acme", RetryPool: pool,
		CutoffTime: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	// A generous tenant budget and breakers that do not trip, so the run
	// pool is what binds.
	if _, err := d.admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "acme", Capacity: 10000}}); err != nil {
		t.Fatal(err)
	}
	never := uint32(10000)
	if _, err := d.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Policy: &pb.Policy{
		Breaker: &pb.BreakerSettings{ConsecutiveFailures: &never}}}); err != nil {
		t.Fatal(err)
	}
	c, _ := newClient(t, d, nil)
	var retries, budgetStops atomic.Int32
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 4 {
				res, _ := c.Do(ctx, policyclient.Call{Target: fmt.Sprintf("t%d", (w*4+i)%32), Idempotent: true, RunID: "r"},
					func(_ context.Context, a policyclient.Attempt) error {
						if a.Number < 3 {
							return policyclient.HTTPError(503, nil)
						}
						return nil
					})
				retries.Add(int32(res.Attempts - 1))
				if res.StopReason == policyclient.StopBudgetExhausted {
					budgetStops.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	run, err := d.admin.GetRun(ctx, &pb.GetRunRequest{RunId: "r"})
	if err != nil {
		t.Fatal(err)
	}
	// 256 calls want 512 retries: exactly the pool is granted, every
	// granted retry is made, and the calls left over are dead-lettered.
	if spent := run.GetRun().GetRetriesSpent(); spent != pool || retries.Load() != pool {
		t.Errorf("retries: pool %d, spent %d, made %d; want exactly the pool", pool, spent, retries.Load())
	}
	if budgetStops.Load() == 0 {
		t.Errorf("no call stopped with BUDGET_EXHAUSTED")
	}
}

func TestPolicyTimeoutFromDaemon(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := context.Background()
	if _, err := d.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Policy: &pb.Policy{AttemptTimeout: durationpb.New(2 * time.Second)}}); err != nil {
		t.Fatal(err)
	}
	c, _ := newClient(t, d, nil)
	var second time.Duration
	_, _ = c.Do(ctx, policyclient.Call{Target: "geo", Idempotent: true}, func(ctx context.Context, a policyclient.Attempt) error {
		if a.Number == 1 {
			return policyclient.HTTPError(503, nil)
		}
		dl, _ := ctx.Deadline()
		second = time.Until(dl)
		return nil
	})
	if second <= 0 || second > 2*time.Second {
		t.Errorf("second attempt's timeout: %v, want policyd's 2s", second)
	}
}

// TestACallCancelledBeforeItsDeadlineIsDeadLettered: policyd told the
// call its deadline (the policy's call_deadline, an hour away) when it
// answered RETRY; the caller cancels the call in the wait. The final
// DEAD_LETTER (DEADLINE) tells the caller's own deadline, the moment it
// ended the call, so policyd takes it into the run's ledger; it refused it
// as "needs the call's deadline to have passed", and the dead letter was
// lost (policybench replicas' load, stopped, lost one or two so a run).
func TestACallCancelledBeforeItsDeadlineIsDeadLettered(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := context.Background()
	if _, err := d.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Policy: &pb.Policy{CallDeadline: durationpb.New(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "cancelled", Tenant: "acme", RetryPool: 10,
		CutoffTime: timestamppb.New(time.Now().Add(2 * time.Hour))}); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	c, err := policyclient.New(d.conn, policyclient.Config{Tenant: "acme", NoWatch: true,
		Sleep: func(ctx context.Context, _ time.Duration) error {
			cancel() // the caller gives up while the call waits; the clock stays the daemon's
			return ctx.Err()
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	fn, _ := script(policyclient.HTTPError(503, nil))
	res, err := c.Do(cctx, policyclient.Call{Target: "geo", Idempotent: true, RunID: "cancelled"}, fn)
	if err != nil {
		t.Fatal(err)
	}
	if res.Disposition != policyclient.DeadLetter || res.StopReason != policyclient.StopDeadline || res.Local {
		t.Fatalf("result: %v (%v), local %v; want a dead letter (DEADLINE) policyd's answer led to", res.Disposition, res.StopReason, res.Local)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if st := c.Stats(); st.OutcomesDropped != 0 {
		t.Errorf("%d outcomes dropped (refused by policyd)", st.OutcomesDropped)
	}
	run, err := d.admin.GetRun(ctx, &pb.GetRunRequest{RunId: "cancelled"})
	if err != nil {
		t.Fatal(err)
	}
	if got := run.GetRun().GetLedger().GetDeadLetterDeadline(); got != 1 {
		t.Errorf("the run's ledger: %d dead letters (DEADLINE), want 1", got)
	}
}

// TestABadOutcomeDoesNotBlockTheOthers: outcomes policyd refuses for good
// (an unknown run) are found and dropped; the rest of their batch lands.
func TestABadOutcomeDoesNotBlockTheOthers(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := context.Background()
	if _, err := d.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "good", Tenant: "acme", RetryPool: 10,
		CutoffTime: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	sl := newSleeps()
	c, err := policyclient.New(d.conn, policyclient.Config{Tenant: "acme", Sleep: sl.Sleep, Now: sl.Now, NoWatch: true,
		BatchSize: 100, FlushInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ok, _ := script()
	for i := range 60 {
		run := "good"
		if i%20 == 7 {
			run = "no-such-run"
		}
		if _, err := c.Do(ctx, policyclient.Call{Target: "geo", Idempotent: true, RunID: run, CallID: fmt.Sprint(i)}, ok); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	run, err := d.admin.GetRun(ctx, &pb.GetRunRequest{RunId: "good"})
	if err != nil {
		t.Fatal(err)
	}
	if got := run.GetRun().GetLedger().GetSucceeded(); got != 57 {
		t.Errorf("succeeded in the good run: got %d, want 57", got)
	}
	if st := c.Stats(); st.OutcomesDropped != 3 || st.OutcomesSent != 57 {
		t.Errorf("stats: got %d sent, %d dropped; want 57 and 3", st.OutcomesSent, st.OutcomesDropped)
	}
}

// TestLocalFallbackHonoursPushback: with policyd too slow, the local policy
// still stops on a negative grpc-retry-pushback-ms and never undercuts a
// Retry-After, capped at an hour.
func TestLocalFallbackHonoursPushback(t *testing.T) {
	release := make(chan struct{})
	d := startDaemon(t, func(s server.Store) server.Store { return blockingStore{s, release} })
	defer close(release)
	tests := []struct {
		name   string
		header http.Header
		stop   string
		wait   time.Duration
	}{
		{"do not retry", http.Header{"Grpc-Retry-Pushback-Ms": {"-1"}}, "SERVER_PUSHBACK", 0},
		{"retry after 90s", http.Header{"Retry-After": {"90"}}, "", 90 * time.Second},
		{"absurd retry after", http.Header{"Retry-After": {"4294967295"}}, "", time.Hour},
		{"x-amz-retry-after", http.Header{"X-Amz-Retry-After": {"1500"}}, "", 1500 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, sl := newClient(t, d, func(cfg *policyclient.Config) {
				cfg.DecisionTimeout = 20 * time.Millisecond
				cfg.NoWatch = true
			})
			fn, _ := script(policyclient.HTTPError(503, tc.header))
			res, _ := c.Do(context.Background(), policyclient.Call{Target: "geo", Idempotent: true}, fn)
			if !res.Local || res.StopReason.String() != tc.stop {
				t.Fatalf("got %v/%q local=%v, want stop %q decided locally", res.Disposition, res.StopReason, res.Local, tc.stop)
			}
			if tc.wait > 0 {
				waits := sl.all()
				if len(waits) != 1 || waits[0] < tc.wait || waits[0] > tc.wait+tc.wait/10+250*time.Millisecond {
					t.Errorf("waits: got %v, want one in [%v, %v + spread]", waits, tc.wait, tc.wait)
				}
			}
		})
	}
}
