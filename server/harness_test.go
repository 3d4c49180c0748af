package server_test

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// harness is a real server over a real bbolt file, reached through bufconn.
type harness struct {
	gs      *server.Server
	clock   *fakeClock
	store   *breakerstore.Store
	workers pb.RetryPolicyServiceClient
	admin   pb.AdminServiceClient
	conn    *grpc.ClientConn
}

type harnessOpt func(*server.Config, *breakerstore.Options)

// withStore lets a test wrap the store the server sees.
func newHarness(t testing.TB, opts ...harnessOpt) *harness {
	t.Helper()
	return newHarnessWrapped(t, func(s server.Store) server.Store { return s }, opts...)
}

func newHarnessWrapped(t testing.TB, wrap func(server.Store) server.Store, opts ...harnessOpt) *harness {
	t.Helper()
	clk := newFakeClock()
	cfg := server.Config{Clock: clk, Rand: func() float64 { return 0.5 }}
	sopts := breakerstore.Options{Path: filepath.Join(t.TempDir(), "policyd.db"), Clock: clk, FlushInterval: time.Hour}
	for _, o := range opts {
		o(&cfg, &sopts)
	}
	store, err := breakerstore.Open(sopts)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	gs := server.New(wrap(store), cfg)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		if err := store.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return &harness{
		gs: gs, clock: clk, store: store, conn: conn,
		workers: pb.NewRetryPolicyServiceClient(conn),
		admin:   pb.NewAdminServiceClient(conn),
	}
}

// wantCode fails the test unless err carries code; it returns the message.
func wantCode(t *testing.T, err error, code codes.Code) string {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Fatalf("got status %v (%q), want %v", st.Code(), st.Message(), code)
	}
	return st.Message()
}

func call(tenant, target, id string) *pb.CallRef {
	return &pb.CallRef{Tenant: tenant, Target: target, CallId: id, Idempotent: true}
}

func http(code uint32) *pb.Failure {
	return &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: code}}
}

func transport(k pb.TransportError) *pb.Failure {
	return &pb.Failure{Kind: &pb.Failure_TransportError{TransportError: k}}
}

// statusMsg returns the message of a status error.
func statusMsg(err error) string {
	st, _ := status.FromError(err)
	return st.Message()
}

func durationOf(d time.Duration) *durationpb.Duration { return durationpb.New(d) }
