package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/policyd/policyd/clients/go/policyclient"
)

// BenchmarkOverhead compares a successful call through Do, with the breaker
// known CLOSED from the watch stream, against calling fn directly. The
// difference is what the client adds to the success path (no RPC on it; the
// outcome is queued for the background batcher).
//
//	go test -run '^$' -bench Overhead -benchmem ./clients/go/e2e/
func BenchmarkOverhead(b *testing.B) {
	fn := func(context.Context, policyclient.Attempt) error { return nil }
	b.Run("direct", func(b *testing.B) {
		ctx := context.Background()
		a := policyclient.Attempt{Number: 1}
		for b.Loop() {
			_ = fn(ctx, a)
		}
	})
	b.Run("Do", func(b *testing.B) {
		d := startDaemon(b, nil)
		c, _ := newClient(b, d, func(cfg *policyclient.Config) { cfg.QueueSize = 1 << 23 })
		ctx := context.Background()
		call := policyclient.Call{Target: "geo", Idempotent: true, CallID: "bench"}
		for b.Loop() {
			if res, _ := c.Do(ctx, call, fn); !res.OK() {
				b.Fatal(res.Disposition)
			}
		}
		b.StopTimer()
		if st := c.Stats(); st.AdmitRPCs != 0 {
			b.Fatalf("Admit RPCs on the CLOSED fast path: %d", st.AdmitRPCs)
		}
		// The outcomes still queued when the loop ends are sent by Close;
		// its time per call is the part of the reporting ns/op leaves out.
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := c.Close(ctx); err != nil {
			b.Fatal(err)
		}
		st := c.Stats()
		if st.OutcomesDropped != 0 || st.OutcomesSent != st.Calls {
			b.Fatalf("outcomes: %d sent, %d dropped, want %d sent", st.OutcomesSent, st.OutcomesDropped, st.Calls)
		}
		b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N), "drain-ns/op")
	})
}
