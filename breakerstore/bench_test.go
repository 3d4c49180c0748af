package breakerstore_test

import (
	"fmt"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// benchStore opens a store on the real clock with the default flush interval.
func benchStore(b *testing.B, mode breakerstore.SyncMode) *breakerstore.Store {
	b.Helper()
	s, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(b.TempDir(), "bench.db"), Sync: mode})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func BenchmarkAdmitClosed(b *testing.B) {
	s := benchStore(b, breakerstore.SyncGroup)
	key := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Admit(key, consecutive); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRecordSuccess(b *testing.B) {
	s := benchStore(b, breakerstore.SyncGroup)
	key := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Record(key, consecutive, policy.ResultSuccess, ""); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSpendRetry(b *testing.B) {
	s := benchStore(b, breakerstore.SyncGroup)
	if _, err := s.SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: 1e15}); err != nil {
		b.Fatal(err)
	}
	run, err := s.OpenRun(policy.Run{Tenant: "acme", Pool: 1 << 62, Cutoff: time.Now().Add(time.Hour)})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		req  policy.SpendRequest
	}{
		{"tenant", policy.SpendRequest{Tenant: "acme"}},
		{"tenant+run", policy.SpendRequest{Tenant: "acme", RunID: run.ID}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if sp, err := s.SpendRetry(bc.req); err != nil || !sp.Granted {
					b.Fatal(sp, err)
				}
			}
		})
	}
}

func BenchmarkResolve(b *testing.B) {
	s := benchStore(b, breakerstore.SyncGroup)
	p, _ := s.Resolve("", "")
	if _, err := s.SetPolicy("acme", "payments", p); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		s.Resolve("acme", "payments")
	}
}

// BenchmarkRecordParallel records successes from GOMAXPROCS*8 goroutines,
// all on one breaker (the worst case: one fleet-wide upstream) and on one
// breaker per goroutine.
func BenchmarkRecordParallel(b *testing.B) {
	for _, shared := range []bool{true, false} {
		name := "one-breaker"
		if !shared {
			name = "breaker-per-goroutine"
		}
		b.Run(name, func(b *testing.B) {
			s := benchStore(b, breakerstore.SyncGroup)
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				key := policy.BreakerKey{Tenant: "acme", Target: "payments"}
				if !shared {
					key.Target = fmt.Sprint("target-", next.Add(1))
				}
				for pb.Next() {
					if _, err := s.Record(key, consecutive, policy.ResultSuccess, ""); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkGroupCommit measures outcomes made durable per commit and commits
// per second with 64 concurrent reporters, in SyncGroup (a commit every
// FlushInterval) and SyncAlways (bbolt Batch: every Record waits for its
// commit).
func BenchmarkGroupCommit(b *testing.B) {
	for _, mode := range []breakerstore.SyncMode{breakerstore.SyncGroup, breakerstore.SyncAlways} {
		b.Run("sync="+mode.String(), func(b *testing.B) {
			s := benchStore(b, mode)
			var next atomic.Int64
			start := time.Now()
			b.SetParallelism(max(64/runtime.GOMAXPROCS(0), 1)) // about 64 reporters
			b.RunParallel(func(pb *testing.PB) {
				key := policy.BreakerKey{Tenant: "acme", Target: fmt.Sprint("target-", next.Add(1)%64)}
				for pb.Next() {
					if _, err := s.Record(key, consecutive, policy.ResultSuccess, ""); err != nil {
						b.Fatal(err)
					}
				}
			})
			if err := s.Flush(); err != nil {
				b.Fatal(err)
			}
			elapsed := time.Since(start)
			st := s.Stats()
			commits := st.GroupCommits
			if mode == breakerstore.SyncAlways {
				commits = st.SyncCommits
			}
			commits = max(commits, 1)
			b.ReportMetric(float64(b.N)/float64(commits), "outcomes/commit")
			b.ReportMetric(float64(commits)/elapsed.Seconds(), "commits/s")
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "outcomes/s")
			b.ReportMetric(float64(st.RecordsFlushed)/float64(max(st.GroupCommits+st.SyncCommits, 1)), "records/commit")
		})
	}
}
