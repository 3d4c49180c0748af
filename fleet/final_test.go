package fleet_test

import (
	"strings"
	"testing"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

func TestCheckFinal(t *testing.T) {
	fin := func(d policy.Disposition, s policy.StopReason) fleet.Final {
		return fleet.Final{Disposition: d, Stop: s}
	}
	exhausted := policy.Answer{Stop: policy.StopAttemptsExhausted, Disposition: policy.DispositionDeadLetter, Category: policy.CategoryTransient}
	retry := policy.Answer{Retry: true, Category: policy.CategoryTransient}
	tests := []struct {
		name string
		r    fleet.FinalReport
		rule string // a part of the rule broken; "" when it agrees
	}{
		{"SUCCEEDED with a success", fleet.FinalReport{Final: fin(policy.DispositionSucceeded, 0), Success: true}, ""},
		{"SUCCEEDED with a failure", fleet.FinalReport{Final: fin(policy.DispositionSucceeded, 0), Failure: policy.CategoryTransient}, "SUCCEEDED needs success"},
		{"the stop policyd decided", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopAttemptsExhausted), Decided: true, Answer: exhausted}, ""},
		{"another disposition than policyd's stop", fleet.FinalReport{Final: fin(policy.DispositionFailedTerminal, 0), Decided: true, Answer: exhausted}, "must be DEAD_LETTER"},
		{"another stop reason than policyd's", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopBudgetExhausted), Decided: true, Answer: exhausted}, "ATTEMPTS_EXHAUSTED"},
		{"FAILED_TERMINAL with a 4xx", fleet.FinalReport{Final: fin(policy.DispositionFailedTerminal, 0), Failure: policy.CategoryTerminal}, ""},
		{"FAILED_TERMINAL with a 503", fleet.FinalReport{Final: fin(policy.DispositionFailedTerminal, 0), Failure: policy.CategoryTransient}, "terminal classification"},
		{"FAILED_TERMINAL after a RETRY of a 503", fleet.FinalReport{Final: fin(policy.DispositionFailedTerminal, 0), Decided: true, Answer: retry}, "answered RETRY"},
		{"FAILED_TERMINAL of a failure told to NextDelay after an earlier attempt's RETRY (its answer lost)",
			fleet.FinalReport{Final: fin(policy.DispositionFailedTerminal, 0), Recorded: true, Decided: true, Answer: retry, Stale: true}, ""},
		{"DEAD_LETTER (DEADLINE) before the deadline, of a failure told to NextDelay after an earlier attempt's RETRY (its answer lost)",
			fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopDeadline), Recorded: true, Decided: true, Answer: retry, Stale: true,
				Deadline: 50, Now: 10}, ""},
		{"DEAD_LETTER with a 503", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopAttemptsExhausted), Failure: policy.CategoryTransient}, ""},
		{"DEAD_LETTER with nothing", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopAttemptsExhausted)}, "DEAD_LETTER needs"},
		{"DEAD_LETTER (BUDGET_EXHAUSTED) of a recorded failure, no answer remembered (a degraded stop)",
			fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopBudgetExhausted), Recorded: true}, ""},
		{"DEAD_LETTER (BUDGET_EXHAUSTED) with nothing recorded", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopBudgetExhausted)},
			"DEAD_LETTER needs"},
		{"DEAD_LETTER (BUDGET_EXHAUSTED) after policyd answered RETRY", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopBudgetExhausted),
			Recorded: true, Decided: true, Answer: policy.Answer{Retry: true, Category: policy.CategoryTerminal}}, "DEAD_LETTER needs"},
		{"DEAD_LETTER with a 4xx", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, 0), Failure: policy.CategoryTerminal}, "DEAD_LETTER needs"},
		{"CIRCUIT_OPEN with the breaker OPEN", fleet.FinalReport{Final: fin(policy.DispositionCircuitOpen, 0), HasBreaker: true, Breaker: policy.BreakerOpen}, ""},
		{"CIRCUIT_OPEN just after it closed", fleet.FinalReport{Final: fin(policy.DispositionCircuitOpen, 0), HasBreaker: true,
			Breaker: policy.BreakerClosed, Transitioned: true, Changed: 90, Now: 100, Horizon: 50}, ""},
		{"CIRCUIT_OPEN with a breaker never opened", fleet.FinalReport{Final: fin(policy.DispositionCircuitOpen, 0), HasBreaker: true,
			Breaker: policy.BreakerClosed, Now: 100, Horizon: 50}, "CIRCUIT_OPEN needs"},
		{"CIRCUIT_OPEN under a cool-down", fleet.FinalReport{Final: fin(policy.DispositionCircuitOpen, 0), HasBreaker: true,
			Breaker: policy.BreakerClosed, CooldownEnd: 120, Now: 100, Horizon: 50}, ""},
		{"CIRCUIT_OPEN long after a cool-down", fleet.FinalReport{Final: fin(policy.DispositionCircuitOpen, 0), HasBreaker: true,
			Breaker: policy.BreakerClosed, CooldownEnd: 10, Now: 100, Horizon: 50}, "CIRCUIT_OPEN needs"},
		{"CIRCUIT_OPEN with no breaker", fleet.FinalReport{Final: fin(policy.DispositionCircuitOpen, 0)}, "CIRCUIT_OPEN needs"},
		{"DEADLINE_CUT past the cut-off", fleet.FinalReport{Final: fin(policy.DispositionDeadlineCut, 0), Cutoff: 50, Now: 50}, ""},
		{"DEADLINE_CUT by a clock within the skew", fleet.FinalReport{Final: fin(policy.DispositionDeadlineCut, 0), Cutoff: 50, Now: 45, Skew: 5}, ""},
		{"DEADLINE_CUT past the deadline, before the cut-off", fleet.FinalReport{Final: fin(policy.DispositionDeadlineCut, 0), Deadline: 50, Cutoff: 500, Now: 60},
			"DEADLINE_CUT needs the run's cut-off"},
		{"DEADLINE_CUT without a run", fleet.FinalReport{Final: fin(policy.DispositionDeadlineCut, 0), Deadline: 50, Now: 60}, "DEADLINE_CUT needs a run's cut-off"},
		{"DEADLINE_CUT when a cool-down leaves no room before the cut-off", fleet.FinalReport{Final: fin(policy.DispositionDeadlineCut, 0), Cutoff: 50, Now: 40,
			CooldownEnd: 45, AttemptTimeout: 10}, ""},
		{"DEAD_LETTER (DEADLINE) past the deadline", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopDeadline), Deadline: 50, Cutoff: 500, Now: 60}, ""},
		{"DEAD_LETTER (DEADLINE) before the deadline", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopDeadline), Deadline: 50, Cutoff: 500, Now: 40},
			"DEAD_LETTER (DEADLINE) needs"},
		{"DEAD_LETTER (DEADLINE) when a cool-down leaves no room", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopDeadline), Deadline: 50, Now: 40,
			CooldownEnd: 45, AttemptTimeout: 10}, ""},
		{"DEAD_LETTER (DEADLINE) nearer than the attempt timeout", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopDeadline), Deadline: 50, Now: 45,
			AttemptTimeout: 10}, ""},
		{"DEAD_LETTER (DEADLINE) an attempt timeout away", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopDeadline), Deadline: 50, Now: 40,
			AttemptTimeout: 10}, "DEAD_LETTER (DEADLINE) needs"},
		{"DEAD_LETTER (DEADLINE) of a recorded failure, no answer remembered (a degraded stop)", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopDeadline),
			Recorded: true, Deadline: 50, Now: 40, AttemptTimeout: 5}, ""},
		{"DEAD_LETTER (DEADLINE) after policyd answered RETRY", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopDeadline),
			Recorded: true, Decided: true, Answer: retry, Deadline: 50, Now: 40, AttemptTimeout: 5}, "DEAD_LETTER (DEADLINE) needs"},
		{"DEAD_LETTER (DEADLINE) of a cancelled call without deadline", fleet.FinalReport{Final: fin(policy.DispositionDeadLetter, policy.StopDeadline), Cutoff: 500, Now: 40}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := fleet.CheckFinal(&tt.r)
			if (tt.rule == "") != (got == "") || !strings.Contains(got, tt.rule) {
				t.Errorf("CheckFinal = %q, want %q", got, tt.rule)
			}
		})
	}
}
