package e2e_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// grpcReply is one answer of the flaky gRPC upstream: a status code and
// the grpc-retry-pushback-ms trailer, if any.
type grpcReply struct {
	code     codes.Code
	pushback string
}

// flakyGRPC is a health service on loopback whose nth call (Check or
// Watch) fails or succeeds as script[n-1] says, the last entry from then
// on; a Watch that succeeds sends SERVING and ends.
type flakyGRPC struct {
	healthpb.UnimplementedHealthServer
	mu     sync.Mutex
	script []grpcReply
	keys   []string // the idempotency-key metadata of each call
}

func (f *flakyGRPC) next(ctx context.Context) grpcReply {
	md, _ := metadata.FromIncomingContext(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, append(md.Get(policyclient.KeyMetadata), "")[0])
	return f.script[min(len(f.keys), len(f.script))-1]
}

func (r grpcReply) err(ctx context.Context) error {
	if r.pushback != "" {
		grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", r.pushback))
	}
	if r.code == codes.OK {
		return nil
	}
	return status.Error(r.code, "upstream says "+r.code.String())
}

func (f *flakyGRPC) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := f.next(ctx).err(ctx); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (f *flakyGRPC) Watch(_ *healthpb.HealthCheckRequest, stream grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	if err := f.next(stream.Context()).err(stream.Context()); err != nil {
		return err
	}
	return stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

func (f *flakyGRPC) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.keys...)
}

// startFlakyGRPC serves f on a loopback port and returns a health client
// whose calls go through the client's interceptors, made with opts.
func startFlakyGRPC(t *testing.T, f *flakyGRPC, c *policyclient.Client, describe policyclient.DescribeFunc,
	opts ...policyclient.InterceptorOption) healthpb.HealthClient {
	t.Helper()
	conn := dialFlakyGRPC(t, f, grpc.WithUnaryInterceptor(policyclient.UnaryClientInterceptor(c, describe, opts...)),
		grpc.WithStreamInterceptor(policyclient.StreamClientInterceptor(c, describe, opts...)))
	return healthpb.NewHealthClient(conn)
}

// dialFlakyGRPC serves f on a loopback port and returns a connection to
// it, dialled with opts.
func dialFlakyGRPC(t *testing.T, f *flakyGRPC, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, f)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
	})
	return conn
}

func idempotent(context.Context, string) policyclient.Call {
	return policyclient.Call{Target: "health", Idempotent: true}
}

func TestUnaryInterceptor(t *testing.T) {
	d := startDaemon(t, nil)
	tests := []struct {
		name     string
		describe policyclient.DescribeFunc
		script   []grpcReply
		code     codes.Code
		calls    int
		minWait  time.Duration
	}{
		{"retried with the pushback trailer honoured", idempotent,
			[]grpcReply{{codes.Unavailable, "4000"}, {codes.ResourceExhausted, ""}, {codes.OK, ""}}, codes.OK, 3, 4 * time.Second},
		{"terminal status at once", idempotent, []grpcReply{{codes.InvalidArgument, ""}}, codes.InvalidArgument, 1, 0},
		{"negative pushback: not retried", idempotent, []grpcReply{{codes.Unavailable, "-1"}}, codes.Unavailable, 1, 0},
		{"attempts run out", idempotent, []grpcReply{{codes.Unavailable, ""}}, codes.Unavailable, 3, 0},
		{"not idempotent, no key: not retried", nil, []grpcReply{{codes.Unavailable, ""}, {codes.OK, ""}}, codes.Unavailable, 1, 0},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, sl := newClient(t, d, nil)
			up := &flakyGRPC{script: tc.script}
			describe := tc.describe
			if describe != nil { // a target of its own, so no case sees another's breaker
				describe = func(ctx context.Context, method string) policyclient.Call {
					call := tc.describe(ctx, method)
					call.Target += "-" + strconv.Itoa(i)
					return call
				}
			}
			health := startFlakyGRPC(t, up, c, describe)
			resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
			if got := status.Code(err); got != tc.code {
				t.Fatalf("Check: got %v (%v), want %v", got, err, tc.code)
			}
			if tc.code == codes.OK && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("response: got %v, want SERVING", resp.GetStatus())
			}
			if got := len(up.seen()); got != tc.calls {
				t.Errorf("upstream saw %d calls, want %d", got, tc.calls)
			}
			if waits := sl.all(); tc.minWait > 0 && (len(waits) == 0 || waits[0] < tc.minWait) {
				t.Errorf("waits: got %v, want the first at least the %v pushback", waits, tc.minWait)
			}
		})
	}
}

