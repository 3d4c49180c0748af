package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
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

// TestAdminWriteReachesEveryReplicaAfterRedisRestart: two replicas whose
// engine breaker would wait an hour between probes, on a clock that does
// not move, so no probe ever goes out: when Redis is killed and started
// again on its AOF, their feeds find it answering again and bring the
// engine up, and a policy written through one replica reaches the other
// through the changes stream, without the hour or any clock passing.
func TestAdminWriteReachesEveryReplicaAfterRedisRestart(t *testing.T) {
	srv := redistest.Standalone(t)
	now := time.Now()
	open := func() *redisstore.Store {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Timeout: 50 * time.Millisecond,
			Clock: func() time.Time { return now }, DownAfter: 1, DownFor: time.Hour, FeedBlock: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	s := []*redisstore.Store{open(), open()}
	srv.Kill()
	for i := range s {
		eventually(t, "the engine down", func() bool { return !s[i].Up() })
	}
	srv.Restart(t)
	for i := range s {
		eventually(t, "the engine up again, with no probe", s[i].Up)
	}
	p := policy.Default()
	p.MaxAttempts = 7
	// Written until acknowledged: on a busy machine the first writes to
	// the server just started on its AOF may outlast the 50ms timeout
	// (UNAVAILABLE, and the engine down until a feed finds it again); the
	// same policy written again is the same write.
	eventually(t, "SetPolicy acknowledged after the restart", func() bool {
		_, err := s[0].SetPolicy("acme", "pay", p)
		return err == nil
	})
	eventually(t, "the policy on the other replica", func() bool {
		got, _ := s[1].Resolve("acme", "pay")
		return got.MaxAttempts == 7
	})
}

// TestPushbackRecordedAsFleetDoes: a 429 with Retry-After through a
// replica on Redis is answered (it was INVALID_ARGUMENT: the engine took
// only success, transient failure and terminal), and the breaker records
// it as fleet.Breaker does: pushback counts nothing; the cool-down holds
// the fleet back.
func TestPushbackRecordedAsFleetDoes(t *testing.T) {
	srv := redistest.Standalone(t)
	// Store calls bounded by 2s: an answer of this test must not be a
	// degraded one because a loaded machine made a call take 50ms.
	r := newReplica(t, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) })
	ctx := context.Background()
	resp, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{
		Call:    &pb.CallRef{Tenant: "acme", Target: "pay", CallId: "c1", Idempotent: true},
		Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 429}}, Pushback: &pb.Pushback{RetryAfter: "2"}})
	if err != nil {
		t.Fatalf("NextDelay of a 429 with Retry-After: %v", err)
	}
	if resp.GetDegraded() {
		t.Fatalf("NextDelay = %v: degraded with Redis up", resp)
	}
	b, err := r.store.Breaker(policy.BreakerKey{Tenant: "acme", Target: "pay"})
	if err != nil {
		t.Fatal(err)
	}
	if b.WindowCalls != 0 || b.ConsecutiveFailures != 0 || b.State != policy.BreakerClosed {
		t.Errorf("breaker after a pushback: %d calls, %d failures in a row, %v; want nothing counted, CLOSED", b.WindowCalls, b.ConsecutiveFailures, b.State)
	}
}

// TestDialerReconnectsAtOnceAfterRestart: a client whose pool saw its
// dials fail while Redis was down (PoolSize of them: go-redis's pool then
// stops dialing until a background dial, once a second, succeeds) makes
// its first call after Redis is back on a new connection, with
// redisstore.Dialer.
func TestDialerReconnectsAtOnceAfterRestart(t *testing.T) {
	srv := redistest.Standalone(t)
	opts := &redis.Options{Addr: srv.Addr, PoolSize: 1, MaxRetries: -1}
	opts.Dialer = redisstore.Dialer(redis.NewDialer(opts))
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	for range 3 {
		if err := c.Ping(ctx).Err(); err == nil {
			t.Fatal("PING answered with Redis killed")
		}
	}
	srv.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("the first PING after Redis is back: %v", err)
	}
}
