package server

import (
	"context"
	"log/slog"
	"runtime/debug"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// NewGRPC returns a gRPC server with both services, the health service (its
// overall status and each service's set to SERVING) and reflection
// registered, a recovery interceptor so a panicking handler answers
// INTERNAL instead of killing the daemon, and a codec that answers
// INVALID_ARGUMENT (not grpc-go's INTERNAL) for a request that does not
// decode. The health server is returned so
// the caller can flip it to NOT_SERVING when draining.
func NewGRPC(store Store, cfg Config, opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	cfg = cfg.withDefaults()
	codec := newUndecodable()
	unary := []grpc.UnaryServerInterceptor{recoverUnary(cfg.Logger), codec.unary()}
	if cfg.Shedder != nil {
		unary = append([]grpc.UnaryServerInterceptor{cfg.Shedder.unary()}, unary...)
	}
	stream := []grpc.StreamServerInterceptor{recoverStream(cfg.Logger), codec.stream()}
	if cfg.Auth != nil {
		unary = append(unary, cfg.Auth.unary())
		stream = append(stream, cfg.Auth.stream())
		cfg.Auth.logOpenAdmin(cfg.Logger)
	}
	if cfg.Metrics != nil {
		// Outermost, so shed, refused and panicking calls are timed too.
		unary = append([]grpc.UnaryServerInterceptor{cfg.Metrics.unary()}, unary...)
		stream = append([]grpc.StreamServerInterceptor{cfg.Metrics.stream()}, stream...)
		cfg.Metrics.attach(store)
	}
	opts = append([]grpc.ServerOption{
		grpc.ForceServerCodecV2(codec),
		grpc.ChainUnaryInterceptor(unary...),
		grpc.ChainStreamInterceptor(stream...),
	}, opts...)
	if cfg.StreamWorkers > 0 {
		opts = append(opts, grpc.NumStreamWorkers(uint32(cfg.StreamWorkers)))
	}
	gs := grpc.NewServer(opts...)
	pb.RegisterRetryPolicyServiceServer(gs, NewDecisions(store, cfg))
	pb.RegisterAdminServiceServer(gs, NewAdmin(store, cfg))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	for _, name := range []string{"", pb.RetryPolicyService_ServiceDesc.ServiceName, pb.AdminService_ServiceDesc.ServiceName} {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	}
	reflection.Register(gs)
	return gs, hs
}

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
