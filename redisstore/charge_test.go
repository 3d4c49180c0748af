package redisstore_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/redisstore"
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

// owingReplica is a replica that owes the engine one debt: a NextDelay of
// acme's whose engine call timed out while the replica still counted
// Redis up, granted from the replica's share. It never counts Redis
// down, and its replayer does not tick within a test: the debt is left
// to the decisions. fail makes a NextDelay of a new call of acme's.
func owingReplica(t *testing.T) (r *replica, fail func(id string) *pb.NextDelayResponse) {
	t.Helper()
	srv := redistest.Standalone(t)
	r = newReplicaWith(t, func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true,
			ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	}, redisstore.Options{Timeout: 50 * time.Millisecond, DownAfter: 1 << 20, FlushInterval: time.Hour})
	fail = func(id string) *pb.NextDelayResponse {
		t.Helper()
		resp, err := r.workers.NextDelay(context.Background(), &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: id, Idempotent: true},
			Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}})
		if err != nil {
			t.Errorf("NextDelay %s: %v", id, err)
		}
		return resp
	}
	fail("owe-0") // the replica's share of acme's bucket
	srv.Pause(t)
	resp := fail("owe-1")
	srv.Resume(t)
	if resp.GetDecision() != pb.Decision_DECISION_RETRY || !resp.GetDegraded() {
		t.Fatalf("NextDelay with Redis paused = %v, want RETRY from the replica's share, flagged degraded", resp)
	}
	if n := r.store.Debts(); n != 1 {
		t.Fatalf("debts after the grant made alone = %d, want 1", n)
	}
	return r, fail
}

// TestNextDelayOwingChargesThenDecidesInOneCall: once Redis answers again,
// the owing tenant's next NextDelay charges the debt and is then decided
// in one call of policyd_nextdelay: two round trips, none of the batch
// path's (the attempt read, the breaker's record, the spend, the
// attempt's write). It took the batch path until the replayer charged the
// debt, and under load the lone call that timed out then made the next
// debt first.
func TestNextDelayOwingChargesThenDecidesInOneCall(t *testing.T) {
	r, fail := owingReplica(t)
	r.trips.take()
	if resp := fail("c"); resp.GetDecision() != pb.Decision_DECISION_RETRY || resp.GetDegraded() {
		t.Errorf("NextDelay with Redis answering again = %v, want RETRY, not degraded", resp)
	}
	if n, cmds := r.trips.take(); n != 2 || cmds["fcall"] != 2 {
		t.Errorf("NextDelay owing a debt: %d round trips %v, want 2 (policyd_charge, then policyd_nextdelay)", n, cmds)
	}
	if n := r.store.Debts(); n != 0 {
		t.Errorf("debts after the NextDelay = %d, want 0 (charged)", n)
	}
}

// TestConcurrentNextDelaysOwingChargeOnce: 16 NextDelays of the owing
// tenant at once charge its one debt once between them; the others wait
// for that charge and decide in one call each.
func TestConcurrentNextDelaysOwingChargeOnce(t *testing.T) {
	r, fail := owingReplica(t)
	r.trips.takeFCalls()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() { fail("c" + strconv.Itoa(i)) })
	}
	wg.Wait()
	fns := r.trips.takeFCalls()
	if fns["policyd_charge"] != 1 || fns["policyd_nextdelay"] != 16 {
		t.Errorf("16 NextDelays owing one debt at once made FCALLs %v, want policyd_charge 1 and policyd_nextdelay 16", fns)
	}
	if n := r.store.Debts(); n != 0 {
		t.Errorf("debts after the NextDelays = %d, want 0 (charged)", n)
	}
}
