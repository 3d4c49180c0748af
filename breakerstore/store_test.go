package breakerstore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// TestReopenKeepsState checks every kind of state across a clean Close and
// across a crash after a group commit.
func TestReopenKeepsState(t *testing.T) {
	tests := []struct {
		name   string
		reopen func(e *env, s *breakerstore.Store) *breakerstore.Store
	}{
		{"close and open", (*env).reopen},
		{"crash after group commit", func(e *env, s *breakerstore.Store) *breakerstore.Store {
			if err := s.Flush(); err != nil {
				t.Fatalf("Flush() = %v, want nil", err)
			}
			return e.crashAndReopen(s)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			s := e.open()
			open := policy.BreakerKey{Tenant: "acme", Target: "payments"}
			forced := policy.BreakerKey{Tenant: "acme", Target: "ledger"}
			counting := policy.BreakerKey{Target: "shared-dns"}
			record(t, s, open, consecutive, policy.ResultTransientFailure, 5)
			wantOpen := must(s.Breaker(open)).get(t)
			must(s.ForceBreaker(forced, policy.BreakerDisabled)).get(t)
			record(t, s, counting, consecutive, policy.ResultTransientFailure, 3)
			must(s.SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: 3, MinPerSecond: 0.001})).get(t)
			for range 3 {
				must(s.SpendRetry(policy.SpendRequest{Tenant: "acme"})).get(t)
			}
			run := must(s.OpenRun(policy.Run{ID: "nightly", Tenant: "batch", Pool: 10, Cutoff: e.clock.Now().Add(time.Hour)})).get(t)
			must(s.SpendRetry(policy.SpendRequest{RunID: run.ID})).get(t)
			if err := s.RecordFinal(run.ID, "call-1", policy.DispositionSucceeded, policy.StopNone); err != nil {
				t.Fatal(err)
			}
			pol := policy.Default()
			pol.MaxAttempts = 7
			must(s.SetPolicy("acme", "payments", pol)).get(t)

			s = tt.reopen(e, s)

			got := must(s.Breaker(open)).get(t)
			if got.State != policy.BreakerOpen || !got.OpenUntil.Equal(wantOpen.OpenUntil) {
				t.Errorf("open breaker: got %v until %v, want OPEN until %v", got.State, got.OpenUntil, wantOpen.OpenUntil)
			}
			if got := must(s.Breaker(forced)).get(t); got.State != policy.BreakerDisabled || !got.Forced {
				t.Errorf("forced breaker: got %v forced=%v, want DISABLED forced", got.State, got.Forced)
			}
			if got := must(s.Breaker(counting)).get(t); got.ConsecutiveFailures != 3 || got.WindowFailures != 3 {
				t.Errorf("counters: got consecutive %d window %d, want 3 and 3", got.ConsecutiveFailures, got.WindowFailures)
			}
			b := must(s.Budget("acme")).get(t)
			if b.Tokens > 0.01 || b.Granted != 3 || b.IsDefault || b.Budget.Capacity != 3 {
				t.Errorf("budget: got %+v, want spent explicit budget of capacity 3 with 3 granted", b)
			}
			spend := must(s.SpendRetry(policy.SpendRequest{Tenant: "acme"})).get(t)
			if spend.Granted {
				t.Errorf("SpendRetry after reopen: got granted, want refused (budget spent)")
			}
			r := must(s.Run("nightly")).get(t)
			if r.Spent != 1 || r.Ledger.Succeeded != 1 || r.Pool != 10 || r.Tenant != "batch" {
				t.Errorf("run: got %+v, want spent 1, 1 succeeded, pool 10, tenant batch", r)
			}
			if err := s.RecordFinal(run.ID, "call-1", policy.DispositionSucceeded, policy.StopNone); err != nil {
				t.Fatal(err)
			}
			if r := must(s.Run("nightly")).get(t); r.Ledger.Succeeded != 1 {
				t.Errorf("re-reported call after reopen: got %d succeeded, want 1", r.Ledger.Succeeded)
			}
			if p, entry := s.Resolve("acme", "payments"); p.MaxAttempts != 7 || entry.Tenant != "acme" {
				t.Errorf("policy: got max attempts %d from %q/%q, want 7 from acme/payments", p.MaxAttempts, entry.Tenant, entry.Target)
			}
		})
	}
}

