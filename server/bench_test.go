package server_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// The benchmarks drive the real server and a real bbolt store over bufconn
// with 64 concurrent callers, in both durability modes:
//
//	go test -run '^$' -bench . -benchmem ./server/

var syncModes = []struct {
	name string
	mode breakerstore.SyncMode
}{{"sync=group", breakerstore.SyncGroup}, {"sync=always", breakerstore.SyncAlways}}

func benchHarness(b *testing.B, mode breakerstore.SyncMode) *harness {
	h := newHarness(b, func(_ *server.Config, o *breakerstore.Options) {
		o.Sync = mode
		o.FlushInterval = 100 * time.Millisecond
	})
	// Budgets and breakers that never refuse, so every call takes the
	// whole decision path.
	never := uint32(10000)
	ctx := context.Background()
	for i := range 8 {
		tenant := fmt.Sprintf("tenant-%d", i)
		if _, err := h.admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{
			Tenant: tenant, Capacity: 1e12, MinRetriesPerSecond: 1e9}}); err != nil {
			b.Fatal(err)
		}
		if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: tenant, Policy: &pb.Policy{
			Breaker: &pb.BreakerSettings{ConsecutiveFailures: &never}}}); err != nil {
			b.Fatal(err)
		}
	}
	return h
}

// BenchmarkNextDelay64 measures NextDelay decisions at 64 concurrent callers
// over 8 tenants and 64 targets.
func BenchmarkNextDelay64(b *testing.B) {
	for _, m := range syncModes {
		b.Run(m.name, func(b *testing.B) {
			h := benchHarness(b, m.mode)
			var seq atomic.Int64
			b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			b.RunParallel(func(pbb *testing.PB) {
				n := seq.Add(1)
				req := &pb.NextDelayRequest{
					Call:    &pb.CallRef{Tenant: fmt.Sprintf("tenant-%d", n%8), Target: fmt.Sprintf("target-%d", n%64), CallId: "c", Idempotent: true},
					Attempt: 1, Failure: http(503),
				}
				// Each decision is of a call of its own: the same call id and
				// attempt again would only replay the first answer.
				ids := make([]string, 4096)
				for i := range ids {
					ids[i] = fmt.Sprintf("c%d-%d", n, i)
				}
				i := 0
				for pbb.Next() {
					req.Call.CallId = ids[i%len(ids)]
					if i >= len(ids) {
						req.Call.CallId = fmt.Sprintf("c%d-%d", n, i)
					}
					i++
					if _, err := h.workers.NextDelay(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

// BenchmarkReportOutcome64 measures batched outcomes (100 per request) at 64
// concurrent callers.
func BenchmarkReportOutcome64(b *testing.B) {
	const batch = 100
	for _, m := range syncModes {
		b.Run(m.name, func(b *testing.B) {
			h := benchHarness(b, m.mode)
			var seq atomic.Int64
			b.SetParallelism(64 / max(1, runtime.GOMAXPROCS(0)))
			b.ResetTimer()
			b.RunParallel(func(pbb *testing.PB) {
				n := seq.Add(1)
				req := &pb.ReportOutcomeRequest{}
				for i := range batch {
					req.Outcomes = append(req.Outcomes, &pb.Outcome{
						Call:    &pb.CallRef{Tenant: fmt.Sprintf("tenant-%d", n%8), Target: fmt.Sprintf("target-%d", (int(n)+i)%64), CallId: "c"},
						Attempt: 1, Success: true, Latency: durationpb.New(time.Millisecond),
					})
				}
				for pbb.Next() {
					if _, err := h.workers.ReportOutcome(context.Background(), req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "outcomes/s")
			st := h.store.Stats()
			commits := st.GroupCommits + st.SyncCommits
			b.ReportMetric(float64(commits)/b.Elapsed().Seconds(), "commits/s")
			if commits > 0 {
				b.ReportMetric(float64(st.RecordsFlushed)/float64(commits), "records/commit")
			}
		})
	}
}
