package policyclient

import (
	"errors"
	"net/http"
	"testing"
)

// TestAttemptRequestGoesToTheAttemptsTarget: an attempt that policyd sent
// to a fallback target goes to the host Hosts names for it, and one whose
// target has no host is refused as a validation error (terminal).
func TestAttemptRequestGoesToTheAttemptsTarget(t *testing.T) {
	tr := &Transport{Hosts: map[string]string{"geo-backup": "127.0.0.1:9002"}}
	req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:9001/lookup", nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, target, host string
		refused            bool
	}{
		{"the call's own target keeps the request's host", "geo", "127.0.0.1:9001", false},
		{"a fallback target goes to its host", "geo-backup", "127.0.0.1:9002", false},
		{"a fallback target without a host is refused", "geo-elsewhere", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tr.attemptRequest(req, "geo", Attempt{Number: 2, Target: tc.target, IdempotencyKey: "k"}, DefaultKeyHeader)
			var le *LocalError
			switch {
			case tc.refused:
				if !errors.As(err, &le) || le.Kind != Validation {
					t.Errorf("got %v, want a validation error", err)
				}
			case err != nil:
				t.Fatalf("attemptRequest: %v", err)
			case out.URL.Host != tc.host || out.Header.Get(DefaultKeyHeader) != "k":
				t.Errorf("got host %s key %q, want host %s key k", out.URL.Host, out.Header.Get(DefaultKeyHeader), tc.host)
			}
		})
	}
	if req.URL.Host != "127.0.0.1:9001" || req.Header.Get(DefaultKeyHeader) != "" {
		t.Errorf("the caller's request changed: host %s, key %q", req.URL.Host, req.Header.Get(DefaultKeyHeader))
	}
}
