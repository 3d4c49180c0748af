package policyclient_test

import (
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// The shared test vectors of the Go and Python clients
// (clients/python/tests/test_vectors.py reads the same file): the sections
// the client answers alone. Those that need policyd run against a real
// daemon in clients/go/e2e, outside this module, so that a worker's build
// of the client never meets the daemon's packages.
type vectorFile struct {
	FallbackChains []fallbackChainVector `json:"fallback_chains"`
	Classification []struct {
		Name       string      `json:"name"`
		Failure    failureSpec `json:"failure"`
		Idempotent bool        `json:"idempotent"`
		HasKey     bool        `json:"has_key"`
		Category   string      `json:"category"`
		Reason     string      `json:"reason"`
	} `json:"classification"`
	PushbackHints []struct {
		Name        string            `json:"name"`
		Now         time.Time         `json:"now"`
		Headers     map[string]string `json:"headers"`
		HintSeconds float64           `json:"hint_seconds"`
		DoNotRetry  bool              `json:"do_not_retry"`
	} `json:"pushback_hints"`
	HTTPResponses []struct {
		Name    string            `json:"name"`
		Status  int               `json:"status"`
		Headers map[string]string `json:"headers"`
		verdict
	} `json:"http_responses"`
	GRPCStatuses []struct {
		Name     string            `json:"name"`
		Code     uint32            `json:"code"`
		Trailers map[string]string `json:"trailers"`
		verdict
	} `json:"grpc_statuses"`
	IdempotencyKeys []struct {
		SubmissionID string  `json:"submission_id"`
		PayloadUTF8  *string `json:"payload_utf8"`
		PayloadHex   *string `json:"payload_hex"`
		Key          string  `json:"key"`
	} `json:"idempotency_keys"`
}

// verdict is what a vector expects of a classification and its hint.
type verdict struct {
	Idempotent  bool    `json:"idempotent"`
	Category    string  `json:"category"`
	Reason      string  `json:"reason"`
	HintSeconds float64 `json:"hint_seconds"`
	DoNotRetry  bool    `json:"do_not_retry"`
}

// check holds the client's reading of err and its local fallback's verdict
// to v.
func (v verdict) check(t *testing.T, err error) {
	t.Helper()
	cat, reason, hint, dnr := policyclient.LocalVerdict(err, v.Idempotent, time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	if cat.String() != "CATEGORY_"+v.Category || reason != v.Reason {
		t.Errorf("local fallback: got %s/%q, want CATEGORY_%s/%q", cat, reason, v.Category, v.Reason)
	}
	if want := time.Duration(v.HintSeconds * float64(time.Second)); hint != want || dnr != v.DoNotRetry {
		t.Errorf("local fallback: got hint %v, do-not-retry %v; want %v, %v", hint, dnr, want, v.DoNotRetry)
	}
}

// failureSpec is one failure of a vector: exactly one kind is set.
type failureSpec struct {
	HTTPStatus     *uint32 `json:"http_status"`
	GRPCCode       *uint32 `json:"grpc_code"`
	TransportError string  `json:"transport_error"`
	LocalError     string  `json:"local_error"`
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
	if len(v.Classification) == 0 || len(v.IdempotencyKeys) == 0 || len(v.PushbackHints) == 0 ||
		len(v.HTTPResponses) == 0 || len(v.GRPCStatuses) == 0 || len(v.FallbackChains) == 0 {
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

func TestVectorsIdempotencyKeys(t *testing.T) {
	for _, v := range loadVectors(t).IdempotencyKeys {
		var payload []byte
		switch {
		case v.PayloadUTF8 != nil:
			payload = []byte(*v.PayloadUTF8)
		case v.PayloadHex != nil:
			var err error
			if payload, err = hex.DecodeString(*v.PayloadHex); err != nil {
				t.Fatalf("%q: payload_hex: %v", v.SubmissionID, err)
			}
		default:
			t.Fatalf("%q: no payload", v.SubmissionID)
		}
		if got := policyclient.IdempotencyKey(v.SubmissionID, payload); got != v.Key {
			t.Errorf("IdempotencyKey(%q, %x): got %s, want %s", v.SubmissionID, payload, got, v.Key)
		}
	}
}

// TestVectorsLocalClassification: the local fallback classifies as the
// vectors say policyd does (clients/go/e2e holds policyd to the same ones).
func TestVectorsLocalClassification(t *testing.T) {
	for _, v := range loadVectors(t).Classification {
		t.Run(v.Name, func(t *testing.T) {
			want := "CATEGORY_" + v.Category
			cat, reason := policyclient.ClassifyLocal(v.Failure.pb(t), v.Idempotent, v.HasKey)
			if cat.String() != want || reason != v.Reason {
				t.Errorf("local fallback: got %s/%q, want %s/%q", cat, reason, want, v.Reason)
			}
		})
	}
}

// TestVectorsPushbackHints: the local fallback honours every valid hint up
// to the default max_hint, as policyd does (policy/vectors_test.go).
func TestVectorsPushbackHints(t *testing.T) {
	for _, v := range loadVectors(t).PushbackHints {
		t.Run(v.Name, func(t *testing.T) {
			h := http.Header{}
			for k, val := range v.Headers {
				h.Set(k, val)
			}
			hint, dnr := policyclient.LocalHint(policyclient.HTTPError(503, h), v.Now)
			if want := time.Duration(v.HintSeconds * float64(time.Second)); hint != want || dnr != v.DoNotRetry {
				t.Errorf("local fallback: got hint %v, do-not-retry %v; want %v, %v", hint, dnr, want, v.DoNotRetry)
			}
		})
	}
}

// TestVectorsHTTPResponses: a response as Transport turns it into an error
// (HTTPError of its status and headers), read by the local fallback.
func TestVectorsHTTPResponses(t *testing.T) {
	for _, v := range loadVectors(t).HTTPResponses {
		t.Run(v.Name, func(t *testing.T) {
			h := http.Header{}
			for k, val := range v.Headers {
				h.Set(k, val)
			}
			v.check(t, policyclient.HTTPError(v.Status, h))
		})
	}
}

// TestVectorsGRPCStatuses: a status as the interceptors turn it into an
// error (GRPCError of the status and the trailers), read by the local
// fallback.
func TestVectorsGRPCStatuses(t *testing.T) {
	for _, v := range loadVectors(t).GRPCStatuses {
		t.Run(v.Name, func(t *testing.T) {
			v.check(t, policyclient.GRPCError(status.Error(codes.Code(v.Code), "upstream said no"), metadata.New(v.Trailers)))
		})
	}
}

// fallbackChainVector is one fallback_chains case: a call to primary
// under fallback, the breakers of open forced open, every attempt failing
// with 503 (at most 3): each attempt's target and how the call ends.
type fallbackChainVector struct {
	Name     string `json:"name"`
	Primary  string `json:"primary"`
	Fallback struct {
		Targets       []string `json:"targets"`
		AfterAttempts uint32   `json:"after_attempts"`
		OnCircuitOpen bool     `json:"on_circuit_open"`
	} `json:"fallback"`
	Open        []string `json:"open"`
	Targets     []string `json:"targets"`
	Disposition string   `json:"disposition"`
	StopReason  string   `json:"stop_reason"`
}

// TestFallbackChainVectors: the local fallback routes each attempt along
// the chain as policyd does (clients/go/e2e runs the same vectors against
// a real daemon, and against this route with the daemon stopped).
func TestFallbackChainVectors(t *testing.T) {
	for _, v := range loadVectors(t).FallbackChains {
		t.Run(v.Name, func(t *testing.T) {
			fb := &pb.FallbackSettings{Targets: v.Fallback.Targets, AfterAttempts: v.Fallback.AfterAttempts,
				OnCircuitOpen: v.Fallback.OnCircuitOpen}
			var got []string
			end := "dead_letter/ATTEMPTS_EXHAUSTED"
			for n := 1; n <= 3; n++ {
				target, ok := policyclient.LocalChainRoute(v.Primary, fb, n, v.Open)
				if !ok {
					end = "circuit_open/CIRCUIT_OPEN"
					break
				}
				got = append(got, target)
			}
			if g, w := strings.Join(got, " ")+" "+end, strings.Join(v.Targets, " ")+" "+v.Disposition+"/"+v.StopReason; g != w {
				t.Errorf("targets and end: %s, want %s", g, w)
			}
		})
	}
}
