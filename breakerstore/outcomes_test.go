package breakerstore_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// outcomeBatch is 100 outcomes of tenant t over 10 breakers: successes,
// terminal and transient failures (never 5 in a row on one breaker), some
// already recorded, every tenth closing its call in run, each with one
// audit record. deposits counts the successes.
func outcomeBatch(run string) (ups []policy.OutcomeUpdate, deposits map[string]int) {
	deposits = map[string]int{}
	for i := range 100 {
		u := policy.OutcomeUpdate{
			Key: policy.BreakerKey{Tenant: "t", Target: fmt.Sprint("target-", i%10)}, Breaker: consecutive,
			Audit: []policy.AuditRecord{{Event: policy.AuditOutcome, Tenant: "t", Target: fmt.Sprint("target-", i%10),
				CallID: fmt.Sprint("c", i), Attempt: 1, Detail: "attempt"}},
		}
		switch i % 4 {
		case 0, 1:
			u.Result = policy.ResultSuccess
			deposits["t"]++
		case 2:
			u.Result = policy.ResultTransientFailure
		case 3:
			if i%8 == 3 {
				u.Result = policy.ResultTerminal
			} // else already recorded: the breaker is not told
		}
		if i%10 == 0 {
			u.RunID, u.CallID, u.Final = run, fmt.Sprint("c", i), policy.DispositionSucceeded
		}
		ups = append(ups, u)
	}
	return ups, deposits
}

// applyOneByOne applies ups the way ReportOutcome did before ApplyOutcomes.
func applyOneByOne(t *testing.T, s *breakerstore.Store, ups []policy.OutcomeUpdate, deposits map[string]int) {
	t.Helper()
	for _, u := range ups {
		if u.Result != 0 {
			must(s.Record(u.Key, u.Breaker, u.Result, u.PermitID)).get(t)
		}
		s.AppendAudit(u.Audit...)
		if u.RunID != "" && u.Final != policy.DispositionNone {
			if err := s.RecordFinal(u.RunID, u.CallID, u.Final, u.Stop); err != nil {
				t.Fatal(err)
			}
		}
	}
	for tenant, n := range deposits {
		s.Deposit(tenant, n)
	}
}

// storeState is what a batch of outcomes changes, for comparison.
type storeState struct {
	Breakers []policy.BreakerSnapshot
	Tokens   float64
	Ledger   policy.Ledger
	Audit    int
}

func stateOf(t *testing.T, s *breakerstore.Store, run string) storeState {
	t.Helper()
	recs, _, err := s.QueryAudit(policy.AuditQuery{Tenant: "t", Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	return storeState{
		Breakers: must(s.Breakers("t", policy.BreakerStateUnspecified, policy.BreakerKey{}, 0)).get(t),
		Tokens:   must(s.Budget("t")).get(t).Tokens,
		Ledger:   must(s.Run(run)).get(t).Ledger,
		Audit:    len(recs),
	}
}

// prepare opens a store with tenant t's bucket half spent and a run.
func prepare(t *testing.T, e *env) (*breakerstore.Store, string) {
	t.Helper()
	s := e.open()
	for range 50 {
		must(s.SpendRetry(policy.SpendRequest{Tenant: "t"})).get(t)
	}
	run := must(s.OpenRun(policy.Run{ID: "run-1", Tenant: "t", Pool: 10, Cutoff: e.clock.Now().Add(time.Hour)})).get(t)
	return s, run.ID
}

func TestApplyOutcomesIsRecordingOneByOne(t *testing.T) {
	for _, mode := range []breakerstore.SyncMode{breakerstore.SyncGroup, breakerstore.SyncAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			// The reference records one by one in group mode: the state is
			// the same in both modes, and 200 separate SyncAlways commits
			// would only slow the test down.
			e1 := newEnv(t)
			e2 := newEnv(t, func(o *breakerstore.Options) { o.Sync, o.MaxBatchDelay = mode, time.Millisecond })
			s1, run := prepare(t, e1)
			s2, _ := prepare(t, e2)
			ups, deposits := outcomeBatch(run)
			applyOneByOne(t, s1, ups, deposits)
			n, err := s2.ApplyOutcomes(ups, deposits)
			if n != len(ups) || err != nil {
				t.Fatalf("ApplyOutcomes = %d, %v, want %d, nil", n, err, len(ups))
			}
			if got, want := stateOf(t, s2, run), stateOf(t, s1, run); !reflect.DeepEqual(got, want) {
				t.Errorf("state after ApplyOutcomes:\n got %+v\nwant %+v (as recorded one by one)", got, want)
			}
		})
	}
}

// TestApplyOutcomesOneCommitWithSyncAlways: a batch of 100 outcomes is one
// SyncAlways commit, durable when ApplyOutcomes returns (the flusher never
// runs before the crash).
func TestApplyOutcomesOneCommitWithSyncAlways(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.Sync, o.MaxBatchDelay = breakerstore.SyncAlways, time.Millisecond })
	s, run := prepare(t, e)
	ups, deposits := outcomeBatch(run)
	before := s.Stats()
	if n, err := s.ApplyOutcomes(ups, deposits); n != len(ups) || err != nil {
		t.Fatalf("ApplyOutcomes = %d, %v, want %d, nil", n, err, len(ups))
	}
	after := s.Stats()
	if got := after.SyncCommits - before.SyncCommits; got != 1 {
		t.Errorf("SyncAlways commits for one batch: got %d, want 1", got)
	}
	if got := after.SyncMutations - before.SyncMutations; got < 100 {
		t.Errorf("synced mutations: got %d, want at least 100", got)
	}
	want := stateOf(t, s, run)
	s = e.crashAndReopen(s)
	if got := stateOf(t, s, run); !reflect.DeepEqual(got, want) {
		t.Errorf("state after a crash:\n got %+v\nwant %+v (as answered)", got, want)
	}
}

func TestApplyOutcomesStopsAtTheFirstError(t *testing.T) {
	for _, mode := range []breakerstore.SyncMode{breakerstore.SyncGroup, breakerstore.SyncAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			e := newEnv(t, func(o *breakerstore.Options) {
				o.Sync, o.MaxBatchDelay, o.MaxBreakersPerTenant = mode, time.Millisecond, 2
			})
			s, run := prepare(t, e)
			tokens := must(s.Budget("t")).get(t).Tokens
			ups, deposits := outcomeBatch(run) // 10 breakers: the third is one too many
			n, err := s.ApplyOutcomes(ups, deposits)
			wantErr(t, "ApplyOutcomes past the breaker cap", err, breakerstore.ErrTooManyBreakers)
			if n != 2 {
				t.Errorf("applied: got %d, want 2", n)
			}
			if got := must(s.Budget("t")).get(t).Tokens; got != tokens {
				t.Errorf("tokens: got %v, want %v (no deposit after an error)", got, tokens)
			}
			if got := stateOf(t, s, run); got.Audit != 2 || got.Ledger.Succeeded != 1 {
				t.Errorf("after the error: got %d audit records and %d succeeded in the ledger, want 2 and 1", got.Audit, got.Ledger.Succeeded)
			}
		})
	}
}
