package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/redisstore"
)

// The benchmarks over a real Redis report the CPU of both sides per
// operation: this process's (the replica's) and the server's, and of the
// server's the time in the library's functions.

// benchReplica opens one replica over its own real server, its outcomes
// held per flush as policyd serve holds them, its calls bounded by a
// second, and counts the round trips it makes.
func benchReplica(b *testing.B) (*redis.Client, *redisstore.Store, *tripCounter) {
	srv := redistest.Standalone(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	trips := &tripCounter{cmds: map[string]int{}}
	c.AddHook(trips)
	b.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Timeout: time.Second, BatchOutcomes: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return c, s, trips
}

// benchSelfCPU is this process's CPU time so far (getrusage).
func benchSelfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchRedisCPU is the server's CPU seconds so far (INFO cpu).
func benchRedisCPU(ctx context.Context, c *redis.Client) float64 { return redisstore.ServerCPU(ctx, c) }

// benchFCallUsec is the server's time in FCALL and FCALL_RO so far, µs
// (INFO commandstats): the functions' run, without the AOF's write and
// fsync.
func benchFCallUsec(ctx context.Context, c *redis.Client) int64 {
	var sum int64
	for _, l := range strings.Split(c.Info(ctx, "commandstats").Val(), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || k != "cmdstat_fcall" && k != "cmdstat_fcall_ro" {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			if n, ok := strings.CutPrefix(f, "usec="); ok {
				u, _ := strconv.ParseInt(n, 10, 64)
				sum += u
			}
		}
	}
	return sum
}