func TestUnaryInterceptorSendsAStableKey(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, nil)
	up := &flakyGRPC{script: []grpcReply{{codes.Unavailable, ""}, {codes.Unavailable, ""}, {codes.OK, ""}}}
	health := startFlakyGRPC(t, up, c, func(context.Context, string) policyclient.Call {
		return policyclient.Call{Target: "health", SubmissionID: "doc-9", Payload: []byte("x")}
	})
	if _, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	want := policyclient.IdempotencyKey("doc-9", []byte("x"))
	keys := up.seen()
	if len(keys) != 3 {
		t.Fatalf("upstream saw %d calls, want 3", len(keys))
	}
	for i, k := range keys {
		if k != want {
			t.Errorf("call %d: key %q, want %q", i+1, k, want)
		}
	}
}

// TestStreamInterceptorReplaysAServerStream: a server-streaming call that
// fails before its first message is sent again with its request; the
// stream handed back outlives the attempt's context.
func TestStreamInterceptorReplaysAServerStream(t *testing.T) {
	d := startDaemon(t, nil)
	c, sl := newClient(t, d, nil)
	up := &flakyGRPC{script: []grpcReply{{codes.Unavailable, "2000"}, {codes.OK, ""}}}
	health := startFlakyGRPC(t, up, c, idempotent)
	stream, err := health.Watch(context.Background(), &healthpb.HealthCheckRequest{Service: "geo"})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	msg, err := stream.Recv()
	if err != nil || msg.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first message: got %v, %v; want SERVING", msg.GetStatus(), err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("after the last message: got %v, want io.EOF", err)
	}
	if got := len(up.seen()); got != 2 {
		t.Errorf("upstream saw %d calls, want 2", got)
	}
	if waits := sl.all(); len(waits) != 1 || waits[0] < 2*time.Second {
		t.Errorf("waits: got %v, want one of at least the 2s pushback", waits)
	}
}

func TestStreamInterceptorReturnsTheUpstreamStatus(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, nil)
	up := &flakyGRPC{script: []grpcReply{{codes.PermissionDenied, ""}}}
	health := startFlakyGRPC(t, up, c, idempotent)
	stream, err := health.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Recv: got %v, want PERMISSION_DENIED", err)
	}
	if got := len(up.seen()); got != 1 {
		t.Errorf("upstream saw %d calls, want 1", got)
	}
}

