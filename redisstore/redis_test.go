package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
)

// replicas opens n Stores over clients c makes, closed when t ends.
func replicas(t *testing.T, n int, c func() redis.UniversalClient) []*redisstore.Store {
	t.Helper()
	var out []*redisstore.Store
	for range n {
		cl := c()
		t.Cleanup(func() { _ = cl.Close() })
		s, err := redisstore.Open(context.Background(), redisstore.Options{Client: cl, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		out = append(out, s)
	}
	return out
}

// eventually polls cond until it holds, failing t after 5 s; what a
// replica learns from another arrives through the engine's feed.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		<-tick.C
	}
}

// TestFeedResumesAfterReconnect: while one replica makes transitions,
// every client connection to Redis is killed again and again (CLIENT
// KILL); a subscriber on another replica still sees every transition,
// in order, none twice: its feed reads on from the last entry id it saw.
func TestFeedResumesAfterReconnect(t *testing.T) {
	srv := redistest.Standalone(t)
	f := replicas(t, 2, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) })
	killer := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = killer.Close() })
	key := policy.BreakerKey{Tenant: "flaky", Target: "x"}
	if _, err := f[0].ForceBreaker(key, policy.BreakerClosed); err != nil {
		t.Fatal(err)
	}
	events, cancel := f[1].Subscribe("flaky", 1024)
	defer cancel()
	for ev := range events {
		if ev.SnapshotDone {
			break
		}
	}
	const transitions = 20
	var killed int64
	for i := range transitions {
		n, err := killer.ClientKillByFilter(context.Background(), "TYPE", "normal", "SKIPME", "yes").Result()
		if err != nil {
			t.Fatalf("CLIENT KILL: %v", err)
		}
		killed += n
		for range 10 { // the killed connections fail once each; the next try reconnects
			if i%2 == 0 {
				_, err = f[0].ForceBreaker(key, policy.BreakerOpen)
			} else {
				_, err = f[0].ForceBreaker(key, policy.BreakerClosed)
			}
			if err == nil {
				break
			}
		}
		if err != nil {
			t.Fatalf("ForceBreaker after the kill: %v", err)
		}
	}
	if killed < transitions {
		t.Fatalf("killed %d connections over %d rounds; the test needs the feed's among them", killed, transitions)
	}
	for want := uint64(2); want < 2+transitions; want++ {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatalf("subscription closed before generation %d", want)
			}
			if ev.Snapshot.Generation != want {
				t.Fatalf("event of generation %d, want %d (in order, none lost, none twice)", ev.Snapshot.Generation, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no event of generation %d within 10s", want)
		}
	}
}

// TestManyTenantsFewConnections: a replica following the event streams of
// 40 tenants over a client of 4 pooled connections still answers, and
// still sees every tenant's transitions: the feeds do not hold a
// connection per tenant.
func TestManyTenantsFewConnections(t *testing.T) {
	srv := redistest.Standalone(t)
	f := replicas(t, 2, func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 4, PoolTimeout: 2 * time.Second})
	})
	const tenants = 40
	keys := make([]policy.BreakerKey, tenants)
	for i := range keys {
		keys[i] = policy.BreakerKey{Tenant: "t" + strconv.Itoa(i), Target: "x"}
		if a, err := f[1].Admit(keys[i], policy.BreakerConfig{}); err != nil || !a.Admitted {
			t.Fatalf("Admit for tenant %d = %+v, %v", i, a, err)
		}
	}
	for _, k := range keys {
		if _, err := f[0].ForceBreaker(k, policy.BreakerOpen); err != nil {
			t.Fatalf("ForceBreaker(%v): %v", k, err)
		}
	}
	for _, k := range keys {
		eventually(t, "replica 1 refusing "+k.Tenant, func() bool {
			a, err := f[1].Admit(k, policy.BreakerConfig{})
			return err == nil && !a.Admitted
		})
	}
}