// TestCrashLosesOnlyUnflushedCounters shows the durability contract in
// SyncGroup: transitions and admin writes survive a crash, counters written
// after the last group commit do not.
func TestCrashLosesOnlyUnflushedCounters(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	tripped := policy.BreakerKey{Tenant: "t", Target: "down"}
	counted := policy.BreakerKey{Tenant: "t", Target: "flaky"}
	record(t, s, tripped, consecutive, policy.ResultTransientFailure, 5)
	record(t, s, counted, consecutive, policy.ResultTransientFailure, 2)

	s = e.crashAndReopen(s)

	if got := must(s.Breaker(tripped)).get(t); got.State != policy.BreakerOpen {
		t.Errorf("tripped breaker after crash: got %v, want OPEN", got.State)
	}
	if _, err := s.Breaker(counted); !errors.Is(err, breakerstore.ErrNotFound) {
		t.Errorf("unflushed breaker after crash: got %v, want ErrNotFound", err)
	}
}

func TestSyncAlwaysDurableOnReturn(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) {
		o.Sync = breakerstore.SyncAlways
		o.MaxBatchDelay = time.Millisecond
	})
	s := e.open()
	key := policy.BreakerKey{Tenant: "t", Target: "flaky"}
	record(t, s, key, consecutive, policy.ResultTransientFailure, 2)

	err := s.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket([]byte("breakers")).Get([]byte("t\x00flaky")); v == nil {
			return errors.New("no breaker record")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read tx right after Record: %v, want the record committed", err)
	}
	run := must(s.OpenRun(policy.Run{Tenant: "t", Pool: 5, Cutoff: e.clock.Now().Add(time.Hour)})).get(t)
	must(s.SpendRetry(policy.SpendRequest{RunID: run.ID, Timeout: true})).get(t)
	if err := s.RecordFinal(run.ID, "c1", policy.DispositionDeadLetter, policy.StopBudgetExhausted); err != nil {
		t.Fatal(err)
	}

	if st := s.Stats(); st.SyncCommits == 0 || st.SyncMutations < 4 {
		t.Errorf("Stats() = %+v, want SyncAlways commits and at least 4 synced mutations", st)
	}

	s = e.crashAndReopen(s)

	if got := must(s.Breaker(key)).get(t); got.ConsecutiveFailures != 2 {
		t.Errorf("consecutive failures after crash: got %d, want 2", got.ConsecutiveFailures)
	}
	if got := must(s.Budget("t")).get(t); got.Tokens != 98 || got.Granted != 1 {
		t.Errorf("budget after crash: got %v tokens, %d granted, want 98 and 1", got.Tokens, got.Granted)
	}
	if got := must(s.Run(run.ID)).get(t); got.Spent != 1 || got.Ledger.DeadLetterBudget != 1 {
		t.Errorf("run after crash: got spent %d, ledger %+v, want 1 and 1 budget dead letter", got.Spent, got.Ledger)
	}
}