// TestStreamInterceptorOpensAClientStream: a stream the caller sends on
// (ClientStreams) is retried only while it cannot be opened, and the open
// stream handed back outlives the attempt's context. The health service's
// Watch stands in for a client-streaming method: the caller sends its one
// message itself.
func TestStreamInterceptorOpensAClientStream(t *testing.T) {
	d := startDaemon(t, nil)
	desc := &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}
	const method = "/grpc.health.v1.Health/Watch"
	dialOpts := func(c *policyclient.Client) []grpc.DialOption {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithStreamInterceptor(policyclient.StreamClientInterceptor(c, idempotent))}
	}

	t.Run("open, then used after the attempt", func(t *testing.T) {
		c, _ := newClient(t, d, nil)
		up := &flakyGRPC{script: []grpcReply{{codes.OK, ""}}}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		gs := grpc.NewServer()
		healthpb.RegisterHealthServer(gs, up)
		go func() { _ = gs.Serve(lis) }()
		t.Cleanup(gs.Stop)
		conn, err := grpc.NewClient(lis.Addr().String(), dialOpts(c)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		s, err := conn.NewStream(context.Background(), desc, method)
		if err != nil {
			t.Fatalf("NewStream: %v", err)
		}
		if err := s.SendMsg(&healthpb.HealthCheckRequest{}); err != nil {
			t.Fatalf("SendMsg: %v", err)
		}
		if err := s.CloseSend(); err != nil {
			t.Fatalf("CloseSend: %v", err)
		}
		var msg healthpb.HealthCheckResponse
		if err := s.RecvMsg(&msg); err != nil || msg.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("RecvMsg: got %v, %v; want SERVING", msg.GetStatus(), err)
		}
	})

	t.Run("upstream away: opening is retried, then UNAVAILABLE", func(t *testing.T) {
		c, sl := newClient(t, d, nil)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := lis.Addr().String()
		lis.Close() // connection refused
		conn, err := grpc.NewClient(addr, dialOpts(c)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		_, err = conn.NewStream(context.Background(), desc, method)
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("NewStream: got %v, want UNAVAILABLE", err)
		}
		if waits := sl.all(); len(waits) != 2 {
			t.Errorf("waits: got %v, want two (three attempts to open)", waits)
		}
	})
}

// TestInterceptorsSendAnEscalatedAttemptToTheFallbackConn: a primary
// upstream answering UNAVAILABLE and a healthy fallback, each a real gRPC
// server, geo-a's policy escalating after one attempt: the unary call and
// the server stream each make one attempt on the primary's connection and
// the next on the fallback's (WithFallbackConns), whose answer the caller
// gets. Without a connection for the fallback the call fails
// FAILED_PRECONDITION naming it, and the primary sees no second attempt.
func TestInterceptorsSendAnEscalatedAttemptToTheFallbackConn(t *testing.T) {
	d := startDaemon(t, nil)
	setFallback(t, d, 3, &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1})
	c, _ := newClient(t, d, nil)
	describe := func(context.Context, string) policyclient.Call {
		return policyclient.Call{Target: "geo-a", Idempotent: true}
	}
	ctx := context.Background()
	t.Run("unary and stream", func(t *testing.T) {
		primary := &flakyGRPC{script: []grpcReply{{codes.Unavailable, ""}}}
		fallback := &flakyGRPC{script: []grpcReply{{codes.OK, ""}}}
		fconn := dialFlakyGRPC(t, fallback)
		health := startFlakyGRPC(t, primary, c, describe,
			policyclient.WithFallbackConns(map[string]*grpc.ClientConn{"geo-b": fconn}))
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check: %v, %v; want SERVING from the fallback", resp, err)
		}
		stream, err := health.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		if msg, err := stream.Recv(); err != nil || msg.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Watch Recv: %v, %v; want SERVING from the fallback", msg, err)
		}
		if p, f := len(primary.seen()), len(fallback.seen()); p != 2 || f != 2 {
			t.Fatalf("upstream calls: primary %d, fallback %d; want 2 and 2 (one attempt each per call)", p, f)
		}
	})
	t.Run("no connection for the fallback", func(t *testing.T) {
		primary := &flakyGRPC{script: []grpcReply{{codes.Unavailable, ""}}}
		health := startFlakyGRPC(t, primary, c, describe)
		_, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `no connection for fallback target "geo-b"`) {
			t.Fatalf("Check: %v, want FAILED_PRECONDITION naming the fallback target", err)
		}
		stream, err := health.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `"geo-b"`) {
			t.Fatalf("Watch: %v, want FAILED_PRECONDITION naming the fallback target", err)
		}
		if n := len(primary.seen()); n != 2 {
			t.Fatalf("primary saw %d calls, want 2 (one attempt per call): an escalated attempt must not go to it", n)
		}
	})
}