// TestWaitReplicas: with WaitReplicas 1 an admin write returns once a
// replica has it; with the replica gone it fails with ErrNotReplicated
// after WaitTimeout, the write kept on the primary (and so seen by every
// policyd replica, as the error says).
func TestWaitReplicas(t *testing.T) {
	primary := redistest.Standalone(t)
	replica := redistest.Replica(t, primary)
	open := func(wait time.Duration) *redisstore.Store {
		c := redis.NewClient(&redis.Options{Addr: primary.Addr})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Timeout: time.Second,
			WaitReplicas: 1, WaitTimeout: wait})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	// A generous wait while the replica is up (the machine may be busy),
	// a short one once it is gone.
	patient, hasty := open(10*time.Second), open(100*time.Millisecond)
	key := policy.BreakerKey{Tenant: "acme", Target: "pay"}
	if _, err := patient.ForceBreaker(key, policy.BreakerOpen); err != nil {
		t.Fatalf("ForceBreaker with a replica up = %v, want nil", err)
	}
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
	t.Cleanup(func() { _ = rc.Close() })
	rec, err := rc.Get(context.Background(), "{=acme}:breaker:pay").Bytes()
	if forced, ferr := redisstore.BreakerField(rec, "forced"); err != nil || ferr != nil || forced != 1 {
		t.Errorf("the replica has forced = %d (%v, %v) once ForceBreaker returned, want 1", forced, err, ferr)
	}
	if _, err := patient.SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: 10}); err != nil {
		t.Errorf("SetBudget with a replica up = %v, want nil", err)
	}
	ref := policy.KeyRef{Tenant: "acme", Key: "doc-1"}
	claim := policy.KeyClaim{LeaseUntil: time.Now().Add(time.Minute), Expires: time.Now().Add(time.Hour)}
	a, err := patient.ClaimKey(ref, claim)
	if err != nil {
		t.Fatalf("ClaimKey with a replica up = %v, want nil", err)
	}
	if l, err := rc.HGet(context.Background(), "{=acme}:idem:doc-1", "lease").Result(); err != nil || l != a.LeaseID {
		t.Errorf("the replica has lease %q (%v) once ClaimKey returned, want %q", l, err, a.LeaseID)
	}
	replica.Kill()
	if _, err := hasty.CompleteKey(ref, a.LeaseID, policy.KeyOutcomeSucceeded, "r", time.Time{}); !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Errorf("CompleteKey with the replica gone = %v, want ErrNotReplicated", err)
	}
	_, err = hasty.SetPolicy("acme", "pay", policy.Default())
	if !errors.Is(err, redisstore.ErrNotReplicated) || !strings.Contains(err.Error(), "acknowledged by 0 of 1 replicas") {
		t.Errorf("SetPolicy with the replica gone = %v, want ErrNotReplicated, 0 of 1", err)
	}
	eventually(t, "the unreplicated policy, on the primary", func() bool {
		_, err := patient.Policy("acme", "pay")
		return err == nil
	})
	if _, err := hasty.ForceBreaker(key, policy.BreakerClosed); !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Errorf("ForceBreaker with the replica gone = %v, want ErrNotReplicated", err)
	}
}

