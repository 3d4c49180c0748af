package policy_test

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// hintVector is one pushback_hints case of the shared test vectors
// (testdata/vectors.json), which both clients' local fallbacks check too.
type hintVector struct {
	Name        string            `json:"name"`
	Now         time.Time         `json:"now"`
	Headers     map[string]string `json:"headers"`
	HintSeconds float64           `json:"hint_seconds"`
	DoNotRetry  bool              `json:"do_not_retry"`
	Note        string            `json:"note"`
}

// loadVectors decodes testdata/vectors.json into file.
func loadVectors(t *testing.T, file any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, file); err != nil {
		t.Fatalf("testdata/vectors.json: %v", err)
	}
}

// failureVector is the failure of a classification vector: exactly one
// kind is set, enums by name without their prefix.
type failureVector struct {
	HTTPStatus     *int   `json:"http_status"`
	GRPCCode       *int   `json:"grpc_code"`
	TransportError string `json:"transport_error"`
	LocalError     string `json:"local_error"`
}

var (
	transportKinds = map[string]policy.TransportKind{"TIMEOUT": policy.TransportTimeout,
		"CONNECTION_RESET": policy.TransportConnectionReset, "CONNECTION_REFUSED": policy.TransportConnectionRefused,
		"DNS": policy.TransportDNS, "TLS": policy.TransportTLS}
	localKinds    = map[string]policy.LocalKind{"PARSE": policy.LocalParse, "VALIDATION": policy.LocalValidation}
	categoryNames = map[policy.Category]string{policy.CategoryTransient: "TRANSIENT", policy.CategoryTerminal: "TERMINAL",
		policy.CategoryUnclassified: "UNCLASSIFIED"}
)

func (f failureVector) failure(t *testing.T) policy.Failure {
	t.Helper()
	switch {
	case f.HTTPStatus != nil:
		return policy.Failure{Kind: policy.FailureHTTP, Code: *f.HTTPStatus}
	case f.GRPCCode != nil:
		return policy.Failure{Kind: policy.FailureGRPC, Code: *f.GRPCCode}
	case transportKinds[f.TransportError] != 0:
		return policy.Failure{Kind: policy.FailureTransport, Transport: transportKinds[f.TransportError]}
	case localKinds[f.LocalError] != 0:
		return policy.Failure{Kind: policy.FailureLocal, Local: localKinds[f.LocalError]}
	}
	t.Fatalf("failure %+v names no failure policy knows", f)
	return policy.Failure{}
}

// verdict is what a vector expects of a classification and its hint.
type verdict struct {
	Idempotent  bool    `json:"idempotent"`
	Category    string  `json:"category"`
	Reason      string  `json:"reason"`
	Retryable   bool    `json:"retryable"`
	HintSeconds float64 `json:"hint_seconds"`
	DoNotRetry  bool    `json:"do_not_retry"`
}

// check holds policy.Classify and policy.ParseHints (honoured up to the
// default max_hint) to v.
func (v verdict) check(t *testing.T, f policy.Failure, hints policy.Hints) {
	t.Helper()
	c := policy.Classify(nil, f, v.Idempotent, false)
	if categoryNames[c.Category] != v.Category || c.Reason != v.Reason || c.Retryable != v.Retryable {
		t.Errorf("Classify: got %s/%q retryable=%v, want %s/%q retryable=%v",
			categoryNames[c.Category], c.Reason, c.Retryable, v.Category, v.Reason, v.Retryable)
	}
	maxHint := policy.Default().Pushback.MaxHint
	h := policy.ParseHints(hints, time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), maxHint)
	if got, want := min(h.Delay, maxHint), time.Duration(v.HintSeconds*float64(time.Second)); got != want || h.DoNotRetry != v.DoNotRetry {
		t.Errorf("ParseHints(%+v): got %v, do-not-retry %v; want %v, %v", hints, got, h.DoNotRetry, want, v.DoNotRetry)
	}
}

// TestVectorsClassification: policy.Classify answers every shared
// classification vector as the daemon's Classify RPC and both clients'
// local fallbacks must.
func TestVectorsClassification(t *testing.T) {
	var file struct {
		Classification []struct {
			Name       string        `json:"name"`
			Failure    failureVector `json:"failure"`
			Idempotent bool          `json:"idempotent"`
			HasKey     bool          `json:"has_key"`
			Category   string        `json:"category"`
			Reason     string        `json:"reason"`
			Retryable  bool          `json:"retryable"`
		} `json:"classification"`
	}
	loadVectors(t, &file)
	if len(file.Classification) == 0 {
		t.Fatal("testdata/vectors.json: classification is empty")
	}
	for _, v := range file.Classification {
		t.Run(v.Name, func(t *testing.T) {
			c := policy.Classify(nil, v.Failure.failure(t), v.Idempotent, v.HasKey)
			if categoryNames[c.Category] != v.Category || c.Reason != v.Reason || c.Retryable != v.Retryable {
				t.Errorf("got %s/%q retryable=%v, want %s/%q retryable=%v",
					categoryNames[c.Category], c.Reason, c.Retryable, v.Category, v.Reason, v.Retryable)
			}
		})
	}
}

