package policyclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// KeyMetadata is the metadata key the interceptors send the idempotency
// key in.
const KeyMetadata = "idempotency-key"

// DescribeFunc describes a gRPC call to an upstream as a Call. Without one
// (nil), the interceptors use the method's service ("pkg.Service" of
// "/pkg.Service/Method") as the Target and treat the call as not
// idempotent, so it is retried only with an idempotency key, which the
// outgoing KeyMetadata provides when set. An empty Target returned by a
// DescribeFunc is the method's service.
type DescribeFunc func(ctx context.Context, method string) Call

// ErrNoFallbackConn is the interceptors' terminal error for an attempt
// policyd escalated to a fallback target that WithFallbackConns (or
// WithFallbackConnFunc) gives no connection for: the attempt is never sent
// to the primary's connection instead. The call ends FAILED_TERMINAL and
// the interceptor returns FAILED_PRECONDITION naming the target.
var ErrNoFallbackConn = errors.New("policyclient: interceptor: no connection for fallback target")

// InterceptorOption configures UnaryClientInterceptor and
// StreamClientInterceptor.
type InterceptorOption func(*interceptorConfig)

type interceptorConfig struct {
	conn func(target string) *grpc.ClientConn // nil: no fallback connections
}

// WithFallbackConns sends each attempt that policyd escalated to a fallback
// target (an Attempt.Target other than the call's Target) on
// conns[target]; the call's own target keeps the connection the call was
// made on. The attempt runs through the interceptors that follow this one
// on the call's connection and is then sent on the fallback's connection,
// whose own interceptors do not run (it may be dialled with this one
// without nesting loops). A fallback target conns does not name fails
// terminally (ErrNoFallbackConn). conns must not change once in use.
func WithFallbackConns(conns map[string]*grpc.ClientConn) InterceptorOption {
	return WithFallbackConnFunc(func(target string) *grpc.ClientConn { return conns[target] })
}

// WithFallbackConnFunc is WithFallbackConns with a function: conn returns
// the connection of a fallback target, or nil when there is none. It is
// called once per escalated attempt, from the calling goroutine, and must
// be safe for concurrent use.
func WithFallbackConnFunc(conn func(target string) *grpc.ClientConn) InterceptorOption {
	return func(c *interceptorConfig) { c.conn = conn }
}

func interceptorOptions(opts []InterceptorOption) interceptorConfig {
	var cfg interceptorConfig
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// connFor returns the connection attempt a of call goes on: cc for the
// call's own target, the fallback's for another.
func (cfg *interceptorConfig) connFor(cc *grpc.ClientConn, call *Call, a Attempt) (*grpc.ClientConn, error) {
	if a.Target == "" || a.Target == call.Target {
		return cc, nil
	}
	if cfg.conn != nil {
		if fc := cfg.conn(a.Target); fc != nil {
			return fc, nil
		}
	}
	return nil, ValidationError(fmt.Errorf("%w %q (give it with WithFallbackConns)", ErrNoFallbackConn, a.Target))
}

// UnaryClientInterceptor returns a grpc.UnaryClientInterceptor that runs
// each unary call to an upstream through c.Do: admitted by the shared
// breaker, classified by its status code with the grpc-retry-pushback-ms
// trailer as pushback, and sent again when and as policyd says, each attempt
// with the attempt's context and the idempotency key in KeyMetadata, on the
// call's connection or, escalated to a fallback target, on the one
// WithFallbackConns gives. It returns the last attempt's error as the
// upstream sent it (a status error), or, when the call ended without one, a
// status error: UNAVAILABLE for an open breaker, FAILED_PRECONDITION for a
// fallback target without a connection, the context's code when ctx ended.
func UnaryClientInterceptor(c *Client, describe DescribeFunc, opts ...InterceptorOption) grpc.UnaryClientInterceptor {
	cfg := interceptorOptions(opts)
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		call := describeCall(ctx, method, describe)
		var trailer metadata.MD
		opts = append(opts[:len(opts):len(opts)], grpc.Trailer(&trailer)) // a copy: the caller's slice stays as it was
		res, err := c.Do(ctx, call, func(actx context.Context, a Attempt) error {
			trailer = nil
			acc, err := cfg.connFor(cc, &call, a)
			if err != nil {
				return err
			}
			err = invoker(withKey(actx, a), method, req, reply, acc, opts...)
			if err != nil {
				return GRPCError(err, trailer)
			}
			return nil
		})
		if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		return grpcResult(res)
	}
}

// StreamClientInterceptor returns a grpc.StreamClientInterceptor that runs
// streams through c.Do as UnaryClientInterceptor runs calls, an escalated
// attempt's stream opened on the fallback's connection. What is sent
// again is what can be: a server-streaming call (one request) until its
// first response message or its clean end, with the request kept for the
// next attempt; any other stream only until it is open, since the messages
// sent on it are the caller's to replay. Once handed over, the stream lives
// by ctx, not by the attempt's context.
func StreamClientInterceptor(c *Client, describe DescribeFunc, opts ...InterceptorOption) grpc.StreamClientInterceptor {
	cfg := interceptorOptions(opts)
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		call := describeCall(ctx, method, describe)
		open := func(sctx context.Context, a Attempt) (grpc.ClientStream, error) {
			acc, err := cfg.connFor(cc, &call, a)
			if err != nil {
				return nil, err
			}
			return streamer(withKey(sctx, a), desc, acc, method, opts...)
		}
		if desc.ClientStreams {
			var kept grpc.ClientStream
			res, err := c.Do(ctx, call, func(actx context.Context, a Attempt) error {
				cs, err := openOutliving(ctx, actx, a, open, nil)
				kept = cs
				return err
			})
			if err != nil {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			if res.OK() {
				return kept, nil
			}
			return nil, grpcResult(res)
		}
		return &replayStream{ctx: ctx, c: c, call: call, open: open}, nil
	}
}

