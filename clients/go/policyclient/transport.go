package policyclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// DefaultKeyHeader is the header Transport sends the idempotency key in
// unless Transport.KeyHeader names another.
const DefaultKeyHeader = "Idempotency-Key"

// ErrBodyNotReplayable is Transport's refusal of a request whose body it
// could not send again on a retry: the body is set and GetBody is nil.
var ErrBodyNotReplayable = errors.New("policyclient: Transport: the request body cannot be replayed: " +
	"Request.GetBody is nil (http.NewRequest sets it for a *bytes.Buffer, *bytes.Reader or *strings.Reader body)")

// Transport is an http.RoundTripper that runs each request through
// Client.Do: every attempt is admitted by the shared breaker, a response
// with a status of 400 or more is a failure classified as HTTPError
// classifies it (the status and the Retry-After, grpc-retry-pushback-ms,
// X-RateLimit-Reset and X-Amz-Retry-After headers), an error of Base is a
// transport failure, and policyd decides whether and when to send the
// request again.
//
// RoundTrip returns the final response as http.Client expects: the success,
// or the last failed response once policyd says to stop (a 503 after the
// retries ran out, a 400 at once), with its body readable until it is
// closed. A failed response that is retried is closed when the next attempt
// starts. When the call ends without a response (a transport error, an open
// breaker, ctx done), RoundTrip returns a *CallError.
//
// Each attempt sends a clone of the request, with its body from GetBody, the
// idempotency key in KeyHeader, and, when policyd sent the call to another
// target, the host Hosts maps that target to. The attempt's context bounds
// the round trip; once RoundTrip returns, the body is bound by the
// request's own context only.
//
// Base must not send a request again by itself. net/http's Transport
// does, on a reused connection that breaks after the request was
// written, for a request it can replay that carries an Idempotency-Key
// header: beneath Do, the idempotency ledger and the attempt count. So an
// attempt with a body is handed to Base without GetBody, which net/http
// needs to replay it; a bodiless request with a key (a POST with no body)
// stays replayable to net/http: for such a non-idempotent call to an
// upstream that does not deduplicate by key, give Base DisableKeepAlives
// (net/http never resends on a fresh connection).
//
// A Transport is safe for concurrent use; its fields must not change once
// it is in use.
type Transport struct {
	// Client decides; required.
	Client *Client
	// Base sends each attempt; default http.DefaultTransport.
	Base http.RoundTripper
	// Call describes the request as a Call. Default: Target is the URL's
	// host and Idempotent follows the method (GET, HEAD, OPTIONS, TRACE, PUT
	// and DELETE are). An empty Target returned by Call is the URL's host;
	// a Call with neither IdempotencyKey nor SubmissionID takes the
	// request's KeyHeader, if set, as its key.
	Call func(*http.Request) Call
	// KeyHeader names the header that carries the idempotency key; default
	// DefaultKeyHeader. A call without a key sends none.
	KeyHeader string
	// Hosts maps a target to the host (host or host:port) its attempts go
	// to. A target not in it keeps the request's host, unless it is a
	// fallback target policyd escalated the call to: an attempt there
	// without a host fails terminally.
	Hosts map[string]string
}

// CallError is RoundTrip's error when a call ended without a response to
// return: Result says how it ended; Unwrap gives the last error.
type CallError struct {
	Result Result
}

func (e *CallError) Error() string {
	s := "policyclient: " + e.Result.Disposition.String()
	if e.Result.StopReason != StopNone {
		s += " (" + e.Result.StopReason.String() + ")"
	}
	if e.Result.Reason != "" {
		s += ": " + e.Result.Reason
	}
	if e.Result.Err != nil {
		s += ": " + e.Result.Err.Error()
	}
	return s
}

// Unwrap returns the last error of the call.
func (e *CallError) Unwrap() error { return e.Result.Err }

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		req.Body.Close()
		return nil, ErrBodyNotReplayable
	}
	keyHeader := t.KeyHeader
	if keyHeader == "" {
		keyHeader = DefaultKeyHeader
	}
	call := Call{Idempotent: idempotentMethod(req.Method)}
	if t.Call != nil {
		call = t.Call(req)
	}
	if call.IdempotencyKey == "" && call.SubmissionID == "" {
		call.IdempotencyKey = req.Header.Get(keyHeader)
	}
	if call.Target == "" {
		call.Target = req.URL.Host
	}
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}

	// kept is the last failed response, held for RoundTrip to return if
	// policyd says to stop; keptErr is the error fn returned for it.
	var kept *http.Response
	var keptErr error
	release := func() {
		if kept != nil {
			io.Copy(io.Discard, io.LimitReader(kept.Body, 64<<10))
			kept.Body.Close()
			kept, keptErr = nil, nil
		}
	}
	fn := func(actx context.Context, a Attempt) error {
		release()
		out, err := t.attemptRequest(req, call.Target, a, keyHeader)
		if err != nil {
			return err
		}
		// The round trip follows the attempt's context; the response's body
		// outlives the attempt, bound by the request's context only, and
		// its Close ends that context.
		rctx, cancel := context.WithCancel(req.Context())
		stop := context.AfterFunc(actx, cancel)
		resp, err := base.RoundTrip(out.WithContext(rctx))
		if err != nil || !stop() {
			cancel()
			if err == nil {
				resp.Body.Close()
				err = actx.Err()
			}
			return err
		}
		resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
		kept = resp
		if resp.StatusCode >= 400 {
			keptErr = HTTPError(resp.StatusCode, resp.Header)
			return keptErr
		}
		return nil
	}
	res, err := t.Client.Do(req.Context(), call, fn)
	if res.Attempts == 0 && req.Body != nil {
		req.Body.Close() // never handed to Base, which would have closed it
	}
	if err != nil {
		release()
		return nil, err
	}
	if kept != nil && (res.OK() || (res.Err != nil && res.Err == keptErr)) {
		return kept, nil
	}
	release()
	return nil, &CallError{Result: res}
}

// attemptRequest is req as attempt a sends it: a clone with a fresh body,
// the idempotency key, and the host of a's target.
func (t *Transport) attemptRequest(req *http.Request, target string, a Attempt, keyHeader string) (*http.Request, error) {
	out := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		if a.Number > 1 {
			body, err := req.GetBody()
			if err != nil {
				return nil, fmt.Errorf("policyclient: Transport: GetBody: %w", err)
			}
			out.Body = body
		}
		// Without GetBody, net/http's Transport cannot send the attempt a
		// second time by itself (it does, for a request it can replay
		// that carries an Idempotency-Key, when a reused connection breaks
		// after the request was written): a resend beneath Do would be a
		// write that neither policyd nor the idempotency ledger decided.
		out.GetBody = nil
	}
	if a.IdempotencyKey != "" {
		out.Header.Set(keyHeader, a.IdempotencyKey)
	}
	if host, ok := t.Hosts[a.Target]; ok {
		out.URL.Host, out.Host = host, ""
	} else if a.Target != "" && a.Target != target {
		return nil, ValidationError(fmt.Errorf("policyclient: Transport.Hosts has no host for fallback target %q", a.Target))
	}
	return out, nil
}

// cancelOnClose ends a response's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// idempotentMethod reports whether RFC 9110 defines method as idempotent.
func idempotentMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}
