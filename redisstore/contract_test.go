package redisstore_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/redisstore"
	"github.com/policyd/policyd/server"
	"github.com/policyd/policyd/server/storetest"
)

// TestContractStandalone runs the engine contract suite on one Redis
// server (AOF, appendfsync always), shared by the subtests: each starts
// from FLUSHALL. Every replica tells time by the suite's clock
// (Options.Clock); a crash kills redis-server and restarts it on its
// append-only file, and a new replica connects.
func TestContractStandalone(t *testing.T) {
	srv := redistest.Standalone(t)
	runContract(t, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) },
		func(t *testing.T) { srv.Restart(t) })
}

// TestContractCluster runs the suite on a Redis Cluster of three masters,
// shared by the subtests as on a standalone server; a crash restarts every
// node on its append-only file.
func TestContractCluster(t *testing.T) {
	nodes := redistest.ClusterNodes(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr)
	}
	redisstore.CheckSlots(t, addrs[0])
	runContract(t, func() redis.UniversalClient { return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}) },
		func(t *testing.T) { redistest.RestartCluster(t, nodes) })
}

// runContract runs storetest over the Redis that client connects to;
// crash kills it and starts it again on its append-only file.
func runContract(t *testing.T, client func() redis.UniversalClient, crash func(t *testing.T)) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil)) // a crashed replica's feed complains
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) storetest.Engine {
		flushAll(t, client)
		open := func() *redisstore.Store {
			c := client()
			t.Cleanup(func() { _ = c.Close() })
			s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Clock: clock.Now,
				Timeout: 2 * time.Second, Log: quiet})
			if err != nil {
				t.Fatalf("Open = %v, want nil", err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}
		return storetest.Engine{
			Store: open(),
			Restart: func() server.Store {
				crash(t)
				return open()
			},
			Replica:  func() server.Store { return open() },
			Adaptive: true,
		}
	})
}

// flushAll empties the Redis client connects to (every master of a
// Cluster); the library stays loaded.
func flushAll(t *testing.T, client func() redis.UniversalClient) {
	t.Helper()
	c := client()
	defer c.Close()
	ctx := context.Background()
	var err error
	if cc, ok := c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.FlushAll(ctx).Err() })
	} else {
		err = c.FlushAll(ctx).Err()
	}
	if err != nil {
		t.Fatalf("FLUSHALL = %v, want nil", err)
	}
}
