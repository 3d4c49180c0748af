package redisstore_test

import (
	"context"
	"io"
	"log/slog"
	"path"
	"slices"
	"sync"
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
// append-only file, and a new replica connects. Under "held" the whole
// suite runs with outcomes held per flush (Options.BatchOutcomes), as
// policyd serve opens its Redis store by default; under "sent" the
// behaviours that report outcomes (outcomeCases) run again with every
// outcome sent before ApplyOutcomes returns, as --sync=always opens it.
// The other behaviours would repeat "held" there: BatchOutcomes changes
// only what a replica does with outcomes it holds, and they report none.
func TestContractStandalone(t *testing.T) {
	srv := redistest.Standalone(t)
	client := func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) }
	crash := func(t *testing.T) { srv.Restart(t) }
	t.Run("held", func(t *testing.T) { runContract(t, client, crash, true) })
	t.Run("sent", func(t *testing.T) { runContract(t, client, crash, false, outcomeCases...) })
}

// TestContractCluster runs the suite on a Redis Cluster of three masters,
// shared by the subtests as on a standalone server, both ways as there;
// a crash restarts every node on its append-only file.
func TestContractCluster(t *testing.T) {
	nodes := redistest.ClusterNodes(t)
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.Addr)
	}
	redisstore.CheckSlots(t, addrs[0])
	client := func() redis.UniversalClient { return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}) }
	crash := func(t *testing.T) { redistest.RestartCluster(t, nodes) }
	t.Run("held", func(t *testing.T) { runContract(t, client, crash, true) })
	t.Run("sent", func(t *testing.T) { runContract(t, client, crash, false, outcomeCases...) })
}

// outcomeCases are the behaviours of the suite that call ApplyOutcomes,
// the one method whose updates a replica may hold (Options.BatchOutcomes);
// a behaviour that calls it belongs here.
var outcomeCases = []string{"order", "final", "permits", "attempt_stats"}

// runContract runs storetest over the Redis that client connects to;
// crash kills it and starts it again on its append-only file. With held,
// every replica holds its outcomes for the flush (Options.BatchOutcomes)
// and flushes them only when the suite settles (Engine.Settle: FlushHeld
// on every replica the test opened), at Close, or when a tenant's batch
// passes its bound: its FlushInterval is an hour, so a read the suite
// does not settle first sees what it would see had the flush not come
// yet. Given only, it runs those behaviours (by subtest name) and skips
// the others.
func runContract(t *testing.T, client func() redis.UniversalClient, crash func(t *testing.T), held bool, only ...string) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil)) // a crashed replica's feed complains
	storetest.Run(t, func(t *testing.T, clock *storetest.Clock) storetest.Engine {
		if name := path.Base(t.Name()); len(only) > 0 && !slices.Contains(only, name) {
			t.Skipf("%s reports no outcomes: run under held only, where nothing is held for it either", name)
		}
		flushAll(t, client)
		var (
			mu     sync.Mutex
			opened []*redisstore.Store
		)
		open := func() *redisstore.Store {
			c := client()
			t.Cleanup(func() { _ = c.Close() })
			opts := redisstore.Options{Client: c, Clock: clock.Now, Timeout: 2 * time.Second, Log: quiet}
			if held {
				opts.BatchOutcomes, opts.FlushInterval = true, time.Hour
			}
			s, err := redisstore.Open(context.Background(), opts)
			if err != nil {
				t.Fatalf("Open = %v, want nil", err)
			}
			t.Cleanup(func() { _ = s.Close() })
			mu.Lock()
			opened = append(opened, s)
			mu.Unlock()
			return s
		}
		var settle func()
		if held {
			settle = func() {
				mu.Lock()
				defer mu.Unlock()
				for _, s := range opened {
					s.FlushHeld()
				}
			}
		}
		return storetest.Engine{
			Store: open(),
			Restart: func() server.Store {
				crash(t)
				return open()
			},
			Replica:  func() server.Store { return open() },
			Adaptive: true,
			Settle:   settle,
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
