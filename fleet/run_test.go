package fleet_test

import (
	"strings"
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
		refused string // the refusal's rule starts so
		want    policy.Ledger
	}{
		{"a", succeeded, true, true, "", policy.Ledger{Succeeded: 1}},
		{"a", succeeded, false, true, "", policy.Ledger{Succeeded: 1}},
		{"b", budget, true, true, "", policy.Ledger{Succeeded: 1, DeadLetterBudget: 1}},
		// The first final disposition of a call id wins (DESIGN.md's
		// invariant table): a different one later is refused.
		{"b", succeeded, false, true, "already final as DEAD_LETTER (BUDGET_EXHAUSTED)", policy.Ledger{Succeeded: 1, DeadLetterBudget: 1}},
		{"a", budget, false, true, "already final as SUCCEEDED;", policy.Ledger{Succeeded: 1, DeadLetterBudget: 1}},
		{"b", budget, false, true, "", policy.Ledger{Succeeded: 1, DeadLetterBudget: 1}},
		{"c", fleet.Final{}, false, false, "", policy.Ledger{Succeeded: 1, DeadLetterBudget: 1}},
		{"d", fleet.Final{Disposition: policy.DispositionDeadLetter}, true, true, "", policy.Ledger{Succeeded: 1, DeadLetterBudget: 1, DeadLetterExhausted: 1}},
	}
	for i, s := range steps {
		_, changed, ok, refused := r.RecordFinal(s.call, s.f)
		rule := ""
		if refused != nil {
			rule = refused.Rule
			if refused.Field != "final_disposition" {
				t.Errorf("step %d: refused naming %q, want final_disposition", i, refused.Field)
			}
		}
		if changed != s.changed || ok != s.ok || !strings.HasPrefix(rule, s.refused) || (s.refused == "") != (refused == nil) || r.Ledger != s.want {
			t.Errorf("step %d: RecordFinal(%q, %+v) = changed %v ok %v refused %q ledger %+v; want %v %v %q %+v",
				i, s.call, s.f, changed, ok, rule, r.Ledger, s.changed, s.ok, s.refused, s.want)
		}
	}
}
