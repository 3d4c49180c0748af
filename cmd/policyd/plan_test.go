package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

func TestPlanCommandRemaining(t *testing.T) {
	grant := []string{"plan", "--window", "72h", "--base", "2s", "--factor", "2", "--cap", "1h",
		"--attempt-timeout", "30s", "--ttl-margin", "6h", "--json", "--now", "2026-12-01T09:00:00Z"}
	tests := []struct {
		name      string
		args      []string
		attempts  int
		remaining float64
		usable    float64
		ttl       float64
		reason    string
	}{
		{"71h into 72h", []string{"--origin", "2026-11-28T10:00:00Z"}, 11, 3600, 3600, 7 * 3600, ""},
		{"reserve half", []string{"--origin", "2026-12-01T09:00:00Z", "--reserve", "0.5"}, 46, 72 * 3600, 36 * 3600, 78 * 3600, ""},
		{"71h in, reserve half", []string{"--origin", "2026-11-28T10:00:00Z", "--reserve", "0.5"}, 10, 3600, 1800, 7 * 3600, ""},
		{"spent", []string{"--origin", "2026-11-27T09:00:00Z"}, 0, 0, 0, 6 * 3600, "window:spent"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := exec.Command(binary, append(grant, tt.args...)...).Output()
			if err != nil {
				t.Fatalf("plan %v: %v", tt.args, err)
			}
			var got planJSON
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("plan --json: %v in %s", err, out)
			}
			if got.MaxAttempts != tt.attempts || got.RemainingSeconds != tt.remaining || got.UsableSeconds != tt.usable ||
				got.IdempotencyTTLSeconds != tt.ttl || got.Reason != tt.reason || len(got.DelaysSeconds) != max(tt.attempts-1, 0) {
				t.Errorf("plan %v: got %+v, want %d attempts, remaining %vs, usable %vs, TTL %vs, reason %q",
					tt.args, got, tt.attempts, tt.remaining, tt.usable, tt.ttl, tt.reason)
			}
		})
	}
}

func TestPlanCommandRemainingBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"reserve 1", []string{"--reserve", "1"}, "--reserve: must be in [0, 1)"},
		{"negative reserve", []string{"--reserve", "-0.5"}, "--reserve: must be in [0, 1)"},
		{"NaN reserve", []string{"--reserve", "NaN"}, "--reserve: must be in [0, 1)"},
		{"origin ahead", []string{"--origin", "2026-12-01T10:00:00Z", "--now", "2026-12-01T09:00:00Z"}, "--origin: must not be more than 5m0s after --now"},
		{"origin not a time", []string{"--origin", "yesterday"}, "--origin: must be an RFC 3339 time"},
		{"now without origin", []string{"--now", "2026-12-01T09:00:00Z"}, "--now: needs --origin"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(binary, append([]string{"plan", "--window", "1h"}, tt.args...)...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Run(); err == nil {
				t.Fatalf("plan %v exited 0", tt.args)
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("plan %v: got %q, want %q", tt.args, stderr.String(), tt.want)
			}
		})
	}
}
