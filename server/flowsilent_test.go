package server_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// gatedFlowStore holds every AdmitFlow until gate closes: policyd is slow
// to answer.
type gatedFlowStore struct {
	server.Store
	entered chan struct{}
	gate    chan struct{}
}

func (g gatedFlowStore) AdmitFlow(key policy.BreakerKey, cfg policy.BreakerConfig, lim policy.FlowLimits) (policy.Admission, error) {
	g.entered <- struct{}{}
	<-g.gate
	return g.Store.AdmitFlow(key, cfg, lim)
}

// TestUnansweredAdmitReturnsItsLease: an Admit whose caller stopped
// waiting before the store granted the lease (a decision timeout passed)
// returns the lease at once, so a silent or slow policyd does not leave
// the ceiling's slots held by leases nobody has until they expire. Before
// the change the lease stayed out for its 15 s and the next Admit under a
// ceiling of 1 was refused concurrency:full.
func TestUnansweredAdmitReturnsItsLease(t *testing.T) {
	clk := newFakeClock()
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(t.TempDir(), "policyd.db"), Clock: clk, FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	gated := gatedFlowStore{Store: store, entered: make(chan struct{}, 1), gate: make(chan struct{})}
	serverCtx := make(chan context.Context, 1)
	handled := make(chan struct{}, 2)
	gs := server.New(gated, server.Config{Clock: clk, Rand: func() float64 { return 0.5 }},
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if info.FullMethod != pb.RetryPolicyService_Admit_FullMethodName {
				return h(ctx, req)
			}
			select {
			case serverCtx <- ctx:
			default:
			}
			defer func() { handled <- struct{}{} }()
			return h(ctx, req)
		}))
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); gs.Stop(); store.Close() })
	one := uint32(1)
	if _, err := pb.NewAdminServiceClient(conn).SetPolicy(context.Background(), &pb.SetPolicyRequest{Tenant: "acme", Target: "portal",
		Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: &one}}}); err != nil {
		t.Fatal(err)
	}
	workers := pb.NewRetryPolicyServiceClient(conn)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "portal", "doc-1"), Attempt: 1})
		done <- err
	}()
	<-gated.entered
	sctx := <-serverCtx
	cancel() // the worker's decision timeout
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("the abandoned Admit: %v, want Canceled", err)
	}
	<-sctx.Done() // the server has heard the worker go
	close(gated.gate)
	<-handled
	st, err := store.Pool(policy.BreakerKey{Tenant: "acme", Target: "portal"})
	if err != nil || st.InFlight != 0 {
		t.Fatalf("pool %+v, %v after the abandoned Admit; want its lease returned", st, err)
	}
	a, err := workers.Admit(context.Background(), &pb.AdmitRequest{Call: call("acme", "portal", "doc-2"), Attempt: 1})
	if err != nil || !a.GetAdmitted() || a.GetLeaseId() == "" {
		t.Fatalf("the next Admit under a ceiling of 1: %v, %v; want a lease", a, err)
	}
}
