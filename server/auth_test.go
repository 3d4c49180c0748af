package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

func withToken(tok string) context.Context {
	if tok == "" {
		return context.Background()
	}
	return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
}

// TestAuthMatrix: who may call what, with admin and tenant tokens.
func TestAuthMatrix(t *testing.T) {
	h := newHarness(t, func(c *server.Config, _ *breakerstore.Options) {
		c.Auth = server.NewAuth(server.AuthConfig{
			AdminTokens:  []string{"admin-secret"},
			TenantTokens: map[string]string{"tok-a": "tenant-a", "tok-b": "tenant-b"},
		})
	})
	// tenant-b has state; tenant-c does not exist: the answers must match.
	if _, err := h.admin.SetTenantBudget(withToken("admin-secret"), &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "tenant-b", Capacity: 5}}); err != nil {
		t.Fatal(err)
	}
	nd := func(tok, tenant string) error {
		_, err := h.workers.NextDelay(withToken(tok), &pb.NextDelayRequest{Call: call(tenant, "geo", "c"), Attempt: 1, Failure: http(503)})
		return err
	}
	getBudget := func(tok string) error {
		_, err := h.admin.GetTenantBudget(withToken(tok), &pb.GetTenantBudgetRequest{Tenant: "tenant-b"})
		return err
	}
	report := func(tok string, tenants ...string) error {
		req := &pb.ReportOutcomeRequest{}
		for _, tn := range tenants {
			req.Outcomes = append(req.Outcomes, &pb.Outcome{Call: call(tn, "geo", "c"), Attempt: 1, Success: true})
		}
		_, err := h.workers.ReportOutcome(withToken(tok), req)
		return err
	}
	watch := func(tok, tenant string) error {
		stream, err := h.workers.WatchBreakers(withToken(tok), &pb.WatchBreakersRequest{Tenant: tenant})
		if err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	tests := []struct {
		name string
		err  error
		want codes.Code
	}{
		{"admin token calls admin RPCs", getBudget("admin-secret"), codes.OK},
		{"no credential calls admin RPCs", getBudget(""), codes.Unauthenticated},
		{"worker token calls admin RPCs", getBudget("tok-a"), codes.PermissionDenied},
		{"unknown token", getBudget("guess"), codes.Unauthenticated},
		{"tenant acts for itself", nd("tok-a", "tenant-a"), codes.OK},
		{"tenant A spends B's budget", nd("tok-a", "tenant-b"), codes.PermissionDenied},
		{"tenant A names a tenant that does not exist", nd("tok-a", "tenant-c"), codes.PermissionDenied},
		{"worker call without a token", nd("", "tenant-a"), codes.Unauthenticated},
		{"admin acts for any tenant", nd("admin-secret", "tenant-b"), codes.OK},
		{"tenant A reports for B inside a batch", report("tok-a", "tenant-a", "tenant-b"), codes.PermissionDenied},
		{"tenant A reports for itself", report("tok-a", "tenant-a", "tenant-a"), codes.OK},
		{"tenant A watches B's breakers", watch("tok-a", "tenant-b"), codes.PermissionDenied},
		{"tenant A watches every tenant", watch("tok-a", ""), codes.PermissionDenied},
		{"tenant A watches its own breakers", watch("tok-a", "tenant-a"), codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == codes.OK {
				if tc.err != nil {
					t.Fatalf("got %v, want OK", tc.err)
				}
				return
			}
			wantCode(t, tc.err, tc.want)
		})
	}
	// The refusal reads the same whether or not the other tenant exists.
	a, b := nd("tok-a", "tenant-b"), nd("tok-a", "tenant-c")
	if ma, mb := statusMsg(a), statusMsg(b); ma == "" || len(ma) != len(mb) {
		t.Errorf("refusals differ beyond the name: %q vs %q", ma, mb)
	}
}

func TestOpenAdminMode(t *testing.T) {
	h := newHarness(t, func(c *server.Config, _ *breakerstore.Options) {
		c.Auth = server.NewAuth(server.AuthConfig{OpenAdmin: true})
	})
	if _, err := h.admin.ListBreakers(context.Background(), &pb.ListBreakersRequest{}); err != nil {
		t.Errorf("open admin mode: %v", err)
	}
}

// TestAnotherTenantsRunReadsAsMissing: naming a run of another tenant
// answers exactly as naming a run that does not exist.
func TestAnotherTenantsRunReadsAsMissing(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "b-nightly", Tenant: "tenant-b", RetryPool: 5,
		CutoffTime: timestampIn(h, time.Hour)}); err != nil {
		t.Fatal(err)
	}
	try := func(run string) error {
		c := call("tenant-a", "geo", "c")
		c.RunId = run
		_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: 1, Failure: http(503)})
		return err
	}
	theirs, missing := try("b-nightly"), try("no-such")
	wantCode(t, theirs, codes.NotFound)
	wantCode(t, missing, codes.NotFound)
	if a, b := statusMsg(theirs), statusMsg(missing); strings.Replace(a, "b-nightly", "no-such", 1) != b {
		t.Errorf("the answers differ: %q vs %q", a, b)
	}
}
