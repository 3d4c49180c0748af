package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// gateStore holds Resolve until released, keeping calls in flight.
type gateStore struct {
	server.Store
	entered chan struct{}
	release chan struct{}
}

func (g gateStore) Resolve(tenant, target string) (policy.Policy, policy.PolicyEntry) {
	g.entered <- struct{}{}
	<-g.release
	return g.Store.Resolve(tenant, target)
}

func TestShedsBeyondMaxInFlight(t *testing.T) {
	g := gateStore{entered: make(chan struct{}), release: make(chan struct{})}
	h := newHarnessWrapped(t, func(s server.Store) server.Store { g.Store = s; return g },
		func(c *server.Config, _ *breakerstore.Options) {
			c.Shedder = server.NewShedder(1, 250*time.Millisecond)
		})
	ctx := context.Background()
	first := make(chan error, 1)
	go func() {
		_, err := h.workers.Classify(ctx, &pb.ClassifyRequest{Call: call("a", "t", ""), Failure: http(503)})
		first <- err
	}()
	<-g.entered // the first call is in flight
	_, err := h.workers.Classify(ctx, &pb.ClassifyRequest{Call: call("a", "t", ""), Failure: http(503)})
	msg := wantCode(t, err, codes.ResourceExhausted)
	if !strings.Contains(msg, "--max-in-flight") {
		t.Errorf("message %q does not name the cap", msg)
	}
	var retry *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			retry = ri
		}
	}
	if retry == nil || retry.GetRetryDelay().AsDuration() != 250*time.Millisecond {
		t.Errorf("RetryInfo: got %v, want 250ms", retry)
	}
	close(g.release)
	if err := <-first; err != nil {
		t.Errorf("the call in flight: %v", err)
	}
}

func TestOversizedMessage(t *testing.T) {
	h := newHarness(t)
	// The client may send it; the server (here at grpc-go's 4 MiB default,
	// --max-message-bytes in the daemon) refuses it.
	huge := strings.Repeat("x", 5<<20)
	_, err := h.workers.Classify(context.Background(), &pb.ClassifyRequest{Call: &pb.CallRef{Tenant: "a", Target: huge}, Failure: http(503)},
		grpc.MaxCallSendMsgSize(8<<20))
	wantCode(t, err, codes.ResourceExhausted)
}

// TestCallsWhileDrainingAreUnavailable: once a graceful stop begins, new
// calls on an open connection get UNAVAILABLE.
func TestCallsWhileDrainingAreUnavailable(t *testing.T) {
	g := gateStore{entered: make(chan struct{}), release: make(chan struct{})}
	h := newHarnessWrapped(t, func(s server.Store) server.Store { g.Store = s; return g })
	ctx := context.Background()
	first := make(chan error, 1)
	go func() {
		_, err := h.workers.Classify(ctx, &pb.ClassifyRequest{Call: call("a", "t", ""), Failure: http(503)})
		first <- err
	}()
	<-g.entered
	stopped := make(chan struct{})
	go func() { _ = h.gs.Shutdown(ctx); close(stopped) }()
	// Draining: the server refuses new streams on the connection.
	var err error
	for range 1000 {
		_, err = h.workers.PlanBudget(ctx, &pb.PlanBudgetRequest{Window: durationOf(time.Minute)})
		if err != nil {
			break
		}
	}
	wantCode(t, err, codes.Unavailable)
	close(g.release)
	if err := <-first; err != nil {
		t.Errorf("the call in flight during the drain: %v", err)
	}
	<-stopped
}

func TestBreakersPerTenantCap(t *testing.T) {
	h := newHarness(t, func(_ *server.Config, o *breakerstore.Options) { o.MaxBreakersPerTenant = 2 })
	ctx := context.Background()
	for _, target := range []string{"a", "b"} {
		if _, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", target, ""), Attempt: 1}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "c", ""), Attempt: 1})
	msg := wantCode(t, err, codes.ResourceExhausted)
	if !strings.Contains(msg, "2") {
		t.Errorf("message %q does not give the cap", msg)
	}
	// Another tenant has its own allowance.
	if _, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("globex", "c", ""), Attempt: 1}); err != nil {
		t.Errorf("another tenant: %v", err)
	}
}

func TestTenantAndRunCaps(t *testing.T) {
	h := newHarness(t, func(_ *server.Config, o *breakerstore.Options) {
		o.MaxTenants = 1
		o.MaxRuns = 1
	})
	ctx := context.Background()
	nd := func(tenant string) error {
		_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call(tenant, "geo", "c"), Attempt: 1, Failure: http(503)})
		return err
	}
	if err := nd("acme"); err != nil {
		t.Fatal(err)
	}
	msg := wantCode(t, nd("globex"), codes.ResourceExhausted)
	if !strings.Contains(msg, "cap 1") {
		t.Errorf("tenant cap message %q does not give the cap", msg)
	}
	open := func(id string) error {
		_, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: id, Tenant: "acme", RetryPool: 3, CutoffTime: timestampIn(h, time.Hour)})
		return err
	}
	if err := open("r1"); err != nil {
		t.Fatal(err)
	}
	msg = wantCode(t, open("r2"), codes.ResourceExhausted)
	if !strings.Contains(msg, "cap 1") {
		t.Errorf("run cap message %q does not give the cap", msg)
	}
}
