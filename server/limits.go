package server

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Shedder refuses unary calls beyond a number in flight, so an overloaded
// daemon answers quickly with RESOURCE_EXHAUSTED and a RetryInfo saying
// when to come back, instead of queueing every caller into its timeout.
// Health checks are never shed. It is safe for concurrent use.
type Shedder struct {
	max      int64
	retry    time.Duration
	inFlight atomic.Int64
	shed     atomic.Uint64
}

// NewShedder admits at most maxInFlight unary calls at once and asks shed
// callers to retry after retryAfter.
func NewShedder(maxInFlight int, retryAfter time.Duration) *Shedder {
	return &Shedder{max: int64(maxInFlight), retry: retryAfter}
}

// Shed returns how many calls were refused so far.
func (s *Shedder) Shed() uint64 { return s.shed.Load() }

func (s *Shedder) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if info.FullMethod == "/grpc.health.v1.Health/Check" {
			return handler(ctx, req)
		}
		if n := s.inFlight.Add(1); n > s.max {
			s.inFlight.Add(-1)
			s.shed.Add(1)
			return nil, s.overloaded()
		}
		defer s.inFlight.Add(-1)
		return handler(ctx, req)
	}
}

// overloaded is RESOURCE_EXHAUSTED with the cap in the message and a
// RetryInfo detail.
func (s *Shedder) overloaded() error {
	st := status.New(codes.ResourceExhausted,
		"policyd is over capacity: "+strconv.FormatInt(s.max, 10)+" calls in flight (--max-in-flight); retry after "+s.retry.String())
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(s.retry)}); err == nil {
		st = d
	}
	return st.Err()
}
