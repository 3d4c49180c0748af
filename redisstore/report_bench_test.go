package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
	"github.com/policyd/policyd/server"
)

// BenchmarkReportOutcomeOverRedis reports batches of 256 outcomes through
// the server's handler over one replica on a real server (outcomes held
// per flush, as policyd serve runs it), 8 callers per CPU, with
// policybench's report mix: one tenant a batch (of 8), 92% successes
// closing their calls, 5% dead letters after a 503, 3% failures on a
// failing target. It reports per outcome the replica's CPU (this
// process's, getrusage: the flusher's work included), Redis's (INFO cpu)
// and of it the library's functions' time (INFO commandstats), and the
// round trips (feeds, heartbeats and audit left out). One replica serves
// every round, warmed up first, as a long-running one is.
func BenchmarkReportOutcomeOverRedis(b *testing.B) {
	c, s, trips := benchReplica(b)
	const tenants, healthy, failing, batch = 8, 16, 2, 256
	p := policy.Default()
	p.Breaker.ConsecutiveFailures = 50
	for t := range tenants {
		tenant := "bench-t" + strconv.Itoa(t)
		for j := range healthy {
			if _, err := s.SetPolicy(tenant, fmt.Sprintf("api-%02d", j), p); err != nil {
				b.Fatal(err)
			}
		}
	}
	d := server.NewDecisions(s, server.Config{})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	var calls int
	reqs := make([]*pb.ReportOutcomeRequest, 64)
	for i := range reqs {
		tenant := "bench-t" + strconv.Itoa(rng.IntN(tenants))
		req := &pb.ReportOutcomeRequest{Outcomes: make([]*pb.Outcome, 0, batch)}
		for range batch {
			calls++
			target := fmt.Sprintf("api-%02d", rng.IntN(healthy))
			o := &pb.Outcome{Attempt: 1, Latency: durationpb.New(time.Duration(5+rng.IntN(50)) * time.Millisecond)}
			switch r := rng.Float64(); {
			case r < 0.92:
				o.Success, o.FinalDisposition = true, pb.Disposition_DISPOSITION_SUCCEEDED
			case r < 0.97:
				o.Attempt, o.Failure = 3, fail503
				o.FinalDisposition, o.FinalStopReason = pb.Disposition_DISPOSITION_DEAD_LETTER, pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED
			default:
				target, o.Failure = "down-"+strconv.Itoa(rng.IntN(failing)), fail503
			}
			o.Call = &pb.CallRef{Tenant: tenant, Target: target, CallId: "c" + strconv.Itoa(calls), Idempotent: true}
			req.Outcomes = append(req.Outcomes, o)
		}
		reqs[i] = req
	}
	var seq atomic.Int64
	report := func() error {
		_, err := d.ReportOutcome(ctx, reqs[seq.Add(1)%int64(len(reqs))])
		return err
	}
	// A long-running replica reuses what it grew for a flush's worth of
	// reports (its two audit buffers, up to MaxAuditBuffer records each):
	// the same replica serves every round, its audit buffers grown first
	// and then warmed up under the same load for a few flush intervals, so
	// no round measures the growth from empty.
	warmAudit(s, defaultMaxAuditBuffer)
	warmUp(b, 8*runtime.GOMAXPROCS(0), 4*defaultFlushInterval, report)
	b.Run("batch=256", func(b *testing.B) {
		s.FlushHeld()
		trips.take()
		cpu0, rcpu0, fn0 := benchSelfCPU(), benchRedisCPU(ctx, c), benchFCallUsec(ctx, c)
		b.SetParallelism(8)
		b.ResetTimer()
		b.RunParallel(func(loop *testing.PB) {
			for loop.Next() {
				if err := report(); err != nil {
					b.Error(err)
					return
				}
			}
		})
		s.FlushHeld()
		b.StopTimer()
		n, _ := trips.take()
		outcomes := float64(b.N) * batch
		b.ReportMetric(float64(n)/outcomes, "roundtrips/outcome")
		b.ReportMetric(float64((benchSelfCPU()-cpu0).Nanoseconds())/1e3/outcomes, "replica-cpu-µs/outcome")
		b.ReportMetric((benchRedisCPU(ctx, c)-rcpu0)*1e6/outcomes, "redis-cpu-µs/outcome")
		b.ReportMetric(float64(benchFCallUsec(ctx, c)-fn0)/outcomes, "redis-functions-µs/outcome")
	})
}

// The benchmark replica's redisstore.Options, their defaults.
const (
	defaultFlushInterval  = 100 * time.Millisecond
	defaultMaxAuditBuffer = 100_000
)

// warmAudit grows s's two audit buffers (the one being filled and the
// one its flush gives back for the next) to n records each, as a
// long-running replica's are after the first busy flush intervals.
func warmAudit(s *redisstore.Store, n int) {
	recs := make([]policy.AuditRecord, n)
	for i := range recs {
		recs[i] = policy.AuditRecord{Tenant: "bench-warm", CallID: "w" + strconv.Itoa(i)}
	}
	for range 2 {
		s.AppendAudit(recs...)
		s.FlushAudit()
	}
}

// warmUp runs op on callers goroutines for d (wall clock), failing b on
// its first error.
func warmUp(b *testing.B, callers int, d time.Duration, op func() error) {
	b.Helper()
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				if err := op(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}
