package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/redisstore"
	"github.com/policyd/policyd/internal/redistest"
)

// replicas opens n Stores over client c, closed when t ends.
func replicas(t *testing.T, n int, c func() redis.UniversalClient) Fleet {
	t.Helper()
	var f Fleet
	var first redis.UniversalClient
	for range n {
		cl := c()
		if first == nil {
			first = cl
		}
		t.Cleanup(func() { _ = cl.Close() })
		s, err := redisstore.Open(context.Background(), redisstore.Options{Client: cl, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() { _ = s.Close() })
		f.Replicas = append(f.Replicas, s)
	}
	f.WaitPast = func(tm time.Time) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			now, err := first.Time(context.Background()).Result()
			if err != nil {
				t.Fatalf("TIME: %v", err)
			}
			if now.After(tm) {
				return
			}
		}
		t.Fatalf("the server's clock did not pass %v", tm)
	}
	return f
}

func TestBehavioursStandalone(t *testing.T) {
	runBehaviours(t, func(t *testing.T, n int) Fleet {
		srv := redistest.Standalone(t)
		return replicas(t, n, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) })
	})
}

func TestBehavioursCluster(t *testing.T) {
	// One cluster for every case (three servers take a while to join):
	// no two cases share a key.
	addrs := redistest.Cluster(t)
	runBehaviours(t, func(t *testing.T, k int) Fleet {
		return replicas(t, k, func() redis.UniversalClient { return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}) })
	})
}