// TestVectorsHTTPResponses and TestVectorsGRPCStatuses: policyd's reading
// of the responses and statuses the adapters (Transport, the interceptors,
// the Python transports) meet.
func TestVectorsHTTPResponses(t *testing.T) {
	var file struct {
		HTTPResponses []struct {
			Name    string            `json:"name"`
			Status  int               `json:"status"`
			Headers map[string]string `json:"headers"`
			verdict
		} `json:"http_responses"`
	}
	loadVectors(t, &file)
	if len(file.HTTPResponses) == 0 {
		t.Fatal("testdata/vectors.json: http_responses is empty")
	}
	for _, v := range file.HTTPResponses {
		t.Run(v.Name, func(t *testing.T) {
			h := http.Header{}
			for k, val := range v.Headers {
				h.Set(k, val)
			}
			v.check(t, policy.Failure{Kind: policy.FailureHTTP, Code: v.Status}, policy.Hints{RetryAfter: h.Get("Retry-After"),
				GRPCPushbackMs: h.Get("Grpc-Retry-Pushback-Ms"), XRateLimitReset: h.Get("X-Ratelimit-Reset"),
				XAmzRetryAfter: h.Get("X-Amz-Retry-After")})
		})
	}
}

func TestVectorsGRPCStatuses(t *testing.T) {
	var file struct {
		GRPCStatuses []struct {
			Name     string            `json:"name"`
			Code     int               `json:"code"`
			Trailers map[string]string `json:"trailers"`
			verdict
		} `json:"grpc_statuses"`
	}
	loadVectors(t, &file)
	if len(file.GRPCStatuses) == 0 {
		t.Fatal("testdata/vectors.json: grpc_statuses is empty")
	}
	for _, v := range file.GRPCStatuses {
		t.Run(v.Name, func(t *testing.T) {
			v.check(t, policy.Failure{Kind: policy.FailureGRPC, Code: v.Code},
				policy.Hints{GRPCPushbackMs: v.Trailers["grpc-retry-pushback-ms"]})
		})
	}
}

// TestVectorsPushbackHints: policyd reads every shared pushback vector as
// it says, honouring the hint up to the default max_hint.
func TestVectorsPushbackHints(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "testdata", "vectors.json"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		PushbackHints []hintVector `json:"pushback_hints"`
	}
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatalf("testdata/vectors.json: %v", err)
	}
	if len(file.PushbackHints) == 0 {
		t.Fatal("testdata/vectors.json: pushback_hints is empty")
	}
	maxHint := policy.Default().Pushback.MaxHint
	for _, v := range file.PushbackHints {
		t.Run(v.Name, func(t *testing.T) {
			h := http.Header{}
			for k, val := range v.Headers {
				h.Set(k, val)
			}
			hints := policy.Hints{RetryAfter: h.Get("Retry-After"), GRPCPushbackMs: h.Get("Grpc-Retry-Pushback-Ms"),
				XRateLimitReset: h.Get("X-Ratelimit-Reset"), XAmzRetryAfter: h.Get("X-Amz-Retry-After")}
			got := policy.ParseHints(hints, v.Now, maxHint)
			want := time.Duration(v.HintSeconds * float64(time.Second))
			if honoured := min(got.Delay, maxHint); honoured != want || got.DoNotRetry != v.DoNotRetry || got.Note != v.Note {
				t.Errorf("ParseHints(%+v) = %+v: honoured %v, do-not-retry %v, note %q; want %v, %v, %q",
					hints, got, honoured, got.DoNotRetry, got.Note, want, v.DoNotRetry, v.Note)
			}
		})
	}
}

// TestFallbackChainVectors: where no breaker is open, each attempt of a
// fallback_chains vector goes where Fallback.TargetFor says (the vectors
// with open breakers run against a real daemon in clients/go/e2e, and
// through the clients' local routing).
func TestFallbackChainVectors(t *testing.T) {
	var file struct {
		FallbackChains []struct {
			Name     string `json:"name"`
			Primary  string `json:"primary"`
			Fallback struct {
				Targets       []string `json:"targets"`
				AfterAttempts int      `json:"after_attempts"`
				OnCircuitOpen bool     `json:"on_circuit_open"`
			} `json:"fallback"`
			Open    []string `json:"open"`
			Targets []string `json:"targets"`
		} `json:"fallback_chains"`
	}
	loadVectors(t, &file)
	if len(file.FallbackChains) == 0 {
		t.Fatal("testdata/vectors.json: fallback_chains is empty")
	}
	for _, v := range file.FallbackChains {
		if len(v.Open) > 0 {
			continue
		}
		f := policy.Fallback{Targets: v.Fallback.Targets, AfterAttempts: v.Fallback.AfterAttempts, OnCircuitOpen: v.Fallback.OnCircuitOpen}
		for i, want := range v.Targets {
			if got := f.TargetFor(v.Primary, i+1); got != want {
				t.Errorf("%s: attempt %d goes to %q, want %q", v.Name, i+1, got, want)
			}
		}
	}
}
