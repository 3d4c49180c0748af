package redisstore_test

import (
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
)

func benchReplicas(b *testing.B, n int) []*redisstore.Store {
	srv := redistest.Standalone(b)
	var out []*redisstore.Store
	for range n {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		b.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.Open(b.Context(), redisstore.Options{Client: c, Timeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		out = append(out, s)
	}
	return out
}

// BenchmarkAdmitClosedCached is an Admit on a CLOSED breaker the replica
// has cached: no round trip.
func BenchmarkAdmitClosedCached(b *testing.B) {
	s := benchReplicas(b, 1)[0]
	key := policy.BreakerKey{Tenant: "acme", Target: "pay"}
	if _, err := s.Admit(key, policy.BreakerConfig{}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if a, err := s.Admit(key, policy.BreakerConfig{}); err != nil || !a.Admitted {
			b.Fatal(a, err)
		}
	}
}

// BenchmarkRecordFailure is one policyd_record call: what a failure costs
// the engine.
func BenchmarkRecordFailure(b *testing.B) {
	s := benchReplicas(b, 1)[0]
	key := policy.BreakerKey{Tenant: "acme", Target: "pay"}
	cfg := policy.BreakerConfig{ConsecutiveFailures: 1 << 30}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Record(key, cfg, policy.ResultTransientFailure, ""); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTransitionToOtherReplica measures how long a transition made on
// one replica takes to reach a subscriber on another (the event stream's
// delivery), and reports its median and 99th percentile.
func BenchmarkTransitionToOtherReplica(b *testing.B) {
	r := benchReplicas(b, 2)
	key := policy.BreakerKey{Tenant: "acme", Target: "watched"}
	if _, err := r[0].ForceBreaker(key, policy.BreakerClosed); err != nil {
		b.Fatal(err)
	}
	events, cancel := r[1].Subscribe("acme", 1024)
	defer cancel()
	for ev := range events {
		if ev.SnapshotDone {
			break
		}
	}
	var lat []time.Duration
	i := 0
	for b.Loop() {
		st := policy.BreakerOpen
		if i%2 == 1 {
			st = policy.BreakerClosed
		}
		i++
		start := time.Now()
		if _, err := r[0].ForceBreaker(key, st); err != nil {
			b.Fatal(err)
		}
		for ev := range events {
			if ev.Snapshot.Key == key && ev.Snapshot.State == st {
				break
			}
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkAdmitFlowRedis is an AdmitFlow under a concurrency and a rate
// ceiling (one policyd_admit_flow call) and the release of its lease (one
// policyd_release_lease call): what an attempt under a ceiling costs the
// engine.
func BenchmarkAdmitFlowRedis(b *testing.B) {
	s := benchReplicas(b, 1)[0]
	key := policy.BreakerKey{Tenant: "acme", Target: "portal"}
	lim := policy.FlowLimits{Ceiling: 10, LeaseTTL: time.Minute, FullWait: time.Second, Interval: time.Microsecond, Burst: 1000}
	b.ReportAllocs()
	for b.Loop() {
		a, err := s.AdmitFlow(key, policy.BreakerConfig{}, lim)
		if err != nil || !a.Admitted {
			b.Fatal(a, err)
		}
		if _, err := s.ReleaseLease(key, a.LeaseID, lim, policy.SignalSuccess); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSpendRetry is one policyd_spend call of a run's retry: what a
// granted retry costs the engine (with the replica's shares of the bucket
// and the pool set again).
func BenchmarkSpendRetry(b *testing.B) {
	s := benchReplicas(b, 1)[0]
	if _, err := s.SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: 1e12, DepositRatio: 0.1, MinPerSecond: 1, RetryCost: 1, TimeoutCost: 1}); err != nil {
		b.Fatal(err)
	}
	if _, err := s.OpenRun(policy.Run{ID: "run-1", Tenant: "acme", Pool: 1 << 40, Cutoff: time.Now().Add(time.Hour)}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if sp, err := s.SpendRetry(policy.SpendRequest{Tenant: "acme", RunID: "run-1"}); err != nil || !sp.Granted {
			b.Fatal(sp, err)
		}
	}
}