// TestBreakersPerTenantCap: a tenant's breaker past
// MaxBreakersPerTenant is refused with ErrTooManyBreakers (an
// OverCapacity error), whichever call would create it and whichever
// replica makes it; existing breakers and other tenants go on.
func TestBreakersPerTenantCap(t *testing.T) {
	srv := redistest.Standalone(t)
	var r []*redisstore.Store
	for range 2 {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Timeout: time.Second, MaxBreakersPerTenant: 3})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		r = append(r, s)
	}
	key := func(tenant string, i int) policy.BreakerKey {
		return policy.BreakerKey{Tenant: tenant, Target: "t" + strconv.Itoa(i)}
	}
	for i := range 3 {
		if _, err := r[i%2].Record(key("acme", i), policy.BreakerConfig{}, policy.ResultSuccess, ""); err != nil {
			t.Fatalf("breaker %d of 3: %v", i, err)
		}
	}
	cfg := policy.BreakerConfig{}
	for name, create := range map[string]func() error{
		"Admit":  func() error { _, err := r[0].Admit(key("acme", 3), cfg); return err },
		"Record": func() error { _, err := r[1].Record(key("acme", 3), cfg, policy.ResultSuccess, ""); return err },
		"ExtendCooldown": func() error {
			_, err := r[0].ExtendCooldown(key("acme", 3), cfg, time.Now().Add(time.Minute))
			return err
		},
		"ForceBreaker": func() error { _, err := r[1].ForceBreaker(key("acme", 3), policy.BreakerOpen); return err },
		"ApplyOutcomes": func() error {
			_, err := r[0].ApplyOutcomes([]policy.OutcomeUpdate{{Key: key("acme", 3), Result: policy.ResultSuccess}}, nil)
			return err
		},
	} {
		err := create()
		var oc interface{ OverCapacity() bool }
		if !errors.Is(err, redisstore.ErrTooManyBreakers) || !errors.As(err, &oc) || !strings.Contains(err.Error(), "cap 3") {
			t.Errorf("%s of a 4th breaker = %v, want ErrTooManyBreakers naming the cap", name, err)
		}
	}
	if _, err := r[0].Record(key("acme", 0), cfg, policy.ResultTransientFailure, ""); err != nil {
		t.Errorf("an existing breaker at the cap: %v", err)
	}
	if _, err := r[0].Admit(key("beta", 0), cfg); err != nil {
		t.Errorf("another tenant's first breaker: %v", err)
	}
}

// TestSubscribeAllSeesNewTenants: a subscription to every tenant on one
// replica sees the transitions of a tenant that another replica uses for
// the first time after it subscribed.
func TestSubscribeAllSeesNewTenants(t *testing.T) {
	srv := redistest.Standalone(t)
	f := replicas(t, 2, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) })
	events, cancel := f[1].Subscribe("", 64)
	defer cancel()
	for ev := range events {
		if ev.SnapshotDone {
			break
		}
	}
	key := policy.BreakerKey{Tenant: "newbie", Target: "x"}
	cfg := policy.BreakerConfig{ConsecutiveFailures: 1, Cooldown: time.Hour}
	if _, err := f[0].Record(key, cfg, policy.ResultTransientFailure, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case ev, ok := <-events:
		if !ok || ev.Snapshot.Key != key || ev.Snapshot.State != policy.BreakerOpen {
			t.Errorf("first event %+v (open %v), want newbie/x OPEN", ev, ok)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event of the new tenant within 5s")
	}
}

// TestCloseEndsSubscriptions: Close closes every subscription's channel,
// one to every tenant of a Redis with no tenant yet (it follows no
// stream) included.
func TestCloseEndsSubscriptions(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := s.Subscribe("", 8)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]<-chan policy.BreakerEvent{"every tenant": all} {
		deadline := time.After(5 * time.Second)
	drain:
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					break drain
				}
			case <-deadline:
				t.Fatalf("the subscription to %s is still open 5s after Close", name)
			}
		}
	}
}

// TestCallsAreBounded: with the server stopped (SIGSTOP), every call
// returns once Timeout is over instead of waiting for Redis (a read with
// ErrUnavailable; a decision would answer degraded); the same store works
// again once the server continues.
func TestCallsAreBounded(t *testing.T) {
	srv := redistest.Standalone(t)
	// The socket's own timeouts are far longer than the test waits: only
	// the store's Timeout can end the call in time.
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true,
		ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	key := policy.BreakerKey{Tenant: "acme", Target: "pay"}
	if _, err := s.Record(key, policy.BreakerConfig{}, policy.ResultSuccess, ""); err != nil {
		t.Fatal(err)
	}
	srv.Pause(t)
	done := make(chan error, 1)
	go func() {
		// A breaker the replica does not know: a known one is answered
		// from the cache while Redis does not answer.
		_, err := s.Breaker(policy.BreakerKey{Tenant: "acme", Target: "unknown"})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, redisstore.ErrUnavailable) {
			t.Errorf("Breaker with Redis stopped = %v, want ErrUnavailable of a deadline", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Breaker with Redis stopped still waits after 10s")
	}
	srv.Resume(t)
	eventually(t, "a read once Redis continues", func() bool {
		_, err := s.Breaker(key)
		return err == nil
	})
}
