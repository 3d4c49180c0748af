package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestAdminCLIPolish runs the admin commands against a real daemon, the way
// an operator does, and checks what they print.
func TestAdminCLIPolish(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "policyd.db")
	d := startDaemon(t, db)
	d.conn(t)
	cli := func(t *testing.T, in string, args ...string) (string, error) {
		t.Helper()
		out, err := runCLI(t, in, append(args, "--addr", d.addr)...)
		return string(out), err
	}

	t.Run("tenant set shows no counters it does not have", func(t *testing.T) {
		// Failed before the fix: set printed TOKENS 0.00 while get showed 100.00.
		out, err := cli(t, dir, "tenant", "set", "acme", "--capacity", "100", "--ratio", "0.1")
		if err != nil {
			t.Fatalf("tenant set: %v: %s", err, out)
		}
		if strings.Contains(out, "TOKENS") || strings.Contains(out, "0.00") {
			t.Errorf("tenant set printed counters it was not given:\n%s", out)
		}
		if !strings.Contains(out, "acme") || !strings.Contains(out, "100") {
			t.Errorf("tenant set does not show the stored budget:\n%s", out)
		}
		out, err = cli(t, dir, "tenant", "get", "acme")
		if err != nil || !strings.Contains(out, "100.00") {
			t.Errorf("tenant get: got %v:\n%s\nwant 100.00 tokens", err, out)
		}
	})

	t.Run("policy set and get print a table with names", func(t *testing.T) {
		// Failed before the fix: both printed raw JSON, gRPC codes as numbers.
		out, err := cli(t, dir, "policy", "set", "--tenant", "acme", "--target", "geocoder", "--max-attempts", "5",
			"--base", "1s", "--cap", "20s", "--jitter", "equal")
		if err != nil {
			t.Fatalf("policy set: %v: %s", err, out)
		}
		for _, want := range []string{"max attempts", "5", "EQUAL", "1s", "20s", "UNAVAILABLE", "CONSECUTIVE", "acme", "geocoder"} {
			if !strings.Contains(out, want) {
				t.Errorf("policy set: no %q in\n%s", want, out)
			}
		}
		if strings.Contains(out, "{") {
			t.Errorf("policy set printed JSON without --json:\n%s", out)
		}
		out, err = cli(t, dir, "policy", "get", "--tenant", "acme", "--target", "geocoder", "--effective")
		if err != nil || !strings.Contains(out, "EQUAL") || !strings.Contains(out, "RESOURCE_EXHAUSTED") {
			t.Errorf("policy get: got %v:\n%s", err, out)
		}
		out, err = cli(t, dir, "policy", "get", "--tenant", "acme", "--target", "geocoder", "--json")
		var v struct {
			Entry struct {
				Policy struct {
					Backoff struct{ Jitter string }
				}
			}
		}
		if err != nil || json.Unmarshal([]byte(out), &v) != nil || v.Entry.Policy.Backoff.Jitter != "JITTER_EQUAL" {
			t.Errorf("policy get --json: got %v:\n%s\nwant JSON with the jitter's name", err, out)
		}
	})

	t.Run("policy set takes and shows the flow ceilings", func(t *testing.T) {
		out, err := cli(t, dir, "policy", "set", "--tenant", "acme", "--target", "portal", "--max-in-flight", "12",
			"--max-rate", "50", "--burst", "5")
		if err != nil {
			t.Fatalf("policy set: %v: %s", err, out)
		}
		if !strings.Contains(out, "at most 12 in flight") || !strings.Contains(out, "at most 50 per second, burst 5") {
			t.Errorf("policy set does not show the ceilings:\n%s", out)
		}
		out, err = cli(t, dir, "policy", "set", "--tenant", "acme", "--target", "portal", "--max-in-flight", "0")
		if err == nil || !strings.Contains(out, "flow.max_in_flight") {
			t.Errorf("policy set --max-in-flight 0: got %v:\n%s\nwant a refusal naming flow.max_in_flight", err, out)
		}
	})

	t.Run("policy set takes and shows the fallback chain", func(t *testing.T) {
		out, err := cli(t, dir, "policy", "set", "--tenant", "acme", "--target", "geo-a", "--fallback", "geo-b,geo-c",
			"--fallback-after", "1", "--fallback-on-circuit-open")
		if err != nil {
			t.Fatalf("policy set: %v: %s", err, out)
		}
		if !strings.Contains(out, "geo-b, geo-c, after 1 attempts per target, on an open circuit") {
			t.Errorf("policy set does not show the fallback chain:\n%s", out)
		}
		out, err = cli(t, dir, "policy", "set", "--tenant", "acme", "--target", "geo-a", "--fallback", "geo-a")
		if err == nil || !strings.Contains(out, "policy.fallback.targets[0]") {
			t.Errorf("policy set --fallback geo-a on geo-a: got %v:\n%s\nwant a refusal naming policy.fallback.targets[0]", err, out)
		}
	})

	t.Run("policy set, policy get and breaker get show the adaptive ceiling", func(t *testing.T) {
		out, err := cli(t, dir, "policy", "set", "--tenant", "acme", "--target", "learner", "--max-in-flight", "20",
			"--adaptive", "--min-in-flight", "3")
		if err != nil {
			t.Fatalf("policy set: %v: %s", err, out)
		}
		want := "adaptive from 3 to 20 in flight: x0.7 on a 429 or a 503 with pushback (once per window, hold 0s), +0.5 per window of successes"
		if !strings.Contains(out, want) {
			t.Errorf("policy set does not show the adaptive ceiling %q:\n%s", want, out)
		}
		if out, err = cli(t, dir, "policy", "get", "--tenant", "acme", "--target", "learner"); err != nil || !strings.Contains(out, want) {
			t.Errorf("policy get: %v, want %q in\n%s", err, want, out)
		}
		out, err = cli(t, dir, "policy", "set", "--tenant", "acme", "--target", "learner", "--adaptive-decrease", "1")
		if err == nil || !strings.Contains(out, "flow.adaptive") {
			t.Errorf("policy set --adaptive-decrease 1 without max-in-flight: got %v:\n%s\nwant a refusal naming flow.adaptive", err, out)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a, err := pb.NewRetryPolicyServiceClient(d.conn(t)).Admit(ctx, &pb.AdmitRequest{
			Call: &pb.CallRef{Tenant: "acme", Target: "learner", CallId: "c1"}, Attempt: 1})
		if err != nil || !a.GetAdmitted() {
			t.Fatalf("Admit: %v, %v", a, err)
		}
		out, err = cli(t, dir, "breaker", "get", "learner", "--tenant", "acme")
		if err != nil || !strings.Contains(out, "CEILING") || !strings.Contains(out, "20 (adaptive 20.00)") ||
			!strings.Contains(out, "concurrency leases in flight: 1") {
			t.Errorf("breaker get: %v, want CEILING 20 (adaptive 20.00) and one lease in\n%s", err, out)
		}
		if out, err = cli(t, dir, "breakers", "--tenant", "acme"); err != nil || !strings.Contains(out, "20 (adaptive 20.00)") {
			t.Errorf("breakers: %v, want the adaptive ceiling in\n%s", err, out)
		}
	})

	t.Run("errors read without internal prefixes", func(t *testing.T) {
		// Failed before the fix: "rpc error: code = NotFound desc = tenant
		// \"ghost\": breakerstore: not found: budget of tenant \"ghost\"".
		out, err := cli(t, dir, "tenant", "get", "ghost")
		if err == nil {
			t.Fatalf("tenant get ghost exited 0: %s", out)
		}
		if got, want := strings.TrimSpace(out), `policyd: tenant "ghost": not found (NotFound)`; got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	})

	t.Run("a token file that is not there is named", func(t *testing.T) {
		// Failed before the fix: from another directory the default file
		// was skipped without a word and the daemon answered
		// "rpc error: code = Unauthenticated ...".
		elsewhere := t.TempDir()
		out, err := cli(t, elsewhere, "breakers")
		if err == nil {
			t.Fatalf("breakers without a token exited 0: %s", out)
		}
		for _, want := range []string{"Unauthenticated", "policyd.db.admin-token", elsewhere, "--token-file"} {
			if !strings.Contains(out, want) {
				t.Errorf("no %q in %q", want, out)
			}
		}
		missing := filepath.Join(elsewhere, "nope.token")
		out, err = cli(t, elsewhere, "breakers", "--token-file", missing)
		if err == nil || !strings.Contains(out, "--token-file "+missing) || !strings.Contains(out, "no such file") {
			t.Errorf("an explicit missing --token-file: got %v, %q; want an error naming it", err, out)
		}
		// Next to the database the default works.
		if out, err := cli(t, dir, "breakers"); err != nil {
			t.Errorf("breakers next to the database: %v: %s", err, out)
		}
	})
}
