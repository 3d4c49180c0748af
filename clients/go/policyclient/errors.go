package policyclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"syscall"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// HTTPStatusError is an HTTP response that failed, with the pushback
// headers the server sent. HTTPError builds one; return it from the function
// Do runs, e.g.
//
//	if resp.StatusCode >= 400 {
//		return policyclient.HTTPError(resp.StatusCode, resp.Header)
//	}
type HTTPStatusError struct {
	Status int
	// Pushback headers, raw, as the server sent them.
	RetryAfter      string
	GRPCPushbackMs  string
	XRateLimitReset string
	XAmzRetryAfter  string
}

// HTTPError returns an *HTTPStatusError for status with the pushback
// headers found in header (which may be nil).
func HTTPError(status int, header http.Header) error {
	e := &HTTPStatusError{Status: status}
	if header != nil {
		e.RetryAfter = header.Get("Retry-After")
		e.GRPCPushbackMs = header.Get("Grpc-Retry-Pushback-Ms")
		e.XRateLimitReset = header.Get("X-Ratelimit-Reset")
		e.XAmzRetryAfter = header.Get("X-Amz-Retry-After")
	}
	return e
}

func (e *HTTPStatusError) Error() string {
	s := "http status " + strconv.Itoa(e.Status)
	if e.RetryAfter != "" {
		s += " (Retry-After: " + e.RetryAfter + ")"
	}
	return s
}

// GRPCStatusError is a failed gRPC call with the pushback its server sent
// in the grpc-retry-pushback-ms trailer. GRPCError builds one; return it
// from the function Do runs, e.g.
//
//	var trailer metadata.MD
//	err := conn.Invoke(ctx, method, req, reply, grpc.Trailer(&trailer))
//	if err != nil {
//		return policyclient.GRPCError(err, trailer)
//	}
//
// The interceptors do this themselves.
type GRPCStatusError struct {
	// Err is the call's error, a gRPC status error.
	Err error
	// PushbackMs is the grpc-retry-pushback-ms trailer, raw: a delay in
	// milliseconds, or, negative or malformed, a request not to retry.
	PushbackMs string
}

// GRPCError returns a *GRPCStatusError for err with the pushback found in
// trailer (which may be nil).
func GRPCError(err error, trailer metadata.MD) error {
	e := &GRPCStatusError{Err: err}
	if v := trailer.Get("grpc-retry-pushback-ms"); len(v) > 0 {
		e.PushbackMs = v[0]
	}
	return e
}

func (e *GRPCStatusError) Error() string { return e.Err.Error() }

// Unwrap returns the call's error.
func (e *GRPCStatusError) Unwrap() error { return e.Err }

// GRPCStatus returns the call's status, so status.Code and status.FromError
// read it through the wrapper.
func (e *GRPCStatusError) GRPCStatus() *status.Status { return status.Convert(e.Err) }

// LocalErrorKind says what went wrong inside the caller.
type LocalErrorKind int

// Kinds of local errors; both are terminal.
const (
	Parse LocalErrorKind = iota + 1
	Validation
)

// LocalError is a failure inside the caller after a response arrived: the
// response did not parse or did not validate. Such failures are terminal.
type LocalError struct {
	Kind LocalErrorKind
	Err  error
}

func (e *LocalError) Error() string {
	if e.Kind == Parse {
		return "parse: " + e.Err.Error()
	}
	return "validation: " + e.Err.Error()
}

func (e *LocalError) Unwrap() error { return e.Err }

// ParseError marks err as a response that could not be parsed (terminal).
func ParseError(err error) error { return &LocalError{Kind: Parse, Err: err} }

// ValidationError marks err as a response or input that failed validation
// (terminal).
func ValidationError(err error) error { return &LocalError{Kind: Validation, Err: err} }

// failure is a Go error seen as policyd sees failures.
type failure struct {
	pb       *pb.Failure
	pushback *pb.Pushback
	// unclassified is set when the error is of no kind the client knows;
	// such errors are terminal and never retried blindly.
	unclassified bool
	reason       string
}

// classifyError maps an error returned by the user's function to a
// Failure. attemptTimedOut says the attempt's own context expired.
func classifyError(err error, attemptTimedOut bool) failure {
	var he *HTTPStatusError
	var le *LocalError
	switch {
	case errors.As(err, &he):
		f := failure{pb: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: uint32(he.Status)}}}
		if he.RetryAfter != "" || he.GRPCPushbackMs != "" || he.XRateLimitReset != "" || he.XAmzRetryAfter != "" {
			f.pushback = &pb.Pushback{RetryAfter: he.RetryAfter, GrpcRetryPushbackMs: he.GRPCPushbackMs,
				XRatelimitReset: he.XRateLimitReset, XAmzRetryAfter: he.XAmzRetryAfter}
		}
		if he.Status < 100 || he.Status > 599 {
			return failure{unclassified: true, reason: "unclassified:http_" + strconv.Itoa(he.Status)}
		}
		return f
	case errors.As(err, &le):
		k := pb.LocalError_LOCAL_ERROR_PARSE
		if le.Kind == Validation {
			k = pb.LocalError_LOCAL_ERROR_VALIDATION
		}
		return failure{pb: &pb.Failure{Kind: &pb.Failure_LocalError{LocalError: k}}}
	}
	if attemptTimedOut || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, syscall.ETIMEDOUT) || isNetTimeout(err) {
		return transportFailure(pb.TransportError_TRANSPORT_ERROR_TIMEOUT)
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNABORTED) {
		return transportFailure(pb.TransportError_TRANSPORT_ERROR_CONNECTION_RESET)
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return transportFailure(pb.TransportError_TRANSPORT_ERROR_CONNECTION_REFUSED)
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		if dnsErr.IsTimeout {
			return transportFailure(pb.TransportError_TRANSPORT_ERROR_TIMEOUT)
		}
		return transportFailure(pb.TransportError_TRANSPORT_ERROR_DNS)
	}
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var recErr tls.RecordHeaderError
	if errors.As(err, &certErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr) || errors.As(err, &recErr) {
		return transportFailure(pb.TransportError_TRANSPORT_ERROR_TLS)
	}
	if st, ok := status.FromError(err); ok && st.Code() != 0 && int(st.Code()) <= 16 {
		f := failure{pb: &pb.Failure{Kind: &pb.Failure_GrpcCode{GrpcCode: uint32(st.Code())}}}
		var ge *GRPCStatusError
		if errors.As(err, &ge) && ge.PushbackMs != "" {
			f.pushback = &pb.Pushback{GrpcRetryPushbackMs: ge.PushbackMs}
		}
		return f
	}
	return failure{unclassified: true, reason: "unclassified:" + fmt.Sprintf("%T", err)}
}

func transportFailure(k pb.TransportError) failure {
	return failure{pb: &pb.Failure{Kind: &pb.Failure_TransportError{TransportError: k}}}
}

func isNetTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
