package redisstore_test

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/redisstore"
)

// owingReplica is a replica on a Redis of its own that flushes nothing
// in a test's time (the replayer, which charges debts every
// FlushInterval too, leaves them to the requests), and a NextDelay of a
// new call of tenant "owing" through it, failed with a 503.
func owingReplica(t *testing.T) (*replica, func(id string) (*pb.NextDelayResponse, error)) {
	t.Helper()
	srv := redistest.Standalone(t)
	r := newReplicaWith(t, func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	}, redisstore.Options{Timeout: 2 * time.Second, FlushInterval: time.Hour})
	return r, func(id string) (*pb.NextDelayResponse, error) {
		return r.workers.NextDelay(context.Background(), &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "owing", Target: "api",
			CallId: id, Idempotent: true}, Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}})
	}
}

// TestNextDelayChargesWhatItOwesThenDecidesInOneCall: a replica that owes
// the engine tokens it granted alone (a lone call past its bound spends
// from its share) charges them and then decides the tenant's NextDelay in
// one function call, two round trips. Before, every NextDelay of the
// tenant went the way of many calls (the attempt record read on its own,
// HGETALL, first) until the debt was charged: under load, a lone timeout
// turned a window's thousands of NextDelays into that path and took a
// third off the replicas' throughput (BENCHMARKS.md, "Session 22").
func TestNextDelayChargesWhatItOwesThenDecidesInOneCall(t *testing.T) {
	r, nextDelay := owingReplica(t)
	ctx := context.Background()
	if _, err := r.admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{
		Tenant: "owing", Capacity: 100, DepositRatio: 1e-12, MinRetriesPerSecond: 1e-12}}); err != nil {
		t.Fatal(err)
	}
	if _, err := nextDelay("warm"); err != nil { // the budget, the policy and this replica's share read
		t.Fatal(err)
	}
	redisstore.OweAlone(r.store, "owing", 1)
	before := r.store.RoundTrips()
	if got, err := nextDelay("after"); err != nil || got.GetDecision() != pb.Decision_DECISION_RETRY || got.GetDegraded() {
		t.Fatalf("NextDelay after the lone grant = %v, %v; want a RETRY not flagged degraded", got, err)
	}
	// What the replica sends whatever the requests: the feed, the
	// heartbeat, the replica set, the caches' reloads, new connections.
	background := map[string]bool{"xread": true, "pipeline zadd": true, "smembers": true, "policyd_read": true,
		"policyd_read_many": true, "hello": true, "pipeline client": true}
	trips := map[string]uint64{}
	for call, n := range r.store.RoundTrips() {
		if d := n - before[call]; d > 0 && !background[call] {
			trips[call] = d
		}
	}
	want := map[string]uint64{"policyd_charge": 1, "policyd_nextdelay": 1}
	if !maps.Equal(trips, want) {
		t.Errorf("the NextDelay's round trips = %v, want %v", trips, want)
	}
	if n := r.store.Debts(); n != 0 {
		t.Errorf("%d debts left after the NextDelay, want 0", n)
	}
	tokens, err := r.admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: "owing"})
	if err != nil {
		t.Fatal(err)
	}
	if got := tokens.GetStatus().GetTokens(); got < 96.9 || got > 97.1 {
		t.Errorf("tokens = %v, want 97: two retries and the one owed, each of the default cost", got)
	}
}

// TestConcurrentNextDelaysChargeWhatIsOwedOnce: 16 NextDelays of a tenant
// sent at once to a replica that owes the engine tokens it granted alone
// send the charge once (the others wait for it) and are each decided in
// one call.
func TestConcurrentNextDelaysChargeWhatIsOwedOnce(t *testing.T) {
	r, nextDelay := owingReplica(t)
	if _, err := nextDelay("warm"); err != nil {
		t.Fatal(err)
	}
	redisstore.OweAlone(r.store, "owing", 1)
	before := r.store.RoundTrips()
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Go(func() { _, errs[i] = nextDelay("c" + strconv.Itoa(i)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	after := r.store.RoundTrips()
	delta := func(calls ...string) (n uint64) {
		for _, c := range calls {
			n += after[c] - before[c]
		}
		return n
	}
	if n := delta("policyd_charge", "pipeline policyd_charge"); n != 1 {
		t.Errorf("the debt was charged in %d round trips, want 1", n)
	}
	if n := delta("hgetall", "policyd_spend", "pipeline policyd_spend"); n != 0 {
		t.Errorf("%d round trips of the many-call path (an attempt record read, a spend), want 0", n)
	}
	if n := r.store.Debts(); n != 0 {
		t.Errorf("%d debts left, want 0", n)
	}
}
