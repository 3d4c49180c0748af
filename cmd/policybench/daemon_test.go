package main

import (
	"strings"
	"testing"
	"time"
)

// TestDaemonLogSumsSlowRequests: the daemon's "slow requests" lines (one
// a second at most, each a count and its slowest call) add up until
// takeSlow, which starts counting again.
func TestDaemonLogSumsSlowRequests(t *testing.T) {
	l := newDaemonLog()
	l.consume(strings.NewReader(`{"time":"t","level":"INFO","msg":"policyd serving","listen":"127.0.0.1:1"}
{"time":"t","level":"WARN","msg":"slow requests","count":3,"over":"60ms","slowest":"70.3ms","slowest_call":"Admit acme/geo attempt 1, degraded"}
{"time":"t","level":"WARN","msg":"slow requests","count":2,"over":"60ms","slowest":"82.67ms","slowest_call":"NextDelay acme/pay attempt 2, degraded"}
{"time":"t","level":"WARN","msg":"slow requests","count":1,"over":"60ms","slowest":"61ms","slowest_call":"ReportOutcome of 256 outcomes"}
`))
	got := l.takeSlow()
	want := slowRequests{Count: 6, Slowest: 82670 * time.Microsecond, What: "NextDelay acme/pay attempt 2, degraded"}
	if got != want {
		t.Errorf("takeSlow = %+v, want %+v", got, want)
	}
	if again := l.takeSlow(); again != (slowRequests{}) {
		t.Errorf("takeSlow again = %+v, want nothing", again)
	}
}
