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
