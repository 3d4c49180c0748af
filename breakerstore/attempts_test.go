package breakerstore_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// decideAttempt records ans as the answer to attempt of k through a unit, kept for
// keep from now.
func decideAttempt(t *testing.T, e *env, s *breakerstore.Store, k policy.CallKey, attempt uint32, ans policy.Answer, keep time.Duration) {
	t.Helper()
	u := s.Begin()
	if err := u.RecordAttempt(k, attempt, ans, e.clock.Now().Add(keep)); err != nil {
		t.Fatal(err)
	}
	if err := u.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestAttemptsSurviveARestartAndExpire: an answer is replayed after a
// restart (and a crash after a flush), calls are tenant-scoped, a lower
// attempt is refused naming attempt, and the record goes when it expires.
func TestAttemptsSurviveARestartAndExpire(t *testing.T) {
	for _, mode := range []breakerstore.SyncMode{breakerstore.SyncGroup, breakerstore.SyncAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, func(o *breakerstore.Options) { o.Sync = mode })
			s := e.open()
			a := policy.CallKey{Tenant: "acme", CallID: "c1"}
			ans := policy.Answer{Retry: true, Delay: 1500 * time.Millisecond, Category: policy.CategoryTransient,
				Class: "transient:503", Note: "retry-after:2s", Checks: policy.CheckBreaker, Breaker: policy.BreakerClosed,
				TenantTokens: 41.5, RunRemaining: 7}
			decideAttempt(t, e, s, a, 2, ans, time.Hour)
			if mode == breakerstore.SyncGroup {
				if err := s.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			s = e.crashAndReopen(s)
			got, replay, err := s.ClaimAttempt(a, 2)
			if err != nil || !replay || got != ans {
				t.Fatalf("attempt 2 after a restart: %+v, %v, %v; want the answer replayed", got, replay, err)
			}
			var r *fleet.Refusal
			if _, _, err := s.ClaimAttempt(a, 1); !errors.As(err, &r) || r.Field != "attempt" {
				t.Fatalf("attempt 1 after 2: %v, want a refusal naming attempt", err)
			}
			if _, replay, err := s.ClaimAttempt(policy.CallKey{Tenant: "other", CallID: "c1"}, 1); replay || err != nil {
				t.Fatalf("another tenant's call of the same id: %v, %v; want a fresh decision", replay, err)
			}
			e.clock.Advance(time.Hour)
			if err := s.Flush(); err != nil { // the sweep runs: the record is past its expiry
				t.Fatal(err)
			}
			s = e.reopen(s)
			if _, replay, err := s.ClaimAttempt(a, 1); replay || err != nil {
				t.Fatalf("attempt 1 after the record expired: %v, %v; want a fresh decision", replay, err)
			}
			if err := s.View(func(tx *bbolt.Tx) error {
				if n := tx.Bucket([]byte("attempts")).Stats().KeyN; n != 0 {
					return fmt.Errorf("attempts bucket holds %d records after expiry, want 0", n)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAttemptsAreBounded: past MaxAttemptRecords the oldest record goes,
// in memory and on disk.
func TestAttemptsAreBounded(t *testing.T) {
	const max = 32
	e := newEnv(t, func(o *breakerstore.Options) { o.MaxAttemptRecords = max })
	s := e.open()
	for i := range 10 * max {
		decideAttempt(t, e, s, policy.CallKey{Tenant: "acme", CallID: fmt.Sprint("c", i)}, 1, policy.Answer{Retry: true}, time.Hour)
	}
	s = e.reopen(s)
	kept := 0
	for i := range 10 * max {
		if _, replay, _ := s.ClaimAttempt(policy.CallKey{Tenant: "acme", CallID: fmt.Sprint("c", i)}, 1); replay {
			kept++
		}
	}
	if kept == 0 || kept > max {
		t.Errorf("records kept of %d: %d, want 1 to %d", 10*max, kept, max)
	}
	if _, replay, _ := s.ClaimAttempt(policy.CallKey{Tenant: "acme", CallID: fmt.Sprint("c", 10*max-1)}, 1); !replay {
		t.Errorf("the newest record was evicted")
	}
	if err := s.View(func(tx *bbolt.Tx) error {
		if n := tx.Bucket([]byte("attempts")).Stats().KeyN; n > max {
			return fmt.Errorf("attempts bucket holds %d records, want at most %d", n, max)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
