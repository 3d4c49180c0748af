package breakerstore_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// statsKeys returns the keys of the attemptstats bucket of the closed
// file at path.
func statsKeys(t *testing.T, path string) []string {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var keys []string
	err = db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("attemptstats")).ForEach(func(k, _ []byte) error {
			keys = append(keys, fmt.Sprintf("%q", k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// count applies n outcomes of tenant acme's target, each counting one
// call's end on attempt.
func count(t *testing.T, s *breakerstore.Store, target string, attempt uint32, success bool, n int) {
	t.Helper()
	ups := make([]policy.OutcomeUpdate, n)
	for i := range ups {
		ups[i].Tally = policy.AttemptTally{Tenant: "acme", Target: target, Attempt: attempt, Success: success}
	}
	if _, err := s.ApplyOutcomes(ups, nil); err != nil {
		t.Fatal(err)
	}
}

// TestAttemptStatsStoredByHour: the statistics are one record per tenant,
// target and hour, read back at open; an hour past the retention is
// deleted from the file when the target is next counted, and one found
// past it at open is dropped and deleted; a damaged record refuses to
// open naming the bucket.
func TestAttemptStatsStoredByHour(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	count(t, s, "geo", 1, true, 5)
	count(t, s, "geo", 20, false, 2)
	e.clock.Advance(time.Hour)
	count(t, s, "geo", 2, true, 3)
	count(t, s, "geo-b", 1, true, 1)
	want, err := s.AttemptStats("", "", e.clock.Now().Add(-policy.StatsRetention))
	if err != nil {
		t.Fatal(err)
	}
	s = e.reopen(s)
	got, err := s.AttemptStats("", "", e.clock.Now().Add(-policy.StatsRetention))
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after a reopen: %v, %v; want %v", got, err, want)
	}
	if got[0].Successes[0] != 5 || got[0].Successes[1] != 3 || got[0].Failures[15] != 2 {
		t.Errorf("geo = %v / %v, want 5 and 3 successes on attempts 1 and 2, 2 failures after 16 or more", got[0].Successes, got[0].Failures)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if keys := statsKeys(t, e.opts.Path); len(keys) != 3 {
		t.Fatalf("attemptstats keys %v, want 3 (geo's two hours, geo-b's one)", keys)
	}

	// 168 h after geo's first hour it is dropped, with its record.
	s = e.open()
	e.clock.Advance(policy.StatsRetention - time.Hour)
	count(t, s, "geo", 1, true, 1)
	got, _ = s.AttemptStats("acme", "geo", e.clock.Now().Add(-policy.StatsRetention))
	if len(got) != 1 || got[0].Successes[0] != 1 || got[0].Successes[1] != 3 {
		t.Errorf("geo 168 h on = %v, want the second hour's 3 and the new 1 only", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if keys := statsKeys(t, e.opts.Path); len(keys) != 3 {
		t.Errorf("attemptstats keys %v, want 3 (geo's first hour deleted, its new one added)", keys)
	}

	// A week later nothing is in the retention: open drops every hour and
	// the close deletes them.
	e.clock.Advance(policy.StatsRetention)
	s = e.open()
	if got, _ := s.AttemptStats("", "", e.clock.Now().Add(-policy.StatsRetention)); len(got) != 0 {
		t.Errorf("a week later: %v, want nothing", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if keys := statsKeys(t, e.opts.Path); len(keys) != 0 {
		t.Errorf("a week later attemptstats keys %v, want none", keys)
	}

	db, err := bbolt.Open(e.opts.Path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("attemptstats")).Put([]byte("acme\x00geo\x00\x00\x00\x00\x00\x00\x00\x00\x07"), []byte{1, 2, 3})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := breakerstore.Open(e.opts); !errors.Is(err, breakerstore.ErrCorrupt) || !strings.Contains(fmt.Sprint(err), "bucket attemptstats") {
		t.Errorf("Open with a damaged attempt statistics record: %v, want ErrCorrupt naming attemptstats", err)
	}
}

// TestAttemptStatsCountOnceWithTheLedger: a run's final disposition counts
// in the statistics only when the ledger takes it as the call's first, in
// both sync modes; SyncAlways makes the count durable before ApplyOutcomes
// returns.
func TestAttemptStatsCountOnceWithTheLedger(t *testing.T) {
	for _, mode := range []breakerstore.SyncMode{breakerstore.SyncGroup, breakerstore.SyncAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, func(o *breakerstore.Options) { o.Sync = mode })
			s := e.open()
			r, err := s.OpenRun(policy.Run{Tenant: "acme", Pool: 5, Cutoff: e.clock.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			up := policy.OutcomeUpdate{RunID: r.ID, CallID: "doc-1", Final: policy.DispositionDeadLetter, Stop: policy.StopAttemptsExhausted,
				Tally: policy.AttemptTally{Tenant: "acme", Target: "geo", Attempt: 3}}
			for range 3 {
				ups := []policy.OutcomeUpdate{up}
				if _, err := s.ApplyOutcomes(ups, nil); err != nil {
					t.Fatal(err)
				}
			}
			if mode == breakerstore.SyncAlways {
				s = e.crashAndReopen(s)
			}
			got, err := s.AttemptStats("acme", "geo", e.clock.Now().Add(-time.Hour))
			if err != nil || len(got) != 1 || got[0].Failures[2] != 1 || got[0].Failures.Total() != 1 {
				t.Errorf("a final reported three times: %v, %v; want one failure after attempt 3", got, err)
			}
		})
	}
}

// TestAttemptStatsManyKindsInOneBatch: a batch whose calls ended more
// ways than the batch's table of sums holds counts every one.
func TestAttemptStatsManyKindsInOneBatch(t *testing.T) {
	s := newEnv(t).open()
	var ups []policy.OutcomeUpdate
	for round := range 3 {
		for i := range 40 {
			ups = append(ups, policy.OutcomeUpdate{Tally: policy.AttemptTally{Tenant: "acme", Target: fmt.Sprint("t-", i),
				Attempt: uint32(1 + round%2), Success: i%2 == 0}})
		}
	}
	if _, err := s.ApplyOutcomes(ups, nil); err != nil {
		t.Fatal(err)
	}
	got, err := s.AttemptStats("acme", "", time.Time{})
	if err != nil || len(got) != 40 {
		t.Fatalf("AttemptStats = %d entries, %v; want 40", len(got), err)
	}
	for _, ts := range got {
		counts := ts.Failures
		if strings.TrimPrefix(ts.Target, "t-") != "" && ts.Successes.Total() > 0 {
			counts = ts.Successes
		}
		if counts[0] != 2 || counts[1] != 1 || counts.Total() != 3 {
			t.Errorf("%s = %v / %v, want 2 on attempt 1 and 1 on attempt 2", ts.Target, ts.Successes, ts.Failures)
		}
	}
}

// TestAttemptStatsTargetsCapped: a tenant has statistics for at most
// MaxBreakersPerTenant targets; tallies for more are refused and counted.
func TestAttemptStatsTargetsCapped(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.MaxBreakersPerTenant = 3 })
	s := e.open()
	for i := range 5 {
		count(t, s, fmt.Sprint("made-up-", i), 1, true, 2)
	}
	count(t, s, "made-up-0", 1, true, 1) // a target it has goes on counting
	got, err := s.AttemptStats("acme", "", time.Time{})
	if err != nil || len(got) != 3 || got[0].Successes[0] != 3 {
		t.Fatalf("AttemptStats = %v, %v; want 3 targets, the first with 3 successes", got, err)
	}
	if n := s.Stats().StatsRefused; n != 4 {
		t.Errorf("StatsRefused = %d, want 4 (two targets beyond the cap, 2 calls each)", n)
	}
	s = e.reopen(s)
	count(t, s, "made-up-9", 1, true, 1)
	if got, _ := s.AttemptStats("acme", "", time.Time{}); len(got) != 3 {
		t.Errorf("after a reopen: %d targets, want the cap of 3 still held", len(got))
	}
}
