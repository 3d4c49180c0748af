package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

func TestParseConfigErrorsNameLineAndField(t *testing.T) {
	s, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(t.TempDir(), "policyd.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check := s.CheckBudget
	tests := []struct {
		name, file, want string
	}{
		{"bad factor", "policies:\n  - tenant: acme\n    policy:\n      backoff: {factor: 0.5}\n", "cfg.yaml:2: policies[0].policy.backoff.factor: must be > 1"},
		{"ratio above 1", "tenants:\n  - tenant: a\n  - tenant: b\n    deposit_ratio: 1.5\n", "cfg.yaml:3: tenants[1].deposit_ratio"},
		{"unknown key", "tenant:\n  - x\n", "cfg.yaml:1: unknown key \"tenant\""},
		{"unknown policy field", "policies:\n  - policy: {max_attemps: 3}\n", "cfg.yaml:2: policies[0].policy: "},
		{"duplicate tenant", "tenants:\n  - tenant: a\n  - tenant: a\n", "cfg.yaml:3: tenants[1]: tenant \"a\" is already declared on line 2"},
		{"missing policy", "policies:\n  - tenant: a\n", "cfg.yaml:2: policies[0].policy: is required"},
		{"not YAML", "tenants: [\n", "cfg.yaml: yaml:"},
		{"NaN capacity", "tenants:\n  - tenant: a\n    capacity: .nan\n", "cfg.yaml:2: "},
		{"control char in target", "policies:\n  - target: \"a\\x01\"\n    policy: {}\n", "cfg.yaml:2: policies[0].target"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig("cfg.yaml", []byte(tc.file), check)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	cf, err := parseConfig("cfg.yaml", []byte(goodConfig), check)
	if err != nil {
		t.Fatalf("good config: %v", err)
	}
	if len(cf.budgets) != 1 || len(cf.policies) != 2 || cf.policies[0].policy.MaxAttempts != 5 {
		t.Errorf("good config: got %+v", cf)
	}
}

const goodConfig = `# tenants and policies
tenants:
  - tenant: acme
    capacity: 50
    deposit_ratio: 0.1
policies:
  - tenant: acme
    target: geocoder
    policy:
      max_attempts: 5
      backoff: {base_delay: 1s, factor: 2, max_delay: 20s, jitter: JITTER_EQUAL}
  - target: portal
    policy: {maxAttempts: 4}
`

// TestConfigReloadIsAllOrNothing: the daemon loads --config at start; a
// bad file on SIGHUP changes nothing and says where; a good one applies,
// deleting what it dropped.
func TestConfigReloadIsAllOrNothing(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(cfgPath, []byte(goodConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, filepath.Join(dir, "policyd.db"), "--config", cfgPath)
	admin := pb.NewAdminServiceClient(d.conn(t))
	ctx := context.Background()
	attempts := func(tenant, target string) uint32 {
		t.Helper()
		resp, err := admin.GetPolicy(ctx, &pb.GetPolicyRequest{Tenant: tenant, Target: target})
		if status.Code(err) == codes.NotFound {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetEntry().GetPolicy().GetMaxAttempts()
	}
	if got := attempts("acme", "geocoder"); got != 5 {
		t.Fatalf("after start: got %d attempts, want 5", got)
	}

	bad := strings.Replace(goodConfig, "max_attempts: 5", "max_attempts: 6", 1) +
		"  - target: broken\n    policy:\n      backoff: {factor: 0.5}\n"
	if err := os.WriteFile(cfgPath, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.stderr.waitFor(t, "config reload refused", 1)
	if !strings.Contains(d.stderr.String(), "policy.yaml:14: policies[2].policy.backoff.factor") {
		t.Errorf("the refusal does not say which line and why: %s", d.stderr)
	}
	if got := attempts("acme", "geocoder"); got != 5 {
		t.Errorf("after a bad reload: got %d attempts, want the old 5", got)
	}

	good := strings.Replace(goodConfig, "max_attempts: 5", "max_attempts: 7", 1)
	good = good[:strings.Index(good, "  - target: portal")]
	if err := os.WriteFile(cfgPath, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.stderr.waitFor(t, "config reloaded", 1)
	if got := attempts("acme", "geocoder"); got != 7 {
		t.Errorf("after a good reload: got %d attempts, want 7", got)
	}
	if got := attempts("", "portal"); got != 0 {
		t.Errorf("the dropped portal policy is still there (%d attempts)", got)
	}
}

// TestConfigCheckValidatesOffline runs `policyd config check` as CI would:
// no daemon, exit status and message.
func TestConfigCheckValidatesOffline(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, body string
		ok         bool
		want       string
	}{
		{"good.yaml", goodConfig, true, "good.yaml: ok (1 tenants, 2 policies)"},
		{"factor.yaml", goodConfig + "  - target: broken\n    policy:\n      backoff: {factor: 0.5}\n", false,
			"factor.yaml:14: policies[2].policy.backoff.factor"},
		{"budget.yaml", "tenants:\n  - tenant: acme\n    retry_cost: 3\n    timeout_cost: 1\n", false,
			"budget.yaml:2: tenants[0]"},
		{"key.yaml", "tenant: []\n", false, `key.yaml:1: unknown key "tenant"`},
		{"fallback.yaml", goodConfig + "  - target: geo-a\n    policy:\n      fallback: {targets: [geo-b, geo-a]}\n", false,
			"fallback.yaml:14: policies[2].policy.fallback.targets[1]: must not be the policy's own target"},
		{"fallbacks.yaml", goodConfig + "  - target: geo-a\n    policy:\n      fallback: {targets: [b, c, d, e, f]}\n", false,
			"fallbacks.yaml:14: policies[2].policy.fallback.targets: must name at most 4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runCLI(t, dir, "config", "check", write(tt.name, tt.body))
			if (err == nil) != tt.ok || !strings.Contains(string(out), tt.want) {
				t.Errorf("got %v: %s; want ok=%v and %q", err, out, tt.ok, tt.want)
			}
		})
	}
	out, err := runCLI(t, dir, "config", "check", filepath.Join(dir, "absent.yaml"))
	if err == nil || !strings.Contains(string(out), "absent.yaml") {
		t.Errorf("a missing file: got %v: %s; want an error naming it", err, out)
	}
}

// TestConfigReloadsWhenTheFileChanges: the policy file is reloaded when it
// changes on disk, without SIGHUP, whether it is rewritten in place or
// replaced the way a Kubernetes ConfigMap volume replaces it (policy.yaml ->
// ..data/policy.yaml, ..data swapped by rename); a bad version changes
// nothing.
func TestConfigReloadsWhenTheFileChanges(t *testing.T) {
	version := func(attempts int) string {
		return strings.Replace(goodConfig, "max_attempts: 5", fmt.Sprintf("max_attempts: %d", attempts), 1)
	}
	// A ConfigMap volume: the file is a symlink through ..data to a
	// timestamped directory.
	dir := t.TempDir()
	cm := filepath.Join(dir, "configmap")
	publish := func(n int, body string) {
		t.Helper()
		ts := filepath.Join(cm, fmt.Sprintf("..2026_12_01_%02d", n))
		if err := os.MkdirAll(ts, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ts, "policy.yaml"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(cm, "..data_tmp")
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(cm, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(cm, 0o755); err != nil {
		t.Fatal(err)
	}
	publish(1, version(5))
	if err := os.Symlink(filepath.Join("..data", "policy.yaml"), filepath.Join(cm, "policy.yaml")); err != nil {
		t.Fatal(err)
	}
	// The state file shares the directory: its writes must not count.
	d := startDaemon(t, filepath.Join(cm, "policyd.db"), "--config", filepath.Join(cm, "policy.yaml"))
	admin := pb.NewAdminServiceClient(d.conn(t))
	attempts := func() uint32 {
		t.Helper()
		resp, err := admin.GetPolicy(context.Background(), &pb.GetPolicyRequest{Tenant: "acme", Target: "geocoder"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetEntry().GetPolicy().GetMaxAttempts()
	}

	publish(2, version(6))
	d.stderr.waitFor(t, `"trigger":"file changed"`, 1)
	if got := attempts(); got != 6 {
		t.Errorf("after the ConfigMap swap: got %d attempts, want 6", got)
	}

	publish(3, version(7)+"  - target: broken\n    policy:\n      backoff: {factor: 0.5}\n")
	d.stderr.waitFor(t, "config reload refused", 1)
	if got := attempts(); got != 6 {
		t.Errorf("after a bad version: got %d attempts, want the old 6", got)
	}

	// A plain file rewritten in place, in another daemon's directory.
	plain := filepath.Join(dir, "plain")
	if err := os.MkdirAll(plain, 0o755); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(plain, "policy.yaml")
	if err := os.WriteFile(cfgPath, []byte(version(5)), 0o600); err != nil {
		t.Fatal(err)
	}
	d2 := startDaemon(t, filepath.Join(plain, "policyd.db"), "--config", cfgPath)
	admin = pb.NewAdminServiceClient(d2.conn(t))
	if err := os.WriteFile(cfgPath, []byte(version(8)), 0o600); err != nil {
		t.Fatal(err)
	}
	d2.stderr.waitFor(t, `"trigger":"file changed"`, 1)
	if got := attempts(); got != 8 {
		t.Errorf("after rewriting the file: got %d attempts, want 8", got)
	}
	if n := strings.Count(d2.stderr.String(), "config reload"); n != 1 {
		t.Errorf("one save gave %d reloads, want 1: %s", n, d2.stderr)
	}
}
