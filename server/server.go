package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// Server is policyd's gRPC server: both services, the health service and
// reflection, a recovery interceptor so a panicking handler answers
// INTERNAL instead of killing the daemon, a codec that answers
// INVALID_ARGUMENT (not grpc-go's INTERNAL) for a request that does not
// decode, and the drain. The daemon, the demo and policybench all serve
// through it. Its methods are safe for concurrent use.
type Server struct {
	gs *grpc.Server
	hs *health.Server

	// draining is closed when Shutdown starts; every open stream (breaker
	// watches, health watches, reflection) ends then with UNAVAILABLE.
	draining  chan struct{}
	drainOnce sync.Once

	slow *slowLog // nil when the slow-request log is off
}

// New returns a Server over store with the health of every service set to
// SERVING. opts are added to grpc-go's (TLS, message and header limits,
// stats handlers).
func New(store Store, cfg Config, opts ...grpc.ServerOption) *Server {
	cfg = cfg.withDefaults()
	s := &Server{draining: make(chan struct{})}
	codec := newUndecodable()
	unary := []grpc.UnaryServerInterceptor{recoverUnary(cfg.Logger), codec.unary()}
	if cfg.Shedder != nil {
		unary = append([]grpc.UnaryServerInterceptor{cfg.Shedder.unary()}, unary...)
	}
	stream := []grpc.StreamServerInterceptor{s.drainStream(), recoverStream(cfg.Logger), codec.stream()}
	if cfg.Auth != nil {
		unary = append(unary, cfg.Auth.unary())
		stream = append(stream, cfg.Auth.stream())
		cfg.Auth.logOpenAdmin(cfg.Logger)
	}
	if cfg.DeclaredTenants != nil {
		g := tenantGate{declared: cfg.DeclaredTenants}
		unary, stream = append(unary, g.unary()), append(stream, g.stream())
	}
	if cfg.SlowRequest > 0 {
		s.slow = newSlowLog(cfg.SlowRequest, cfg.Clock, cfg.Logger)
		unary = append([]grpc.UnaryServerInterceptor{s.slow.unary()}, unary...)
	}
	if cfg.Metrics != nil {
		// Outermost, so shed, refused and panicking calls are timed too.
		unary = append([]grpc.UnaryServerInterceptor{cfg.Metrics.unary()}, unary...)
		stream = append([]grpc.StreamServerInterceptor{cfg.Metrics.stream()}, stream...)
		cfg.Metrics.attach(store, store)
	}
	opts = append([]grpc.ServerOption{
		grpc.ForceServerCodecV2(codec),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
	}, opts...)
	if cfg.StreamWorkers > 0 {
		opts = append(opts, grpc.NumStreamWorkers(uint32(cfg.StreamWorkers)))
	}
	s.gs = grpc.NewServer(opts...)
	pb.RegisterRetryPolicyServiceServer(s.gs, workers{NewDecisions(store, cfg), &watcher{store: store, policies: store, flow: store, buffer: cfg.WatchBuffer, log: cfg.Logger}})
	pb.RegisterAdminServiceServer(s.gs, NewAdmin(store, cfg))
	s.hs = health.NewServer()
	healthpb.RegisterHealthServer(s.gs, s.hs)
	for _, name := range []string{"", pb.RetryPolicyService_ServiceDesc.ServiceName, pb.AdminService_ServiceDesc.ServiceName} {
		s.hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	reflection.Register(s.gs)
	cfg.Metrics.InitializeMethods(s.gs)
	return s
}

// Serve accepts connections on lis until Shutdown or Stop, then returns
// nil; any other error ends it early. lis is closed when Serve returns.
func (s *Server) Serve(lis net.Listener) error {
	if err := s.gs.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// Shutdown drains the server, grpc-go's way with streams ended first:
// every service's health turns NOT_SERVING (so balancers and probes stop
// sending), every open stream ends at once with UNAVAILABLE ("draining"),
// new calls are refused, and the unary calls in flight run to their end.
// When ctx ends before they do, the remaining calls are cut (Stop) and
// Shutdown returns ctx's error at once, without waiting for their handlers
// to notice; else nil. It may be called more than once.
func (s *Server) Shutdown(ctx context.Context) error {
	s.hs.Shutdown()
	s.drainOnce.Do(func() { close(s.draining) })
	done := make(chan struct{})
	go func() { s.gs.GracefulStop(); close(done) }()
	defer s.flushSlow()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		// Stop closes every connection, so the handlers' contexts end; it
		// does not wait for them (GracefulStop would, even now).
		s.gs.Stop()
		return ctx.Err()
	}
}

// Stop cuts every connection and call at once, without a drain.
func (s *Server) Stop() {
	s.hs.Shutdown()
	s.drainOnce.Do(func() { close(s.draining) })
	s.gs.Stop()
	s.flushSlow()
}

// flushSlow writes the slow-request log's open window, if any.
func (s *Server) flushSlow() {
	if s.slow != nil {
		s.slow.flush()
	}
}

// drainStream ends a stream with UNAVAILABLE when the server starts to
// drain, so long-lived streams (WatchBreakers, health Watch, reflection)
// do not hold GracefulStop until the grace runs out. The handler runs on
// its own goroutine; once the interceptor has returned, grpc-go closes the
// stream, which ends the handler's context and any Send it is blocked in,
// so that goroutine ends right after.
func (s *Server) drainStream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		select {
		case <-s.draining:
			return errDraining
		default:
		}
		done := make(chan error, 1)
		go func() { done <- handler(srv, ss) }()
		select {
		case err := <-done:
			return err
		case <-s.draining:
			return errDraining
		}
	}
}

// errDraining ends the streams open when the server starts to drain.
var errDraining = status.Error(codes.Unavailable, "draining: policyd is shutting down; reconnect")

func recoverUnary(log *slog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				log.ErrorContext(ctx, "handler panicked", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
				resp, err = nil, status.Error(codes.Internal, "internal error (logged by policyd)")
			}
		}()
		return handler(ctx, req)
	}
}

func recoverStream(log *slog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				log.ErrorContext(ss.Context(), "stream handler panicked", "method", info.FullMethod, "panic", r, "stack", string(debug.Stack()))
				err = status.Error(codes.Internal, "internal error (logged by policyd)")
			}
		}()
		return handler(srv, ss)
	}
}
