package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// The shared test vectors of the Go and Python clients
// (clients/python/tests/test_vectors.py reads the same file): the sections
// that need policyd. The client module checks its local fallback against
// the others (clients/go/policyclient/vectors_test.go).
type vectorFile struct {
	FallbackChains []fallbackChainVector `json:"fallback_chains"`
	Classification []struct {
		Name       string      `json:"name"`
		Failure    failureSpec `json:"failure"`
		Idempotent bool        `json:"idempotent"`
		HasKey     bool        `json:"has_key"`
		Category   string      `json:"category"`
		Reason     string      `json:"reason"`
		Retryable  bool        `json:"retryable"`
	} `json:"classification"`
	HTTPResponses []struct {
		Name    string            `json:"name"`
		Status  int               `json:"status"`
		Headers map[string]string `json:"headers"`
		adapterVerdict
	} `json:"http_responses"`
	GRPCStatuses []struct {
		Name     string            `json:"name"`
		Code     uint32            `json:"code"`
		Trailers map[string]string `json:"trailers"`
		adapterVerdict
	} `json:"grpc_statuses"`
	StopReasons []struct {
		Name string `json:"name"`
		Call struct {
			Idempotent        bool    `json:"idempotent"`
			SubmissionID      string  `json:"submission_id"`
			Payload           string  `json:"payload"`
			DeadlineInSeconds float64 `json:"deadline_in_seconds"`
		} `json:"call"`
		Script              []failureSpec `json:"script"`
		Disposition         string        `json:"disposition"`
		StopReason          string        `json:"stop_reason"`
		Attempts            int           `json:"attempts"`
		MinFirstWaitSeconds float64       `json:"min_first_wait_seconds"`
	} `json:"stop_reasons"`
}

// adapterVerdict is what an http_responses or grpc_statuses vector says an
// adapter does with the failure: retry it when retryable and not
// do_not_retry, after at least hint_seconds.
type adapterVerdict struct {
	Idempotent  bool    `json:"idempotent"`
	Retryable   bool    `json:"retryable"`
	HintSeconds float64 `json:"hint_seconds"`
	DoNotRetry  bool    `json:"do_not_retry"`
}

func (v adapterVerdict) retried() bool { return v.Retryable && !v.DoNotRetry }

// checkWaits holds the waits of a call that failed once to v.
func (v adapterVerdict) checkWaits(t *testing.T, waits []time.Duration) {
	t.Helper()
	if !v.retried() {
		if len(waits) != 0 {
			t.Errorf("waits: got %v, want none", waits)
		}
		return
	}
	if least := time.Duration(v.HintSeconds * float64(time.Second)); len(waits) != 1 || waits[0] < least {
		t.Errorf("waits: got %v, want one of at least %v", waits, least)
	}
}

// failureSpec is one failure of a vector: exactly one kind is set.
type failureSpec struct {
	HTTPStatus     *uint32           `json:"http_status"`
	Headers        map[string]string `json:"headers"`
	GRPCCode       *uint32           `json:"grpc_code"`
	TransportError string            `json:"transport_error"`
	LocalError     string            `json:"local_error"`
	Unclassified   string            `json:"unclassified"`
}

func loadVectors(t *testing.T) *vectorFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "testdata", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v vectorFile
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("testdata/vectors.json: %v", err)
	}
	if len(v.Classification) == 0 || len(v.StopReasons) == 0 || len(v.HTTPResponses) == 0 || len(v.GRPCStatuses) == 0 ||
		len(v.FallbackChains) == 0 {
		t.Fatal("testdata/vectors.json: a section is empty")
	}
	return &v
}

// pb returns the Failure message the spec names.
func (f failureSpec) pb(t *testing.T) *pb.Failure {
	t.Helper()
	switch {
	case f.HTTPStatus != nil:
		return &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: *f.HTTPStatus}}
	case f.GRPCCode != nil:
		return &pb.Failure{Kind: &pb.Failure_GrpcCode{GrpcCode: *f.GRPCCode}}
	case f.TransportError != "":
		v, ok := pb.TransportError_value["TRANSPORT_ERROR_"+f.TransportError]
		if !ok {
			t.Fatalf("unknown transport error %q", f.TransportError)
		}
		return &pb.Failure{Kind: &pb.Failure_TransportError{TransportError: pb.TransportError(v)}}
	case f.LocalError != "":
		v, ok := pb.LocalError_value["LOCAL_ERROR_"+f.LocalError]
		if !ok {
			t.Fatalf("unknown local error %q", f.LocalError)
		}
		return &pb.Failure{Kind: &pb.Failure_LocalError{LocalError: pb.LocalError(v)}}
	}
	t.Fatalf("failure spec %+v names no failure", f)
	return nil
}

// err returns the Go error an upstream call fails with for the spec.
func (f failureSpec) err(t *testing.T) error {
	t.Helper()
	switch {
	case f.HTTPStatus != nil:
		h := http.Header{}
		for k, v := range f.Headers {
			h.Set(k, v)
		}
		return policyclient.HTTPError(int(*f.HTTPStatus), h)
	case f.GRPCCode != nil:
		return status.Error(codes.Code(*f.GRPCCode), "upstream said no")
	case f.Unclassified != "":
		return errors.New(f.Unclassified)
	case f.LocalError == "PARSE":
		return policyclient.ParseError(errors.New("bad response"))
	case f.LocalError == "VALIDATION":
		return policyclient.ValidationError(errors.New("bad response"))
	}
	switch f.TransportError {
	case "TIMEOUT":
		return &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ETIMEDOUT)}
	case "CONNECTION_RESET":
		return &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	case "CONNECTION_REFUSED":
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	case "DNS":
		return &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "upstream.invalid", IsNotFound: true}}
	case "TLS":
		return &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}
	}
	t.Fatalf("failure spec %+v names no failure", f)
	return nil
}

