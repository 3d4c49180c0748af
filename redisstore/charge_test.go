package redisstore_test

import (
	"context"
	"strconv"
	"testing"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
)

// TestDegradedGrantsChargedAfterEachOutage: two replicas, a budget of 10
// tokens that never refills, and Redis stopped (SIGSTOP) three times,
// with a call through each replica between the outages. In each outage
// both replicas grant what their share allows; when Redis answers again
// each charges it what it granted. Over the three outages and the calls
// between them the replicas grant at most the 10 tokens (before the
// charge, each outage, and each transition into one, gave a fresh share
// of the same last known level: 16 here), and the bucket never goes below
// zero.
func TestDegradedGrantsChargedAfterEachOutage(t *testing.T) {
	srv := redistest.Standalone(t)
	r := boundedPair(t, srv.Addr)
	ctx := context.Background()
	const capacity = 10
	if _, err := r[0].admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{
		Tenant: "flap", Capacity: capacity, DepositRatio: 1e-12, MinRetriesPerSecond: 1e-12}}); err != nil {
		t.Fatal(err)
	}
	never := uint32(4_000_000_000) // the breaker never opens: the budget alone limits
	if _, err := r[0].admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "flap", Policy: &pb.Policy{
		Breaker: &pb.BreakerSettings{Mode: pb.BreakerMode_BREAKER_MODE_FAILURE_RATE, MinCalls: &never}}}); err != nil {
		t.Fatal(err)
	}
	for i := range r {
		eventually(t, "the budget on every replica", func() bool {
			b, err := r[i].admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: "flap"})
			return err == nil && b.GetStatus().GetBudget().GetCapacity() == capacity
		})
	}
	granted, n := 0, 0
	spend := func(rep *replica) {
		t.Helper()
		n++
		resp, err := rep.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "flap", Target: "spend",
			CallId: "c" + strconv.Itoa(n), Idempotent: true}, Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}})
		if err != nil {
			t.Fatalf("NextDelay: %v", err)
		}
		if resp.GetDecision() == pb.Decision_DECISION_RETRY {
			granted++
		}
	}
	for i := range r { // what each knows of the bucket
		spend(r[i])
	}
	for round := range 3 {
		srv.Pause(t)
		for i := range r {
			eventually(t, "the engine down, round "+strconv.Itoa(round), func() bool {
				spend(r[i])
				return !r[i].store.Up()
			})
			for range capacity {
				spend(r[i])
			}
		}
		srv.Resume(t)
		for i := range r {
			eventually(t, "the grants charged, round "+strconv.Itoa(round), func() bool {
				return r[i].store.Up() && r[i].store.Debts() == 0
			})
		}
		for i := range r { // traffic between the outages: each replica reads the bucket again
			spend(r[i])
		}
	}
	// An admin read, which a store timeout of this test's 50ms may refuse
	// on a loaded machine: read until it answers.
	var b *pb.GetTenantBudgetResponse
	eventually(t, "the budget read after the outages", func() bool {
		var err error
		b, err = r[0].admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: "flap"})
		return err == nil
	})
	t.Logf("granted %d retries of a budget of %d; %.2f tokens left", granted, capacity, b.GetStatus().GetTokens())
	if granted > capacity {
		t.Errorf("the replicas granted %d retries of a budget of %d over three outages", granted, capacity)
	}
	if b.GetStatus().GetTokens() < 0 {
		t.Errorf("tokens %v, below zero", b.GetStatus().GetTokens())
	}
}
