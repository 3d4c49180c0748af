package redisstore_test

import (
	"context"
	"strconv"
	"testing"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
)

// TestEngineUpAfterRedisRestart kills Redis under two replicas with
// traffic and starts it again on its AOF: both replicas bring the engine
// up again and answer admin reads and writes, and a write made through
// one is read through the other.
func TestEngineUpAfterRedisRestart(t *testing.T) {
	srv := redistest.Standalone(t)
	r := []*replica{boundedReplica(t, srv.Addr), boundedReplica(t, srv.Addr)}
	ctx := context.Background()
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	call := func(id string) *pb.CallRef {
		return &pb.CallRef{Tenant: "acme", Target: "pay", CallId: id, Idempotent: true}
	}
	for i := range r {
		if _, err := r[i].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("warm"), Attempt: 1, Failure: fail503}); err != nil {
			t.Fatal(err)
		}
	}
	srv.Kill()
	for i := range r {
		n := 0
		eventually(t, "the engine down", func() bool {
			n++
			_, _ = r[i].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("down-" + strconv.Itoa(n)), Attempt: 1, Failure: fail503})
			return !r[i].store.Up()
		})
	}
	srv.Restart(t)
	for i := range r {
		eventually(t, "the engine up after the restart", r[i].store.Up)
	}
	if _, err := r[0].admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "acme", Capacity: 7}}); err != nil {
		t.Fatalf("SetTenantBudget after the restart: %v", err)
	}
	eventually(t, "the budget read through the other replica", func() bool {
		b, err := r[1].admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: "acme"})
		return err == nil && b.GetStatus().GetBudget().GetCapacity() == 7
	})
}
