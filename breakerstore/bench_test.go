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

// BenchmarkDecisionInMemory is the part of a NextDelay decision that is
// neither gRPC nor protobuf: resolve the policy, apply the decision math,
// record the failure in the breaker and spend a retry from the tenant's
// budget, all in memory (SyncGroup). The goal is under 1µs and no
// allocation.
func BenchmarkDecisionInMemory(b *testing.B) {
	s := benchStore(b, breakerstore.SyncGroup)
	if _, err := s.SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: 1e15, MinPerSecond: 1e9}); err != nil {
		b.Fatal(err)
	}
	never := policy.Default()
	never.Breaker.ConsecutiveFailures = 10000
	if _, err := s.SetPolicy("acme", "", never); err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	in := policy.Input{Attempt: 1, Failure: policy.Failure{Kind: policy.FailureHTTP, Code: 503}, Idempotent: true,
		Now: now, Origin: now, Deadline: now.Add(time.Hour), JitterDraw: 0.5, SpreadDraw: 0.3}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		p, _ := s.Resolve("acme", "payments")
		dec := policy.Decide(&p, in)
		// Every 1000th outcome a success, so the breaker never trips.
		r := policy.ResultTransientFailure
		if i%1000 == 0 {
			r = policy.ResultSuccess
		}
		key := policy.KeyFor(p.Breaker, "acme", "payments")
		if _, err := s.Record(key, p.Breaker, r, ""); err != nil {
			b.Fatal(err)
		}
		if sp, err := s.SpendRetry(policy.SpendRequest{Tenant: "acme"}); err != nil || !sp.Granted || !dec.Retry {
			b.Fatal(sp, err, dec)
		}
	}
}

// BenchmarkApplyOutcomes applies batches of 100 outcomes (the store's part
// of one ReportOutcome: breaker results, audit records, attempt
// statistics) and reports the cost per outcome, in both modes.
func BenchmarkApplyOutcomes(b *testing.B) {
	for _, mode := range []breakerstore.SyncMode{breakerstore.SyncGroup, breakerstore.SyncAlways} {
		b.Run("sync="+mode.String(), func(b *testing.B) {
			s := benchStore(b, mode)
			ups := make([]policy.OutcomeUpdate, 100)
			for i := range ups {
				target := fmt.Sprint("target-", i%16)
				ups[i] = policy.OutcomeUpdate{Key: policy.BreakerKey{Tenant: "acme", Target: target}, Breaker: consecutive,
					Result: policy.ResultSuccess, Audit: []policy.AuditRecord{{Event: policy.AuditOutcome, Tenant: "acme",
						Target: target, CallID: fmt.Sprint("c", i), Attempt: 1, Detail: "attempt succeeded"}},
					// Each success counts in the attempt statistics, as ReportOutcome's do.
					Tally: policy.AttemptTally{Tenant: "acme", Target: target, Attempt: 1, Success: true}}
			}
			deposits := map[string]int{"acme": 100}
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				if _, err := s.ApplyOutcomes(ups, deposits); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*len(ups))/time.Since(start).Seconds(), "outcomes/s")
		})
	}
}

// BenchmarkAuditFlush measures the group commit of n buffered audit
// records of distinct calls and a few tenants, per record, in the steady
// state of a full trail: AuditMaxRecords is reached, so every flush also
// deletes n records by retention. The cost should not grow with n (it did,
// quadratically, while index entries were put in record order).
func BenchmarkAuditFlush(b *testing.B) {
	const trail = 200_000 // records kept (AuditMaxRecords)
	for _, n := range []int{1000, 10000, 50000} {
		b.Run(fmt.Sprint("records=", n), func(b *testing.B) {
			s, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(b.TempDir(), "bench.db"),
				FlushInterval: time.Hour, AuditBuffer: 4 * n, AuditMaxRecords: trail}) // not half full: no flush but the benchmark's
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			recs := make([]policy.AuditRecord, n)
			for i := range recs {
				recs[i] = policy.AuditRecord{Event: policy.AuditOutcome, Tenant: fmt.Sprint("tenant-", i%8),
					Target: "geo", CallID: fmt.Sprintf("call-%08x", uint32(i)*2654435761), Attempt: 1, Detail: "attempt succeeded"}
			}
			for s.Stats().AuditRecords < trail {
				s.AppendAudit(recs...)
				if err := s.Flush(); err != nil {
					b.Fatal(err)
				}
			}
			deleted := s.Stats().AuditDeleted
			var flushing time.Duration
			for b.Loop() {
				s.AppendAudit(recs...)
				t0 := time.Now()
				if err := s.Flush(); err != nil {
					b.Fatal(err)
				}
				flushing += time.Since(t0)
			}
			b.ReportMetric(float64(flushing.Nanoseconds())/float64(b.N*n), "ns/record")
			b.ReportMetric(float64(s.Stats().AuditDeleted-deleted)/float64(b.N*n), "deleted/record")
		})
	}
}

// BenchmarkAttempts is the attempts-per-call part of a NextDelay, in
// memory (SyncGroup): ClaimAttempt, then the record of the answer through
// a batch. "next" decides attempt after attempt of one call (the steady
// state of a retrying call); "new" a call never seen per iteration, which
// must copy its key and make its record, and whose record the background
// group commit then writes to a new place in the bucket (its allocations
// count too; the ids are made before the timer).
func BenchmarkAttempts(b *testing.B) {
	ans := policy.Answer{Retry: true, Delay: time.Second, Class: "transient:503"}
	b.Run("next", func(b *testing.B) {
		s := benchStore(b, breakerstore.SyncGroup)
		k := policy.CallKey{Tenant: "acme", CallID: "c"}
		keep := time.Now().Add(time.Hour)
		b.ReportAllocs()
		attempt := uint32(0)
		for b.Loop() {
			attempt++
			if _, replay, err := s.ClaimAttempt(k, attempt); err != nil || replay {
				b.Fatal(replay, err)
			}
			u := s.Begin()
			if err := u.RecordAttempt(k, attempt, ans, keep); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("new", func(b *testing.B) {
		s := benchStore(b, breakerstore.SyncGroup)
		keys := make([]policy.CallKey, 1<<20)
		for i := range keys {
			keys[i] = policy.CallKey{Tenant: "acme", CallID: fmt.Sprint("c", i)}
		}
		keep := time.Now().Add(time.Hour)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := keys[i%len(keys)]
			i++
			if _, _, err := s.ClaimAttempt(k, 1); err != nil {
				b.Fatal(err)
			}
			u := s.Begin()
			if err := u.RecordAttempt(k, 1, ans, keep); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkNoteCallFlushing notes decisions of the calls of one run in the
// call table from 32 goroutines per core while the group commit writes
// them every 20ms: the run's lock is shared by its notes and its write,
// so what the flush holds it for shows in the mutex profile
// (-mutexprofile), more than in ns/op.
func BenchmarkNoteCallFlushing(b *testing.B) {
	s, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(b.TempDir(), "bench.db"), FlushInterval: 20 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	run, err := s.OpenRun(policy.Run{Tenant: "acme", Pool: 1 << 40, Cutoff: time.Now().Add(time.Hour)})
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, 50000)
	for i := range ids {
		ids[i] = fmt.Sprint("call-", i)
	}
	var n atomic.Int64
	b.SetParallelism(32)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			note := policy.CallNote{Attempt: uint32(i%3 + 1), Time: time.Unix(0, i), Classification: "transient:503",
				Detail: "retry after 1s (transient:503)"}
			if err := s.NoteCall(run.ID, ids[int(i)%len(ids)], note); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
