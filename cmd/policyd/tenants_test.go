package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestServeTenantFlags: a real daemon with --tenants=declared serves the
// tenants its policy file declares and refuses others with
// PERMISSION_DENIED; with --max-auto-tenants 1 a second undeclared tenant
// gets RESOURCE_EXHAUSTED; a bad --tenants value refuses to start.
func TestServeTenantFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := writeFile(t, dir, "policy.yaml", []byte("tenants:\n  - tenant: acme\n    capacity: 100\n"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nd := func(w pb.RetryPolicyServiceClient, tenant string) error {
		_, err := w.NextDelay(ctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: tenant, Target: "geo", CallId: "c1", Idempotent: true},
			Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}})
		return err
	}

	declared := startDaemon(t, filepath.Join(dir, "declared.db"), "--config", cfg, "--tenants", "declared")
	w := pb.NewRetryPolicyServiceClient(declared.conn(t))
	if err := nd(w, "acme"); err != nil {
		t.Errorf("a declared tenant: %v", err)
	}
	if err := nd(w, "ghost"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "--tenants=declared") {
		t.Errorf("an undeclared tenant: got %v, want PERMISSION_DENIED naming --tenants=declared", err)
	}

	auto := startDaemon(t, filepath.Join(dir, "auto.db"), "--config", cfg, "--max-auto-tenants", "1")
	w = pb.NewRetryPolicyServiceClient(auto.conn(t))
	if err := nd(w, "made-up-1"); err != nil {
		t.Errorf("the first undeclared tenant: %v", err)
	}
	if err := nd(w, "made-up-2"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "cap 1") {
		t.Errorf("a second undeclared tenant: got %v, want RESOURCE_EXHAUSTED naming the cap", err)
	}
	if err := nd(w, "acme"); err != nil {
		t.Errorf("a declared tenant with the automatic cap full: %v", err)
	}

	bad := startDaemon(t, filepath.Join(dir, "bad.db"), "--tenants", "some")
	if err := bad.wait(t); err == nil || !strings.Contains(bad.stderr.String(), "--tenants") {
		t.Errorf("--tenants some: exit %v, said %q; want a refusal naming --tenants", err, bad.stderr)
	}
}
