package main

import (
	"context"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// refusingAdmin is a replica's admin service as setupWorkload uses it:
// the first refuse writes answer UNAVAILABLE, as a replica does while its
// engine is counted down, and the rest are recorded.
type refusingAdmin struct {
	pb.UnimplementedAdminServiceServer
	mu       sync.Mutex
	refuse   int
	policies int
	budgets  int
}

// write refuses, or records a write in n.
func (f *refusingAdmin) write(n *int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse > 0 {
		f.refuse--
		return status.Error(codes.Unavailable, "policy: the store is unavailable, try again later")
	}
	*n++
	return nil
}

func (f *refusingAdmin) SetPolicy(context.Context, *pb.SetPolicyRequest) (*pb.SetPolicyResponse, error) {
	return &pb.SetPolicyResponse{}, f.write(&f.policies)
}

func (f *refusingAdmin) SetTenantBudget(context.Context, *pb.SetTenantBudgetRequest) (*pb.SetTenantBudgetResponse, error) {
	return &pb.SetTenantBudgetResponse{}, f.write(&f.budgets)
}

// TestSetupWorkloadSendsAgainAfterUnavailable: an admin write refused
// UNAVAILABLE ("try again later") is sent again, and every write lands.
// Before, the first refusal ended the sweep: a replica whose engine was
// slow for a moment under the test suite's load failed the smoke test.
func TestSetupWorkloadSendsAgainAfterUnavailable(t *testing.T) {
	f := &refusingAdmin{refuse: 3}
	addr := serveFake(t, func(srv *grpc.Server) { pb.RegisterAdminServiceServer(srv, f) })
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := setupWorkload(context.Background(), pb.NewAdminServiceClient(conn)); err != nil {
		t.Fatalf("setupWorkload = %v", err)
	}
	wantPolicies := benchCeiled + benchTenants*(1+benchFailing)
	if f.policies != wantPolicies || f.budgets != benchTenants {
		t.Errorf("%d policies and %d budgets set; want %d and %d", f.policies, f.budgets, wantPolicies, benchTenants)
	}
}
