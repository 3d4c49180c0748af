package server_test

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestStoreErrorsDoNotNameTheEngine: a refusal the store reports reads in
// the API's terms; the engine's package name (breakerstore:) is not part
// of what a client sees.
func TestStoreErrorsDoNotNameTheEngine(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	tests := []struct {
		name string
		call func() error
		code codes.Code
		want string
	}{
		{"unknown tenant", func() error {
			_, err := h.admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: "ghost"})
			return err
		}, codes.NotFound, `tenant "ghost": not found`},
		{"unknown run", func() error {
			_, err := h.admin.GetRun(ctx, &pb.GetRunRequest{RunId: "nightly"})
			return err
		}, codes.NotFound, "not found"},
		{"delete a budget never set", func() error {
			_, err := h.admin.DeleteTenantBudget(ctx, &pb.DeleteTenantBudgetRequest{Tenant: "ghost"})
			return err
		}, codes.NotFound, "not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := status.Convert(tt.call())
			if st.Code() != tt.code || !strings.Contains(st.Message(), tt.want) || strings.Contains(st.Message(), "breakerstore") {
				t.Errorf("got %v %q, want %v with %q and no engine name", st.Code(), st.Message(), tt.code, tt.want)
			}
		})
	}
}
