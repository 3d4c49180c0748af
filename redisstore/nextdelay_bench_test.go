package redisstore_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// BenchmarkNextDelayOverRedis decides NextDelays through the server's
// handler over one replica on a real server, 8 callers per CPU: fresh (a
// new call every time: the breaker records, the budget spends, the attempt
// record is written), replay (an attempt decided before, asked again:
// the answer remembered, as policybench's prebuilt requests ask) and
// fresh-run (fresh, of calls of a run: its pool spends too). It
// reports the round trips per NextDelay (the replica's commands and
// pipelines, feeds and heartbeats left out), the replica's CPU per
// NextDelay (this process's, getrusage) and Redis's (INFO cpu), and of
// Redis's the time in the library's functions (INFO commandstats).
func BenchmarkNextDelayOverRedis(b *testing.B) {
	c, s, trips := benchReplica(b)
	p := policy.Default()
	p.Breaker.ConsecutiveFailures = 10000 // 1000 targets: no breaker trips
	if _, err := s.SetPolicy("acme", "", p); err != nil {
		b.Fatal(err)
	}
	if _, err := s.SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: 1e12, DepositRatio: 0.1, MinPerSecond: 1,
		RetryCost: 1, TimeoutCost: 2}); err != nil {
		b.Fatal(err)
	}
	if _, err := s.OpenRun(policy.Run{ID: "batch", Tenant: "acme", Pool: 1 << 40, Cutoff: time.Now().Add(time.Hour)}); err != nil {
		b.Fatal(err)
	}
	d := server.NewDecisions(s, server.Config{})
	ctx := context.Background()
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	run := ""
	req := func(id int64) *pb.NextDelayRequest {
		return &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "t" + strconv.FormatInt(id%1000, 10),
			CallId: "c" + strconv.FormatInt(id, 10), Idempotent: true, RunId: run}, Attempt: 1, Failure: fail503}
	}
	const replays = 64
	for i := range int64(replays) {
		if _, err := d.NextDelay(ctx, req(-1-i)); err != nil {
			b.Fatal(err)
		}
	}
	var seq atomic.Int64
	for _, mode := range []string{"fresh", "replay", "fresh-run"} {
		b.Run(mode, func(b *testing.B) {
			if mode == "fresh-run" {
				run = "batch"
			}
			s.FlushHeld()
			trips.take()
			cpu0, rcpu0, fcall0 := benchSelfCPU(), benchRedisCPU(ctx, c), benchFCallUsec(ctx, c)
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(loop *testing.PB) {
				for loop.Next() {
					i := seq.Add(1)
					if mode == "replay" {
						i = -1 - i%replays
					}
					if _, err := d.NextDelay(ctx, req(i)); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			n, _ := trips.take()
			ops := float64(b.N)
			b.ReportMetric(float64(n)/ops, "roundtrips/op")
			b.ReportMetric(float64((benchSelfCPU()-cpu0).Microseconds())/ops, "replica-cpu-µs/op")
			b.ReportMetric((benchRedisCPU(ctx, c)-rcpu0)*1e6/ops, "redis-cpu-µs/op")
			b.ReportMetric(float64(benchFCallUsec(ctx, c)-fcall0)/ops, "fcall-µs/op")
		})
	}
}
