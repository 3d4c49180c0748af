package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// loopback is a server.Server on a loopback port over a real bbolt file,
// and one client connection to it.
type loopback struct {
	srv    *server.Server
	store  *breakerstore.Store
	conn   *grpc.ClientConn
	served chan error
}

func newLoopback(t *testing.T, wrap func(server.Store) server.Store, cfg server.Config, dial ...grpc.DialOption) *loopback {
	t.Helper()
	clk := newFakeClock()
	cfg.Clock = clk
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(t.TempDir(), "policyd.db"), Clock: clk, FlushInterval: time.Hour})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &loopback{srv: server.New(wrap(store), cfg), store: store, served: make(chan error, 1)}
	go func() { l.served <- l.srv.Serve(lis) }()
	l.conn, err = grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dial...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		l.conn.Close()
		l.srv.Stop()
		if err := <-l.served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if err := store.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return l
}

// watchLive opens a breaker watch and reads its snapshot.
func watchLive(t *testing.T, conn *grpc.ClientConn, tenant string) grpc.ServerStreamingClient[pb.WatchBreakersResponse] {
	t.Helper()
	stream, err := pb.NewRetryPolicyServiceClient(conn).WatchBreakers(t.Context(), &pb.WatchBreakersRequest{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatalf("watch snapshot: %v", err)
		}
		if msg.GetSnapshotComplete() {
			return stream
		}
	}
}

// recvEnd reads a stream to its end and returns the status it ended with.
func recvEnd[T any](stream grpc.ServerStreamingClient[T]) *status.Status {
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return status.New(codes.OK, "")
			}
			return status.Convert(err)
		}
	}
}

// TestShutdownEndsStreamsAndFinishesCalls: on Shutdown every open stream
// (breaker watches and a health watch, which would otherwise hold the
// drain) ends at once with UNAVAILABLE,
// while a unary call in flight is not cut: Shutdown waits for it. Before
// server.Server, the watches held GracefulStop until the grace ran out.
func TestShutdownEndsStreamsAndFinishesCalls(t *testing.T) {
	g := gateStore{entered: make(chan struct{}), release: make(chan struct{})}
	l := newLoopback(t, func(s server.Store) server.Store { g.Store = s; return g }, server.Config{})
	var watches []grpc.ServerStreamingClient[pb.WatchBreakersResponse]
	for _, tenant := range []string{"", "a", "b"} {
		watches = append(watches, watchLive(t, l.conn, tenant))
	}
	health, err := healthpb.NewHealthClient(l.conn).Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := health.Recv(); err != nil || msg.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before the drain: got %v, %v, want SERVING", msg, err)
	}

	inFlight := make(chan error, 1)
	go func() {
		_, err := pb.NewRetryPolicyServiceClient(l.conn).Classify(context.Background(), &pb.ClassifyRequest{Call: call("a", "t", ""), Failure: http(503)})
		inFlight <- err
	}()
	<-g.entered
	stopped := make(chan error, 1)
	go func() { stopped <- l.srv.Shutdown(context.Background()) }()

	// The call is still held in the store: the streams end before it does.
	for i, w := range watches {
		if st := recvEnd(w); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "draining") {
			t.Errorf("watch %d ended with %v %q, want UNAVAILABLE draining", i, st.Code(), st.Message())
		}
	}
	if st := recvEnd(health); st.Code() != codes.Unavailable {
		t.Errorf("health watch ended with %v %q, want UNAVAILABLE", st.Code(), st.Message())
	}
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned (%v) with a call in flight", err)
	default:
	}

	close(g.release)
	if err := <-inFlight; err != nil {
		t.Errorf("the call in flight: got %v, want its answer", err)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown: got %v, want nil", err)
	}
}

// TestShutdownCutsCallsPastItsContext: when ctx ends before the calls in
// flight do, they are cut and Shutdown says so.
func TestShutdownCutsCallsPastItsContext(t *testing.T) {
	g := gateStore{entered: make(chan struct{}), release: make(chan struct{})}
	l := newLoopback(t, func(s server.Store) server.Store { g.Store = s; return g }, server.Config{})
	inFlight := make(chan error, 1)
	go func() {
		_, err := pb.NewRetryPolicyServiceClient(l.conn).Classify(context.Background(), &pb.ClassifyRequest{Call: call("a", "t", ""), Failure: http(503)})
		inFlight <- err
	}()
	<-g.entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.srv.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown past its context: got %v, want context.Canceled", err)
	}
	if code := status.Code(<-inFlight); code != codes.Unavailable {
		t.Errorf("the cut call: got %v, want UNAVAILABLE", code)
	}
	close(g.release)
}

// TestWatchCutsAClientThatDoesNotRead: a client that stops reading is cut
// with RESOURCE_EXHAUSTED once its buffer of changes is full, and its
// subscription is gone from the store. Before, the handler stayed blocked
// in Send and the store kept the subscription (and its queue) for as long
// as the client stayed connected.
func TestWatchCutsAClientThatDoesNotRead(t *testing.T) {
	// A fixed flow-control window (no BDP growth) bounds what the
	// transports hold for the client.
	l := newLoopback(t, func(s server.Store) server.Store { return s }, server.Config{WatchBuffer: 4},
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	stream := watchLive(t, l.conn, "")
	if got := l.store.Subscribers(); got != 1 {
		t.Fatalf("subscribers while watching: got %d, want 1", got)
	}
	// The client reads nothing from here on. Every flip is one message of
	// about 300 bytes; a few hundred fill the windows and the buffer.
	target := strings.Repeat("t", 250)
	flips := 0
	for ; l.store.Subscribers() > 0; flips++ {
		if flips == 20000 {
			t.Fatalf("still subscribed after %d flips", flips)
		}
		k := policy.BreakerKey{Tenant: "a", Target: fmt.Sprintf("%s%d", target, flips%2)}
		st := policy.BreakerOpen
		if flips%4 >= 2 {
			st = policy.BreakerClosed
		}
		if _, err := l.store.ForceBreaker(k, st); err != nil {
			t.Fatal(err)
		}
	}
	st := recvEnd(stream)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "fell behind; reconnect") {
		t.Errorf("the slow watch ended with %v %q after %d flips, want RESOURCE_EXHAUSTED fell behind; reconnect", st.Code(), st.Message(), flips)
	}
	t.Logf("cut after %d flips", flips)
}
