package breakerstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

func TestLedgerMapping(t *testing.T) {
	tests := []struct {
		name string
		d    policy.Disposition
		stop policy.StopReason
		want policy.Ledger
	}{
		{"succeeded", policy.DispositionSucceeded, policy.StopNone, policy.Ledger{Succeeded: 1}},
		{"failed terminal", policy.DispositionFailedTerminal, policy.StopTerminal, policy.Ledger{FailedTerminal: 1}},
		{"dead letter, attempts", policy.DispositionDeadLetter, policy.StopAttemptsExhausted, policy.Ledger{DeadLetterExhausted: 1}},
		{"dead letter, budget", policy.DispositionDeadLetter, policy.StopBudgetExhausted, policy.Ledger{DeadLetterBudget: 1}},
		{"dead letter, not idempotent", policy.DispositionDeadLetter, policy.StopNotIdempotent, policy.Ledger{DeadLetterNotIdempotent: 1}},
		{"dead letter, pushback", policy.DispositionDeadLetter, policy.StopServerPushback, policy.Ledger{DeadLetterPushback: 1}},
		{"dead letter, deadline", policy.DispositionDeadLetter, policy.StopDeadline, policy.Ledger{DeadLetterDeadline: 1}},
		{"dead letter, other reason", policy.DispositionDeadLetter, policy.StopCircuitOpen, policy.Ledger{DeadLetterExhausted: 1}},
		{"circuit open", policy.DispositionCircuitOpen, policy.StopCircuitOpen, policy.Ledger{CircuitOpen: 1}},
		{"deadline cut", policy.DispositionDeadlineCut, policy.StopDeadline, policy.Ledger{DeadlineCut: 1}},
	}
	e := newEnv(t)
	s := e.open()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := must(s.OpenRun(policy.Run{Tenant: "t", Pool: 1, Cutoff: e.clock.Now().Add(time.Hour)})).get(t)
			if err := s.RecordFinal(r.ID, "call", tt.d, tt.stop); err != nil {
				t.Fatal(err)
			}
			if got := must(s.Run(r.ID)).get(t).Ledger; got != tt.want {
				t.Errorf("ledger: got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestRecordFinalFirstWins: the first final disposition of a call id wins
// (DESIGN.md's invariant table): the same report again counts once, a
// different one is refused naming final_disposition and the disposition
// in force, the ledger unchanged, also after a crash and a reopen.
func TestRecordFinalFirstWins(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	r := must(s.OpenRun(policy.Run{ID: "batch-7", Tenant: "t", Pool: 10, Cutoff: e.clock.Now().Add(time.Hour)})).get(t)
	type report struct {
		call string
		d    policy.Disposition
		stop policy.StopReason
	}
	steps := []struct {
		name    string
		report  report
		refused string // in the refusal's message; "" for none
		want    policy.Ledger
	}{
		{"first report", report{"a", policy.DispositionDeadLetter, policy.StopAttemptsExhausted}, "", policy.Ledger{DeadLetterExhausted: 1}},
		{"same report again", report{"a", policy.DispositionDeadLetter, policy.StopAttemptsExhausted}, "", policy.Ledger{DeadLetterExhausted: 1}},
		{"another call", report{"b", policy.DispositionSucceeded, policy.StopNone}, "", policy.Ledger{DeadLetterExhausted: 1, Succeeded: 1}},
		{"a changed disposition is refused", report{"a", policy.DispositionSucceeded, policy.StopNone},
			"already final as DEAD_LETTER (ATTEMPTS_EXHAUSTED)", policy.Ledger{DeadLetterExhausted: 1, Succeeded: 1}},
		{"a changed stop reason is refused", report{"a", policy.DispositionDeadLetter, policy.StopBudgetExhausted},
			"already final as DEAD_LETTER (ATTEMPTS_EXHAUSTED)", policy.Ledger{DeadLetterExhausted: 1, Succeeded: 1}},
	}
	for _, st := range steps {
		err := s.RecordFinal(r.ID, st.report.call, st.report.d, st.report.stop)
		switch {
		case st.refused == "" && err != nil:
			t.Fatalf("%s: %v", st.name, err)
		case st.refused != "" && (!failedPrecondition(err) || !strings.Contains(err.Error(), "final_disposition: "+st.refused)):
			t.Errorf("%s: RecordFinal = %v, want a precondition failure naming final_disposition, %q", st.name, err, st.refused)
		}
		if got := must(s.Run(r.ID)).get(t).Ledger; got != st.want {
			t.Errorf("%s: ledger got %+v, want %+v", st.name, got, st.want)
		}
	}
	s = e.crashAndReopen(s) // nothing flushed: only the run itself survives
	if got := must(s.Run(r.ID)).get(t).Ledger; got != (policy.Ledger{}) {
		t.Errorf("ledger after a crash before any group commit: got %+v, want empty", got)
	}
	for _, st := range steps {
		_ = s.RecordFinal(r.ID, st.report.call, st.report.d, st.report.stop)
	}
	s = e.reopen(s)
	if err := s.RecordFinal(r.ID, "b", policy.DispositionDeadLetter, policy.StopBudgetExhausted); !failedPrecondition(err) {
		t.Errorf("after reopen: a changed disposition of b = %v, want refused", err)
	}
	if got, want := must(s.Run(r.ID)).get(t).Ledger, steps[len(steps)-1].want; got != want {
		t.Errorf("ledger after reopen and a refused report: got %+v, want %+v", got, want)
	}

	err := s.RecordFinal("no-such-run", "a", policy.DispositionSucceeded, policy.StopNone)
	wantErr(t, "RecordFinal of an unknown run", err, breakerstore.ErrNotFound)
	err = s.RecordFinal(r.ID, "a", policy.DispositionNone, policy.StopNone)
	wantErr(t, "RecordFinal(DispositionNone)", err, breakerstore.ErrInvalid)
	err = s.RecordFinal(r.ID, "", policy.DispositionSucceeded, policy.StopNone)
	wantErr(t, "RecordFinal without a call id", err, breakerstore.ErrInvalid)
}

// failedPrecondition reports whether err has the class the server answers
// FAILED_PRECONDITION.
func failedPrecondition(err error) bool {
	var p interface{ FailedPrecondition() bool }
	return errors.As(err, &p) && p.FailedPrecondition()
}

func TestRunPoolAndCutoff(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	r := must(s.OpenRun(policy.Run{Tenant: "t", Pool: 2, Cutoff: e.clock.Now().Add(time.Hour)})).get(t)
	steps := []struct {
		name    string
		advance time.Duration
		want    policy.Spend
	}{
		{"first retry", 0, policy.Spend{Granted: true, TenantTokens: 99, RunRemaining: 1, HasRun: true}},
		{"second retry", 0, policy.Spend{Granted: true, TenantTokens: 98, RunRemaining: 0, HasRun: true}},
		{"pool spent", 0, policy.Spend{Stop: policy.StopBudgetExhausted, Disposition: policy.DispositionDeadLetter, TenantTokens: 98, HasRun: true}},
		{"past the cut-off", time.Hour, policy.Spend{Stop: policy.StopDeadline, Disposition: policy.DispositionDeadlineCut, TenantTokens: 100, HasRun: true}},
	}
	for _, st := range steps {
		e.clock.Advance(st.advance)
		if got := must(s.SpendRetry(policy.SpendRequest{RunID: r.ID})).get(t); got != st.want {
			t.Errorf("%s: got %+v, want %+v", st.name, got, st.want)
		}
	}
	if err := s.RecordFinal(r.ID, "late", policy.DispositionDeadlineCut, policy.StopDeadline); err != nil {
		t.Fatal(err)
	}
	if got := must(s.Run(r.ID)).get(t); got.Spent != 2 || got.Ledger.DeadlineCut != 1 {
		t.Errorf("run: got spent %d, ledger %+v, want 2 and 1 deadline cut", got.Spent, got.Ledger)
	}

	t.Run("the tenant refusing gives the run's retry back", func(t *testing.T) {
		must(s.SetBudget(policy.TenantBudget{Tenant: "poor", Capacity: 1, MinPerSecond: 0.0001})).get(t)
		r := must(s.OpenRun(policy.Run{Tenant: "poor", Pool: 5, Cutoff: e.clock.Now().Add(time.Hour)})).get(t)
		must(s.SpendRetry(policy.SpendRequest{RunID: r.ID})).get(t)
		got := must(s.SpendRetry(policy.SpendRequest{RunID: r.ID})).get(t)
		if got.Granted || got.RunRemaining != 4 || got.Stop != policy.StopBudgetExhausted {
			t.Errorf("retry refused by the tenant: got %+v, want refused with 4 left in the pool", got)
		}
	})
}

func TestOpenRunValidation(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	future := e.clock.Now().Add(time.Hour)
	must(s.OpenRun(policy.Run{ID: "taken", Tenant: "t", Pool: 1, Cutoff: future})).get(t)
	tests := []struct {
		name  string
		run   policy.Run
		want  error
		field string
	}{
		{"no pool", policy.Run{Tenant: "t", Cutoff: future}, breakerstore.ErrInvalid, "retry_pool"},
		{"cut-off now", policy.Run{Tenant: "t", Pool: 1, Cutoff: e.clock.Now()}, breakerstore.ErrInvalid, "cutoff_time"},
		{"no cut-off", policy.Run{Tenant: "t", Pool: 1}, breakerstore.ErrInvalid, "cutoff_time"},
		{"no tenant", policy.Run{Pool: 1, Cutoff: future}, breakerstore.ErrInvalid, "tenant"},
		{"NUL in id", policy.Run{ID: "a\x00b", Tenant: "t", Pool: 1, Cutoff: future}, breakerstore.ErrInvalid, "run_id"},
		{"taken id", policy.Run{ID: "taken", Tenant: "t", Pool: 1, Cutoff: future}, breakerstore.ErrExists, "taken"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.OpenRun(tt.run)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("OpenRun: got %v, want %v naming %s", err, tt.want, tt.field)
			}
		})
	}
	_, err := s.SpendRetry(policy.SpendRequest{RunID: "missing"})
	wantErr(t, "SpendRetry of an unknown run", err, breakerstore.ErrNotFound)
	_, err = s.SpendRetry(policy.SpendRequest{RunID: "taken", Tenant: "someone-else"})
	wantErr(t, "SpendRetry with another tenant's run", err, breakerstore.ErrInvalid)
}

func TestRunsListing(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	var ids []string
	for _, tenant := range []string{"a", "b", "a"} {
		e.clock.Advance(time.Second)
		r := must(s.OpenRun(policy.Run{Tenant: tenant, Pool: 1, Cutoff: e.clock.Now().Add(time.Hour)})).get(t)
		ids = append(ids, r.ID)
	}
	tests := []struct {
		name   string
		tenant string
		after  string
		limit  int
		want   []string
	}{
		{"all, by creation", "", "", 0, ids},
		{"one tenant", "a", "", 0, []string{ids[0], ids[2]}},
		{"paged", "", ids[0], 1, []string{ids[1]}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, r := range must(s.Runs(tt.tenant, tt.after, tt.limit)).get(t) {
				got = append(got, r.ID)
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRunsExpireAfterRetentionAndAreCapped(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) {
		o.MaxRuns = 2
		o.RunRetention = 24 * time.Hour
	})
	s := e.open()
	cutoff := e.clock.Now().Add(time.Hour)
	for _, id := range []string{"r1", "r2"} {
		if _, err := s.OpenRun(policy.Run{ID: id, Tenant: "acme", Pool: 3, Cutoff: cutoff}); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordFinal(id, "call-1", policy.DispositionSucceeded, policy.StopNone); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.OpenRun(policy.Run{ID: "r3", Tenant: "acme", Pool: 3, Cutoff: cutoff})
	if !errors.Is(err, breakerstore.ErrTooManyRuns) || !errors.Is(err, policy.ErrCapacity) {
		t.Fatalf("third run with a cap of 2: got %v, want ErrTooManyRuns", err)
	}
	// A day after the cut-off the runs are kept; past cut-off + retention
	// they go, from memory and disk, and make room.
	e.clock.Advance(24*time.Hour + 30*time.Minute)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Run("r1"); err != nil {
		t.Fatalf("r1 inside its retention: %v", err)
	}
	e.clock.Advance(time.Hour)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Run("r1"); !errors.Is(err, breakerstore.ErrNotFound) {
		t.Errorf("r1 past its retention: got %v, want ErrNotFound", err)
	}
	if _, err := s.OpenRun(policy.Run{ID: "r3", Tenant: "acme", Pool: 3, Cutoff: e.clock.Now().Add(time.Hour)}); err != nil {
		t.Errorf("a run after the old ones expired: %v", err)
	}
	s = e.reopen(s)
	if _, err := s.Run("r2"); !errors.Is(err, breakerstore.ErrNotFound) {
		t.Errorf("r2 after a reopen: got %v, want it gone from disk too", err)
	}
	if _, err := s.Run("r3"); err != nil {
		t.Errorf("r3 after a reopen: %v", err)
	}
}

func TestTenantCap(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.MaxTenants = 2 })
	s := e.open()
	for _, tenant := range []string{"a", "b"} {
		if _, err := s.SpendRetry(policy.SpendRequest{Tenant: tenant}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.SpendRetry(policy.SpendRequest{Tenant: "c"})
	if !errors.Is(err, breakerstore.ErrTooManyTenants) || !strings.Contains(err.Error(), "cap 2") {
		t.Errorf("a third tenant with a cap of 2: got %v, want ErrTooManyTenants naming the cap", err)
	}
	if _, err := s.SpendRetry(policy.SpendRequest{Tenant: "a"}); err != nil {
		t.Errorf("a known tenant: %v", err)
	}
}
