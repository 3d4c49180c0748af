package fleet_test

import (
	"testing"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

func TestRunPoolNeverOverspent(t *testing.T) {
	r := fleet.NewRun(2, 100)
	for i := range 2 {
		if stop, _ := r.Refusal(int64(i)); stop != policy.StopNone {
			t.Fatalf("retry %d refused: %v", i, stop)
		}
		r.Spend()
	}
	if stop, d := r.Refusal(3); stop != policy.StopBudgetExhausted || d != policy.DispositionDeadLetter {
		t.Errorf("spent pool: %v %v, want BUDGET_EXHAUSTED DEAD_LETTER", stop, d)
	}
	if stop, d := r.Refusal(100); stop != policy.StopDeadline || d != policy.DispositionDeadlineCut {
		t.Errorf("at the cut-off: %v %v, want DEADLINE DEADLINE_CUT", stop, d)
	}
	if r.Remaining() != 0 {
		t.Errorf("remaining %d, want 0", r.Remaining())
	}
}

func TestRunLedger(t *testing.T) {
	r := fleet.NewRun(10, 100)
	succeeded := fleet.Final{Disposition: policy.DispositionSucceeded}
	budget := fleet.Final{Disposition: policy.DispositionDeadLetter, Stop: policy.StopBudgetExhausted}
	steps := []struct {
		call    string
		f       fleet.Final
		changed bool
		ok      bool
		want    policy.Ledger
	}{
		{"a", succeeded, true, true, policy.Ledger{Succeeded: 1}},
		{"a", succeeded, false, true, policy.Ledger{Succeeded: 1}},
		{"b", budget, true, true, policy.Ledger{Succeeded: 1, DeadLetterBudget: 1}},
		{"b", succeeded, true, true, policy.Ledger{Succeeded: 2}},
		{"c", fleet.Final{}, false, false, policy.Ledger{Succeeded: 2}},
		{"d", fleet.Final{Disposition: policy.DispositionDeadLetter}, true, true, policy.Ledger{Succeeded: 2, DeadLetterExhausted: 1}},
	}
	for i, s := range steps {
		_, changed, ok := r.RecordFinal(s.call, s.f)
		if changed != s.changed || ok != s.ok || r.Ledger != s.want {
			t.Errorf("step %d: RecordFinal(%q, %+v) = changed %v ok %v ledger %+v; want %v %v %+v",
				i, s.call, s.f, changed, ok, r.Ledger, s.changed, s.ok, s.want)
		}
	}
}
