package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
)

// BenchmarkOutcomesCall is one policyd_outcomes call of a flush's held
// batch, one tenant's 18 breakers with 32 tallies and a deposit, in two
// shapes: runs=1300 as BenchmarkReportOutcomeOverRedis makes them (each
// breaker 36 successes in runs of 10 between single failures: about
// 1,300 runs, 8,000 results), runs=108 as the replicas-sweep's report
// phase does (each breaker 13 successes then a failure, three times: 108
// runs, 756 results; its flushes, read with MONITOR, held 18 breakers,
// 96 runs and 770 successes on average). It reports the
// server's CPU per call (INFO cpu): the library's work, the call's
// parsing and its AOF write.
func BenchmarkOutcomesCall(b *testing.B) {
	for _, shape := range []struct {
		name        string
		runs, width int // of each breaker: runs times width successes then a failure
	}{{"runs=1300", 36, 10}, {"runs=108", 3, 13}} {
		b.Run(shape.name, func(b *testing.B) {
			srv := redistest.Standalone(b)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr})
			b.Cleanup(func() { _ = c.Close() })
			ctx := context.Background()
			if err := loadLibrary(ctx, c); err != nil {
				b.Fatal(err)
			}
			cfg := fleet.NormConfig(policy.BreakerConfig{ConsecutiveFailures: 50})
			batch := &outcomeBatch{tenant: "bench", deposit: 7000, hour: 1}
			for g := range 18 {
				grp := &outcomeGroup{key: policy.BreakerKey{Tenant: "bench", Target: fmt.Sprintf("api-%02d", g)}, cfg: cfg}
				for range shape.runs {
					for range shape.width {
						grp.add(result{Result: policy.ResultSuccess}, -1)
					}
					grp.add(result{Result: policy.ResultTransientFailure}, -1)
				}
				batch.groups = append(batch.groups, grp)
			}
			for i := range 32 {
				batch.tallies = append(batch.tallies, pendingTally{key: tallyKey{target: fmt.Sprintf("api-%02d", i%18), slot: i / 18, success: true}, n: 100})
			}
			bg := DefaultTenantBudget()
			keys, args := batch.call(&bg, 1000)
			l := lib{c: c}
			cpu0 := serverCPU(ctx, c)
			for b.Loop() {
				if _, err := l.fcall(ctx, "policyd_outcomes", keys, args...); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((serverCPU(ctx, c)-cpu0)*1e6/float64(b.N), "redis-cpu-µs/op")
		})
	}
}

// serverCPU is the server's CPU seconds so far (INFO cpu), for the
// benchmarks here and the external ones (ServerCPU).
func serverCPU(ctx context.Context, c *redis.Client) float64 {
	var sum float64
	for _, l := range strings.Split(c.Info(ctx, "cpu").Val(), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			sum += f
		}
	}
	return sum
}