func TestOpenRefuses(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, path string)
		want  error
		msg   string
	}{
		{
			name: "newer schema",
			setup: func(t *testing.T, path string) {
				writeBolt(t, path, func(tx *bbolt.Tx) error {
					b, err := tx.CreateBucket([]byte("meta"))
					if err != nil {
						return err
					}
					return b.Put([]byte("schema"), binary.BigEndian.AppendUint32(nil, 4))
				})
			},
			want: breakerstore.ErrSchema,
			msg:  "policyd.db: schema version 4 is newer than this policyd (3)",
		},
		{
			name: "foreign bbolt file",
			setup: func(t *testing.T, path string) {
				writeBolt(t, path, func(tx *bbolt.Tx) error {
					_, err := tx.CreateBucket([]byte("something-else"))
					return err
				})
			},
			want: breakerstore.ErrSchema,
			msg:  "not a policyd database",
		},
		{
			name: "mangled schema value",
			setup: func(t *testing.T, path string) {
				writeBolt(t, path, func(tx *bbolt.Tx) error {
					b, err := tx.CreateBucket([]byte("meta"))
					if err != nil {
						return err
					}
					return b.Put([]byte("schema"), []byte{1})
				})
			},
			want: breakerstore.ErrCorrupt,
			msg:  "meta/schema",
		},
		{
			name: "garbage file",
			setup: func(t *testing.T, path string) {
				junk := []byte(strings.Repeat("this is not a bbolt database\n", 1000))
				if err := os.WriteFile(path, junk, 0o600); err != nil {
					t.Fatal(err)
				}
			},
			want: breakerstore.ErrCorrupt,
			msg:  "not a bbolt database",
		},
		{
			name: "short file",
			setup: func(t *testing.T, path string) {
				if err := os.WriteFile(path, []byte("hello"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			want: breakerstore.ErrCorrupt,
		},
		{
			name: "undecodable record",
			setup: func(t *testing.T, path string) {
				e := &env{t: t, clock: newFakeClock(), opts: breakerstore.Options{Path: path, Clock: newFakeClock()}}
				s := must(breakerstore.Open(e.opts)).get(t)
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				writeBolt(t, path, func(tx *bbolt.Tx) error {
					return tx.Bucket([]byte("breakers")).Put([]byte("t\x00x"), []byte{1, 2, 3})
				})
			},
			want: breakerstore.ErrCorrupt,
			msg:  "bucket breakers",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "policyd.db")
			tt.setup(t, path)
			s, err := breakerstore.Open(breakerstore.Options{Path: path, LockTimeout: 100 * time.Millisecond})
			if err == nil {
				s.Close()
				t.Fatalf("Open() = nil error, want %v", tt.want)
			}
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Open() = %v, want %v mentioning %q", err, tt.want, tt.msg)
			}
			if err := breakerstore.Check(path, 100*time.Millisecond); !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Check() = %v, want %v mentioning %q", err, tt.want, tt.msg)
			}
		})
	}
}

func writeBolt(t *testing.T, path string, fn func(tx *bbolt.Tx) error) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(fn); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestOpenLockedFailsFast(t *testing.T) {
	e := newEnv(t)
	e.open()

	start := time.Now()
	s, err := breakerstore.Open(e.opts)
	elapsed := time.Since(start)
	if err == nil {
		s.Close()
		t.Fatal("second Open of a held file: got nil error, want ErrLocked")
	}
	if !errors.Is(err, breakerstore.ErrLocked) || !strings.Contains(err.Error(), e.opts.Path) ||
		!strings.Contains(err.Error(), "gave up after 100ms") || strings.Count(err.Error(), "held by another process") != 1 {
		t.Errorf("second Open: got %v, want ErrLocked naming the path and the 100ms timeout, saying it once", err)
	}
	if elapsed > time.Second {
		t.Errorf("second Open took %v, want about the 100ms LockTimeout", elapsed)
	}
}

func TestClosedStoreRefuses(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	key := policy.BreakerKey{Tenant: "t", Target: "x"}
	checks := []struct {
		name string
		err  error
	}{
		{"Admit", func() error { _, err := s.Admit(key, consecutive); return err }()},
		{"Record", func() error { _, err := s.Record(key, consecutive, policy.ResultSuccess, ""); return err }()},
		{"SpendRetry", func() error { _, err := s.SpendRetry(policy.SpendRequest{Tenant: "t"}); return err }()},
		{"SetPolicy", func() error { _, err := s.SetPolicy("t", "", policy.Default()); return err }()},
		{"Flush", s.Flush()},
	}
	for _, c := range checks {
		if !errors.Is(c.err, breakerstore.ErrClosed) {
			t.Errorf("%s after Close: got %v, want ErrClosed", c.name, c.err)
		}
	}
	if _, ok := <-subscribe(t, s, "", 1).C; ok {
		t.Errorf("Subscribe after Close: got an event, want a closed channel")
	}
}

func TestDiskFull(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.MaxSize = 128 << 10 })
	s := e.open()
	var err error
	big := policy.Default()
	big.TransientHTTP = make([]int, 2000) // a large record
	for i := 0; i < 1000 && err == nil; i++ {
		_, err = s.SetPolicy("tenant", strings.Repeat("t", 10)+string(rune('a'+i%26))+strings.Repeat("x", i), big)
	}
	wantErr(t, "SetPolicy on a full database", err, breakerstore.ErrDiskFull)

	// Decisions keep being served from memory when a group commit fails.
	key := policy.BreakerKey{Tenant: "t", Target: "x"}
	record(t, s, key, consecutive, policy.ResultTransientFailure, 2)
	got := must(s.Admit(key, consecutive)).get(t)
	if !got.Admitted {
		t.Errorf("Admit while the disk is full: got %+v, want admitted", got)
	}
}

