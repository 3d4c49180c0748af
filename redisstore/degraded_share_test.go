package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
	"github.com/policyd/policyd/server/storetest"
)

// degradedReplicas opens n stores on one Redis at clock: a store call
// ends at 50ms, and the first that does puts the store in degraded mode
// until a probe an hour later (so only the test's SIGCONT and a later
// call bring it back: the feeds' reads).
func degradedReplicas(t *testing.T, addr string, clock func() time.Time, n int) []*redisstore.Store {
	t.Helper()
	s, _ := degradedReplicasOn(t, addr, clock, n)
	return s
}

// degradedReplicasOn is degradedReplicas, with the stores' clients.
func degradedReplicasOn(t *testing.T, addr string, clock func() time.Time, n int) ([]*redisstore.Store, []*redis.Client) {
	t.Helper()
	var out []*redisstore.Store
	var clients []*redis.Client
	for range n {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
		clients = append(clients, c)
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Timeout: 50 * time.Millisecond, Clock: clock,
			DownAfter: 1, DownFor: time.Hour, Heartbeat: 10 * time.Millisecond})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		out = append(out, s)
	}
	for _, s := range out {
		eventually(t, "every replica in the replica set", func() bool { return s.LiveReplicas() == n })
	}
	return out, clients
}

// TestDegradedSharesOfStaleLevels: a replica's share in degraded mode
// must not count tokens and retries other replicas spent after it last
// read the level. Three replicas spend a budget of 9 tokens and a pool of
// 9 retries that never refill, each after the one before: replica 0 once
// (it reads 8 left), replica 1 four times (4 left), replica 2 until it is
// refused. Redis stops (SIGSTOP) and every replica asks for more. A share
// of each replica's last read level (before: 8/3 and 4/3, rounded down)
// granted 3 more than the 9 (12 grants of 9, the stop-redis scenario's
// 401 of 400 on a small scale); the shares the engine sets aside keep the
// grants, the engine's and the replicas' alone, within the 9.
func TestDegradedSharesOfStaleLevels(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock()
	r := degradedReplicas(t, srv.Addr, clock.Now, 3)
	const capacity = 9
	if _, err := r[0].SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: capacity, DepositRatio: 1e-12,
		MinPerSecond: 1e-12, RetryCost: 1, TimeoutCost: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := r[0].OpenRun(policy.Run{ID: "run-1", Tenant: "acme", Pool: capacity, Cutoff: clock.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	for i := range r {
		eventually(t, "the budget on every replica", func() bool {
			st, err := r[i].Budget("acme")
			return err == nil && st.Budget.Capacity == capacity
		})
	}
	granted := map[string]int{}
	spend := func(s *redisstore.Store, run string) policy.Spend {
		t.Helper()
		sp, err := s.SpendRetry(policy.SpendRequest{Tenant: "acme", RunID: run})
		if err != nil {
			t.Fatalf("SpendRetry = %v", err)
		}
		if sp.Granted {
			granted[run]++
		}
		return sp
	}
	for _, run := range []string{"", "run-1"} {
		granted[run] = 0
	}
	// The tenant's bucket through calls without a run, the pool through a
	// run's; every grant of a run's call also takes a token, so the
	// bucket gets 9 of the calls with and without a run together.
	for i, n := range []int{1, 4} {
		for range n {
			if sp := spend(r[i], "run-1"); !sp.Granted || sp.Degraded {
				t.Fatalf("replica %d: SpendRetry with Redis up = %+v, want granted", i, sp)
			}
		}
	}
	for spend(r[2], "run-1").Granted {
	}
	up := granted["run-1"]

	srv.Pause(t)
	for i := range r {
		for range capacity {
			if sp := spend(r[i], "run-1"); sp.Granted && !sp.Degraded {
				t.Fatalf("replica %d: a grant with Redis stopped not flagged degraded: %+v", i, sp)
			}
		}
		for range capacity {
			spend(r[i], "")
		}
	}
	srv.Resume(t)
	got := granted["run-1"] + granted[""]
	t.Logf("granted %d with Redis up, %d in degraded mode", up, got-up)
	if got > capacity {
		t.Errorf("the replicas granted %d retries of a budget of %d (%d of a pool of %d): %d in degraded mode with nothing left",
			got, capacity, granted["run-1"], capacity, got-capacity)
	}
	if got == up {
		t.Errorf("no grant in degraded mode: the replicas that spent had shares left")
	}
}

// TestDegradedSharesNeverOverspend: the property across replicas. Three
// replicas spend a budget and a pool that never refill from 12 callers
// at once, through two outages (SIGSTOP) and the traffic between them;
// however the engine's grants and the replicas' grants alone interleave
// (replies to concurrent calls out of order, calls that time out), the
// grants never pass the tokens nor the pool, and the bucket never goes
// below zero.
func TestDegradedSharesNeverOverspend(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock()
	r := degradedReplicas(t, srv.Addr, clock.Now, 3)
	const tokens, pool = 60, 40
	if _, err := r[0].SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: tokens, DepositRatio: 1e-12,
		MinPerSecond: 1e-12, RetryCost: 1, TimeoutCost: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := r[0].OpenRun(policy.Run{ID: "run-1", Tenant: "acme", Pool: pool, Cutoff: clock.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	for i := range r {
		eventually(t, "the budget on every replica", func() bool {
			st, err := r[i].Budget("acme")
			return err == nil && st.Budget.Capacity == tokens
		})
	}
	var mu sync.Mutex
	var cost float64
	runGrants := 0
	phase := func(rounds int) {
		var wg sync.WaitGroup
		for g := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := r[g%3]
				for i := range rounds {
					req := policy.SpendRequest{Tenant: "acme", Timeout: (g+i)%4 == 0}
					if (g+i)%2 == 0 {
						req.RunID = "run-1"
					}
					sp, err := s.SpendRetry(req)
					if err != nil {
						t.Errorf("SpendRetry = %v", err)
						return
					}
					if !sp.Granted {
						continue
					}
					mu.Lock()
					cost++
					if req.Timeout {
						cost++
					}
					if req.RunID != "" {
						runGrants++
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	phase(2)
	for range 2 {
		srv.Pause(t)
		phase(6)
		srv.Resume(t)
		for i := range r {
			eventually(t, "the grants charged", func() bool { return r[i].Up() && r[i].Debts() == 0 })
		}
		phase(2)
	}
	var st policy.BudgetStatus
	var run policy.Run
	eventually(t, "the budget and the run read", func() bool {
		var err1, err2 error
		st, err1 = r[0].Budget("acme")
		run, err2 = r[0].Run("run-1")
		return err1 == nil && err2 == nil
	})
	// Fewer grants than tokens taken: a spend that timed out as Redis
	// stopped ran after SIGCONT, its answer lost (the replica answered
	// from its share instead).
	t.Logf("granted %v tokens of %d (%.2f left), %d retries of a pool of %d (%d spent)", cost, tokens, st.Tokens, runGrants, pool, run.Spent)
	if cost > tokens || st.Tokens < 0 {
		t.Errorf("granted %v tokens of a budget of %d, %.2f left; want at most the budget, never below zero", cost, tokens, st.Tokens)
	}
	if runGrants > pool || run.Spent > pool {
		t.Errorf("granted %d retries of a pool of %d (%d spent); want at most the pool", runGrants, pool, run.Spent)
	}
}

// sharesSetup opens two replicas over a budget of 10 tokens, spends once
// through replica 0 and then through replica 1 until it is refused, and
// returns them, replica 0's client, the locks of the bucket's shares by
// replica, and the tokens then left.
func sharesSetup(t *testing.T) (r []*redisstore.Store, c0 *redis.Client, locks func() map[string]float64, clock *storetest.Clock, tokens float64) {
	t.Helper()
	srv := redistest.Standalone(t)
	clock = storetest.NewClock()
	r, clients := degradedReplicasOn(t, srv.Addr, clock.Now, 2)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	if _, err := r[0].SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: 10, DepositRatio: 1e-12,
		MinPerSecond: 1e-12, RetryCost: 1, TimeoutCost: 1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the budget on replica 1", func() bool {
		st, err := r[1].Budget("acme")
		return err == nil && st.Budget.Capacity == 10
	})
	locks = func() map[string]float64 {
		l, err := redisstore.BucketLocks(context.Background(), c, "acme")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if sp, err := r[0].SpendRetry(policy.SpendRequest{Tenant: "acme"}); err != nil || !sp.Granted {
		t.Fatalf("replica 0's spend = %+v, %v; want granted", sp, err)
	}
	granted := 1
	for spend(t, r[1]) {
		granted++
	}
	st, _ := r[1].Budget("acme")
	if held := locks(); len(held) != 2 || st.Tokens < 1 || granted+int(st.Tokens) > 10 {
		t.Fatalf("replica 1 refused with %d granted, %.2f tokens left and shares locking %v; want it refused while replica 0's share is left", granted, st.Tokens, held)
	}
	return r, clients[0], locks, clock, st.Tokens
}

// spend is one SpendRetry of tenant acme through s: granted or not.
func spend(t *testing.T, s *redisstore.Store) bool {
	t.Helper()
	sp, err := s.SpendRetry(policy.SpendRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	return sp.Granted
}

// TestSharesOfAGoneReplicaForfeited: a replica's share stays set aside
// while it is in the heartbeat set (another replica is refused rather
// than spend it); once a replica that could not give it back (here its
// connection to Redis cut, as a kill would) has left the set and been
// silent for ten heartbeats, the next spend forfeits it: its share goes
// from the bucket and its lock from the tokens (it may have granted it
// alone).
func TestSharesOfAGoneReplicaForfeited(t *testing.T) {
	r, c0, locks, clock, tokens := sharesSetup(t)
	held := locks()
	_ = c0.Close()
	clock.Advance(time.Minute) // past three heartbeats (the set) and ten (the grace)
	eventually(t, "replica 0 gone from the heartbeat set", func() bool { return r[1].LiveReplicas() == 1 })
	spend(t, r[1])
	after, left := locks(), 0.0
	for f, l := range held {
		if _, ok := after[f]; !ok {
			left = tokens - l // replica 0's share, forfeited
		}
	}
	b, _ := r[1].Budget("acme")
	if len(after) != 1 || b.Tokens > left+1e-9 {
		t.Errorf("after replica 0 left: shares %v, %.2f tokens (from %.2f, shares %v); want replica 1's alone and replica 0's lock taken from the tokens (at most %.2f)",
			after, b.Tokens, tokens, held, left)
	}
}

// TestSharesGivenBackAtClose: a replica that stops (Close) with nothing
// left to charge gives its shares back: the tokens it held are the other
// replicas' to spend at once.
func TestSharesGivenBackAtClose(t *testing.T) {
	r, _, locks, _, tokens := sharesSetup(t)
	if err := r[0].Close(); err != nil {
		t.Fatal(err)
	}
	if held := locks(); len(held) != 1 {
		t.Errorf("after replica 0's Close: shares %v, want replica 1's alone", held)
	}
	granted := 0
	for spend(t, r[1]) {
		granted++
	}
	b, _ := r[1].Budget("acme")
	if granted < int(tokens)-1 || b.Tokens >= 1 {
		t.Errorf("replica 1 granted %d of the %.2f tokens replica 0 no longer holds, %.2f left; want them all but a fraction", granted, tokens, b.Tokens)
	}
}