// TestVectorsClassification: policyd's Classify RPC agrees with the
// vectors; the local fallback is held to the same ones in the client module.
func TestVectorsClassification(t *testing.T) {
	d := startDaemon(t, nil)
	workers := pb.NewRetryPolicyServiceClient(d.conn)
	for _, v := range loadVectors(t).Classification {
		t.Run(v.Name, func(t *testing.T) {
			f := v.Failure.pb(t)
			want := "CATEGORY_" + v.Category
			call := &pb.CallRef{Tenant: "acme", Target: "classify", Idempotent: v.Idempotent}
			if v.HasKey {
				call.IdempotencyKey = "k"
			}
			resp, err := workers.Classify(context.Background(), &pb.ClassifyRequest{Call: call, Failure: f})
			if err != nil {
				t.Fatalf("Classify: %v", err)
			}
			if resp.GetCategory().String() != want || resp.GetReason() != v.Reason || resp.GetRetryable() != v.Retryable {
				t.Errorf("policyd: got %s/%q retryable=%v, want %s/%q retryable=%v",
					resp.GetCategory(), resp.GetReason(), resp.GetRetryable(), want, v.Reason, v.Retryable)
			}
		})
	}
}

func TestVectorsStopReasons(t *testing.T) {
	d := startDaemon(t, nil)
	for _, v := range loadVectors(t).StopReasons {
		t.Run(v.Name, func(t *testing.T) {
			c, sl := newClient(t, d, nil)
			errs := make([]error, len(v.Script))
			for i, f := range v.Script {
				errs[i] = f.err(t)
			}
			fn, calls := script(errs...)
			call := policyclient.Call{Target: "vec-" + strings.ReplaceAll(v.Name, " ", "-"), Idempotent: v.Call.Idempotent,
				SubmissionID: v.Call.SubmissionID, Payload: []byte(v.Call.Payload)}
			if v.Call.DeadlineInSeconds > 0 {
				call.Deadline = sl.Now().Add(time.Duration(v.Call.DeadlineInSeconds * float64(time.Second)))
			}
			res, err := c.Do(context.Background(), call, fn)
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			if res.Disposition.String() != v.Disposition || res.StopReason.String() != v.StopReason || res.Attempts != v.Attempts {
				t.Errorf("got %v/%q after %d attempts (%s), want %s/%q after %d",
					res.Disposition, res.StopReason, res.Attempts, res.Reason, v.Disposition, v.StopReason, v.Attempts)
			}
			if int(calls.Load()) != v.Attempts {
				t.Errorf("fn called %d times, want %d", calls.Load(), v.Attempts)
			}
			if res.Local {
				t.Errorf("decided locally with policyd up")
			}
			if v.MinFirstWaitSeconds > 0 {
				waits := sl.all()
				if len(waits) == 0 || waits[0].Seconds() < v.MinFirstWaitSeconds {
					t.Errorf("waits: got %v, want the first at least %gs", waits, v.MinFirstWaitSeconds)
				}
			}
		})
	}
}

// TestVectorsHTTPResponsesThroughTransport: an upstream fails once with
// each vector's response; Transport, deciding with policyd, retries it or
// returns it as the vector says.
func TestVectorsHTTPResponsesThroughTransport(t *testing.T) {
	d := startDaemon(t, nil)
	for i, v := range loadVectors(t).HTTPResponses {
		t.Run(v.Name, func(t *testing.T) {
			c, sl := newClient(t, d, nil)
			up := startFlakyHTTP(t, reply{status: v.Status, header: v.Headers, body: "failed"}, reply{status: 200, body: "ok"})
			target := "vec-http-" + strconv.Itoa(i)
			hc := &http.Client{Transport: &policyclient.Transport{Client: c, Call: func(*http.Request) policyclient.Call {
				return policyclient.Call{Target: target, Idempotent: v.Idempotent}
			}}}
			resp, err := hc.Get(up.srv.URL)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			readAll(t, resp)
			wantStatus, wantRequests := v.Status, 1
			if v.retried() {
				wantStatus, wantRequests = 200, 2
			}
			if resp.StatusCode != wantStatus || len(up.requests()) != wantRequests {
				t.Errorf("got %d after %d requests, want %d after %d", resp.StatusCode, len(up.requests()), wantStatus, wantRequests)
			}
			v.checkWaits(t, sl.all())
		})
	}
}

// TestVectorsGRPCStatusesThroughInterceptor: the same for a gRPC upstream
// behind UnaryClientInterceptor.
func TestVectorsGRPCStatusesThroughInterceptor(t *testing.T) {
	d := startDaemon(t, nil)
	for i, v := range loadVectors(t).GRPCStatuses {
		t.Run(v.Name, func(t *testing.T) {
			c, sl := newClient(t, d, nil)
			up := &flakyGRPC{script: []grpcReply{{codes.Code(v.Code), v.Trailers["grpc-retry-pushback-ms"]}, {codes.OK, ""}}}
			target := "vec-grpc-" + strconv.Itoa(i)
			health := startFlakyGRPC(t, up, c, func(context.Context, string) policyclient.Call {
				return policyclient.Call{Target: target, Idempotent: v.Idempotent}
			})
			_, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{})
			wantCode, wantCalls := codes.Code(v.Code), 1
			if v.retried() {
				wantCode, wantCalls = codes.OK, 2
			}
			if status.Code(err) != wantCode || len(up.seen()) != wantCalls {
				t.Errorf("got %v after %d calls, want %v after %d", status.Code(err), len(up.seen()), wantCode, wantCalls)
			}
			v.checkWaits(t, sl.all())
		})
	}
}