// TestErrorClasses checks that every error a caller maps to a status carries
// its class from package policy, so the server needs no breakerstore import.
func TestErrorClasses(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.MaxBreakersPerTenant = 1 })
	s := e.open()
	must(s.OpenRun(policy.Run{ID: "r", Tenant: "t", Pool: 1, Cutoff: e.clock.Now().Add(time.Hour)})).get(t)
	must(s.Admit(policy.BreakerKey{Tenant: "t", Target: "a"}, consecutive)).get(t)
	_, notFound := s.Breaker(policy.BreakerKey{Tenant: "t", Target: "missing"})
	_, exists := s.OpenRun(policy.Run{ID: "r", Tenant: "t", Pool: 1, Cutoff: e.clock.Now().Add(time.Hour)})
	_, invalid := s.SetBudget(policy.TenantBudget{Tenant: "t", Capacity: -1})
	_, tooMany := s.Admit(policy.BreakerKey{Tenant: "t", Target: "b"}, consecutive)
	tests := []struct {
		name  string
		err   error
		store error
		class error
	}{
		{"not found", notFound, breakerstore.ErrNotFound, policy.ErrNotFound},
		{"exists", exists, breakerstore.ErrExists, policy.ErrExists},
		{"invalid", invalid, breakerstore.ErrInvalid, policy.ErrInvalid},
		{"too many breakers", tooMany, breakerstore.ErrTooManyBreakers, policy.ErrCapacity},
		{"disk full", breakerstore.ErrDiskFull, breakerstore.ErrDiskFull, policy.ErrCapacity},
		{"closed", breakerstore.ErrClosed, breakerstore.ErrClosed, policy.ErrClosed},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, tt.store) || !errors.Is(tt.err, tt.class) {
			t.Errorf("%s: got %v, want %v and class %v", tt.name, tt.err, tt.store, tt.class)
		}
	}
	var fe *policy.FieldError
	if !errors.As(invalid, &fe) || fe.Field != "capacity" || fe.Rule != "must be finite and > 0" {
		t.Errorf("invalid: got %v (field error %+v), want a *policy.FieldError for capacity", invalid, fe)
	}
	if want := "breakerstore: invalid argument: capacity: must be finite and > 0"; invalid.Error() != want {
		t.Errorf("invalid message: got %q, want %q", invalid.Error(), want)
	}
}

func TestCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policyd.db")
	s, err := breakerstore.Open(breakerstore.Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: 5}); err != nil {
		t.Fatal(err)
	}
	if err := breakerstore.Check(path, 100*time.Millisecond); !errors.Is(err, breakerstore.ErrLocked) {
		t.Errorf("Check on a held file: got %v, want breakerstore.ErrLocked", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := breakerstore.Check(path, 0); err != nil {
		t.Errorf("Check on a good file: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.db")
	if err := os.WriteFile(bad, bytes.Repeat([]byte{0xAB}, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := breakerstore.Check(bad, 0); !errors.Is(err, breakerstore.ErrCorrupt) {
		t.Errorf("Check on garbage: got %v, want breakerstore.ErrCorrupt", err)
	}
}

// TestOpenMigratesAVersion1FileOfSegments: a version 1 file written by the
// build that introduced segments (meta/schema 1 and an auditseg bucket) is
// recorded as the current version at open, with its records as they were, and is not
// written to at the next open.
func TestOpenMigratesAVersion1FileOfSegments(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	s.AppendAudit(policy.AuditRecord{Tenant: "acme", CallID: "c1", Event: policy.AuditDecision})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	writeBolt(t, e.opts.Path, func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte("schema"), binary.BigEndian.AppendUint32(nil, 1))
	})
	s = e.open()
	if recs, _ := query(t, s, policy.AuditQuery{CallID: "c1"}); len(recs) != 1 {
		t.Errorf("the audit record after the migration: got %+v, want one", recs)
	}
	err := s.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket([]byte("meta")).Get([]byte("schema")); binary.BigEndian.Uint32(v) != 3 {
			t.Errorf("meta/schema: got %x, want version 3", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	check(t, e, s)
}
