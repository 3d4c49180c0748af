package main

import (
	"maps"
	"testing"
)

func TestParseCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_fcall:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=1\r\n" +
		"cmdstat_info:calls=3,usec=90,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_xread|group:calls=x,usec=1\r\n" +
		"not a stat line\r\n"
	got := parseCommandStats(info)
	want := map[string]uint64{"fcall": 12, "info": 3}
	if !maps.Equal(got, want) {
		t.Errorf("parseCommandStats = %v, want %v", got, want)
	}
}

func TestFailureClass(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`outcomes: tenant "bench-t3": redisstore: policyd_outcomes: read tcp 127.0.0.1:33070->127.0.0.1:46605: i/o timeout`,
			`outcomes: tenant "…": redisstore: policyd_outcomes: read tcp ADDR->ADDR: i/o timeout`},
		{"decision: redisstore: commit: EOF", "decision: redisstore: commit: EOF"},
	} {
		if got := failureClass(tc.in); got != tc.want {
			t.Errorf("failureClass(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
