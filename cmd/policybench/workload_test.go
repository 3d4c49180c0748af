package main

import (
	"context"
	"net"
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

func (f *refusingAdmin) refused() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse > 0 {
		f.refuse--
		return status.Error(codes.Unavailable, "policy: the store is unavailable, try again later")
	}
	return nil
}

func (f *refusingAdmin) SetPolicy(context.Context, *pb.SetPolicyRequest) (*pb.SetPolicyResponse, error) {
	if err := f.refused(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.policies++
	return &pb.SetPolicyResponse{}, nil
}

func (f *refusingAdmin) SetTenantBudget(context.Context, *pb.SetTenantBudgetRequest) (*pb.SetTenantBudgetResponse, error) {
	if err := f.refused(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.budgets++
	return &pb.SetTenantBudgetResponse{}, nil
}

// TestSetupWorkloadSendsAgainAfterUnavailable: an admin write refused
// UNAVAILABLE ("try again later") is sent again, and every write lands.
// Before, the first refusal ended the sweep: a replica whose engine was
// slow for a moment under the test suite's load failed the smoke test.
func TestSetupWorkloadSendsAgainAfterUnavailable(t *testing.T) {
	f := &refusingAdmin{refuse: 3}
	srv := grpc.NewServer()
	pb.RegisterAdminServiceServer(srv, f)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
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
