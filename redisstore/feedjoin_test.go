package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
)

// TestTenantJoinsABlockedFeedAtOnce: a replica whose feed is blocked in
// its read of one tenant's stream starts following a second tenant; a
// transition of the second tenant made on another replica reaches the
// first replica's subscriber without waiting for the blocked read to end.
// The read blocks for 30 s here: before the wake-up, the second
// tenant joined only the next read, and its subscriber saw nothing
// (session 24's sweeps: the first transition after a subscription on a
// quiet replica arrived 55-160 ms late, FeedBlock being 100 ms). Close
// then returns without waiting for the reads either.
func TestTenantJoinsABlockedFeedAtOnce(t *testing.T) {
	srv := redistest.Standalone(t)
	open := func(block time.Duration) *redisstore.Store {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Timeout: 2 * time.Second, FeedBlock: block})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	quiet, other := open(30*time.Second), open(0)
	first := policy.BreakerKey{Tenant: "first", Target: "x"}
	second := policy.BreakerKey{Tenant: "second", Target: "y"}
	for _, k := range []policy.BreakerKey{first, second} {
		if _, err := other.ForceBreaker(k, policy.BreakerClosed); err != nil {
			t.Fatal(err)
		}
	}
	watch := func(tenant string) <-chan policy.BreakerEvent {
		events, cancel := quiet.Subscribe(tenant, 64)
		t.Cleanup(cancel)
		for ev := range events {
			if ev.SnapshotDone {
				return events
			}
		}
		t.Fatalf("%s: subscription closed before its snapshot", tenant)
		return nil
	}
	watch(first.Tenant)
	// The feed's read of the first tenant's stream is in flight before
	// the second tenant joins.
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = admin.Close() })
	eventually(t, "the feed's read blocks", func() bool {
		info, err := admin.Info(context.Background(), "clients").Result()
		return err == nil && !strings.Contains(info, "blocked_clients:0\r\n")
	})
	events := watch(second.Tenant)
	if _, err := other.ForceBreaker(second, policy.BreakerOpen); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-events:
		if ev.Snapshot.Key != second || ev.Snapshot.State != policy.BreakerOpen {
			t.Fatalf("got %+v, want %v OPEN", ev.Snapshot, second)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second tenant's transition did not arrive within 10s: it waits for the blocked read of the first tenant's stream to end")
	}
	// Close ends the blocked reads too, rather than waiting for them.
	closed := make(chan struct{})
	go func() { _ = quiet.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10s: it waits for the feeds' blocked reads to end")
	}
}