// openOutliving opens a stream for attempt a whose context follows the
// attempt's (actx) while the attempt runs and ctx alone once it succeeded;
// first, if set, runs on the open stream as part of the attempt.
func openOutliving(ctx, actx context.Context, a Attempt, open func(context.Context, Attempt) (grpc.ClientStream, error),
	first func(grpc.ClientStream) error) (grpc.ClientStream, error) {
	sctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(actx, cancel)
	cs, err := open(sctx, a)
	if errors.Is(err, ErrNoFallbackConn) {
		cancel()
		return nil, err // no stream: not the upstream's status
	}
	if err == nil && first != nil {
		err = first(cs)
	}
	if err != nil {
		var trailer metadata.MD
		if cs != nil {
			trailer = cs.Trailer()
		}
		cancel()
		return nil, GRPCError(err, trailer)
	}
	if !stop() {
		cancel()
		return nil, actx.Err()
	}
	return &endingStream{ClientStream: cs, cancel: cancel}, nil
}

// replayStream is a server-streaming call whose opening, request and first
// response run through Do at the first RecvMsg.
type replayStream struct {
	ctx  context.Context
	c    *Client
	call Call
	open func(context.Context, Attempt) (grpc.ClientStream, error)

	req   any
	inner grpc.ClientStream // once the first RecvMsg returned
	err   error             // the first RecvMsg's error, for the next calls
}

// SendMsg keeps the request for every attempt.
func (s *replayStream) SendMsg(m any) error {
	if s.inner != nil || s.req != nil {
		return status.Error(codes.Internal, "policyclient: SendMsg after the request of a server-streaming call")
	}
	s.req = m
	return nil
}

// CloseSend is done by each attempt after it sent the request.
func (s *replayStream) CloseSend() error { return nil }

func (s *replayStream) RecvMsg(m any) error {
	if s.inner != nil {
		return s.inner.RecvMsg(m)
	}
	if s.err != nil {
		return s.err
	}
	var kept grpc.ClientStream
	var ended bool // the stream ended cleanly without a message
	res, err := s.c.Do(s.ctx, s.call, func(actx context.Context, a Attempt) error {
		ended = false
		cs, err := openOutliving(s.ctx, actx, a, s.open, func(cs grpc.ClientStream) error {
			// A stream that ended under SendMsg says why at RecvMsg.
			if err := cs.SendMsg(s.req); err != nil && err != io.EOF {
				return err
			}
			if err := cs.CloseSend(); err != nil {
				return err
			}
			err := cs.RecvMsg(m)
			if err == io.EOF {
				ended = true
				return nil
			}
			return err
		})
		kept = cs
		return err
	})
	switch {
	case err != nil:
		s.err = status.Error(codes.InvalidArgument, err.Error())
	case !res.OK():
		s.err = grpcResult(res)
	case ended:
		s.inner, s.err = kept, io.EOF
		return io.EOF
	default:
		s.inner = kept
		return nil
	}
	return s.err
}

func (s *replayStream) Header() (metadata.MD, error) {
	if s.inner != nil {
		return s.inner.Header()
	}
	return nil, status.Error(codes.FailedPrecondition, "policyclient: the stream's header is known after its first RecvMsg")
}

func (s *replayStream) Trailer() metadata.MD {
	if s.inner != nil {
		return s.inner.Trailer()
	}
	return nil
}

func (s *replayStream) Context() context.Context {
	if s.inner != nil {
		return s.inner.Context()
	}
	return s.ctx
}

// endingStream ends its context when the stream ends (RecvMsg returns an
// error, io.EOF included).
type endingStream struct {
	grpc.ClientStream
	cancel context.CancelFunc
}

func (s *endingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.cancel()
	}
	return err
}

// grpcResult is the error an interceptor returns for a call that did not
// succeed: the upstream's status error, or one that says why no attempt
// answered.
func grpcResult(res Result) error {
	if res.OK() {
		return nil
	}
	var ge *GRPCStatusError
	switch {
	case errors.As(res.Err, &ge):
		return ge.Err
	case errors.Is(res.Err, ErrNoFallbackConn):
		return status.Error(codes.FailedPrecondition, (&CallError{Result: res}).Error())
	case res.Err == nil:
		return status.Error(codes.Unavailable, (&CallError{Result: res}).Error())
	}
	if st, ok := status.FromError(res.Err); ok {
		return st.Err()
	}
	if ctxErr := status.FromContextError(res.Err); ctxErr.Code() != codes.Unknown {
		return ctxErr.Err()
	}
	return status.Error(codes.Unavailable, (&CallError{Result: res}).Error())
}

// describeCall is describe's Call for method, or the default.
func describeCall(ctx context.Context, method string, describe DescribeFunc) Call {
	var call Call
	if describe != nil {
		call = describe(ctx, method)
	}
	if call.Target == "" {
		call.Target = strings.TrimPrefix(method, "/")
		if i := strings.LastIndexByte(call.Target, '/'); i >= 0 {
			call.Target = call.Target[:i]
		}
	}
	if call.IdempotencyKey == "" {
		if md, ok := metadata.FromOutgoingContext(ctx); ok {
			if v := md.Get(KeyMetadata); len(v) > 0 {
				call.IdempotencyKey = v[0]
			}
		}
	}
	return call
}

// withKey is ctx with attempt a's idempotency key in the outgoing metadata.
func withKey(ctx context.Context, a Attempt) context.Context {
	if a.IdempotencyKey == "" {
		return ctx
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(KeyMetadata, a.IdempotencyKey)
	return metadata.NewOutgoingContext(ctx, md)
}
