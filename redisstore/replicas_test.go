package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/redisstore"
)

// TestReplicasListsTheLiveReplicaSet opens two replicas on one Redis and
// reads the replica set through one of them: both, by their ids, seen at
// their heartbeat; once three heartbeat intervals pass without one,
// neither is live.
func TestReplicasListsTheLiveReplicaSet(t *testing.T) {
	srv := redistest.Standalone(t)
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	open := func() *redisstore.Store {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		// One heartbeat, at Open: the next is an hour of wall time away.
		s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Timeout: 2 * time.Second, Clock: clock, Heartbeat: time.Hour})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	a, b := open(), open()
	if a.ReplicaID() == "" || a.ReplicaID() == b.ReplicaID() {
		t.Fatalf("replica ids %q and %q: want two distinct ids", a.ReplicaID(), b.ReplicaID())
	}

	// The first heartbeat runs as Open returns; wait for both to land.
	var got []redisstore.Replica
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		var err error
		if got, err = a.Replicas(); err != nil {
			t.Fatalf("Replicas: %v", err)
		}
		if len(got) == 2 {
			break
		}
	}
	var ids []string
	for _, r := range got {
		ids = append(ids, r.ID)
		if !r.LastSeen.Equal(now) {
			t.Errorf("replica %s last seen %s, want its heartbeat at %s", r.ID, r.LastSeen, now)
		}
	}
	slices.Sort(ids)
	want := []string{a.ReplicaID(), b.ReplicaID()}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("replicas: got %v, want %v", ids, want)
	}

	mu.Lock()
	now = now.Add(3*time.Hour + time.Millisecond)
	mu.Unlock()
	if got, err := a.Replicas(); err != nil || len(got) != 0 {
		t.Errorf("three heartbeat intervals later: got %+v, %v; want no live replica", got, err)
	}
}
