package fleet_test

import (
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

func TestGateRetry(t *testing.T) {
	p := policy.Default()
	p.AttemptTimeout = time.Second
	now := time.Unix(1_700_000_000, 0)
	retry := func(delay time.Duration, deadline time.Time) policy.Decision {
		return policy.Decision{Retry: true, Delay: delay, Deadline: deadline}
	}
	tests := []struct {
		name     string
		dec      policy.Decision
		breaker  policy.BreakerState
		cooldown time.Duration // from now, 0 for none
		hasRun   bool
		ask      bool
		spread   bool
		want     policy.Decision // Retry, Delay, Stop, Disposition
		checks   policy.Check
	}{
		{name: "closed: ask the budgets", dec: retry(time.Second, time.Time{}), breaker: policy.BreakerClosed,
			ask: true, want: policy.Decision{Retry: true, Delay: time.Second}, checks: policy.CheckTenantBudget},
		{name: "with a run: its pool too", dec: retry(time.Second, time.Time{}), breaker: policy.BreakerClosed, hasRun: true,
			ask: true, want: policy.Decision{Retry: true, Delay: time.Second}, checks: policy.CheckTenantBudget | policy.CheckRunBudget},
		{name: "open: circuit open", dec: retry(time.Second, time.Time{}), breaker: policy.BreakerOpen, cooldown: time.Minute,
			want: policy.Decision{Stop: policy.StopCircuitOpen, Disposition: policy.DispositionCircuitOpen}},
		{name: "a shorter cool-down changes nothing", dec: retry(time.Second, time.Time{}), breaker: policy.BreakerClosed,
			cooldown: time.Second / 2, ask: true, want: policy.Decision{Retry: true, Delay: time.Second}, checks: policy.CheckTenantBudget},
		{name: "a longer cool-down spreads the delay over it", dec: retry(time.Second, time.Time{}), breaker: policy.BreakerHalfOpen,
			cooldown: 10 * time.Second, ask: true, spread: true,
			want: policy.Decision{Retry: true, Delay: policy.SpreadHint(p.Pushback, 10*time.Second, 0.5)}, checks: policy.CheckTenantBudget},
		{name: "the spread delay no longer fits the deadline", dec: retry(time.Second, now.Add(5*time.Second)), breaker: policy.BreakerClosed,
			cooldown: 10 * time.Second, spread: true, want: policy.Decision{Stop: policy.StopDeadline, Disposition: policy.DispositionDeadLetter}},
		{name: "the attempt timeout is reserved", dec: retry(time.Second, now.Add(1500*time.Millisecond)), breaker: policy.BreakerClosed,
			want: policy.Decision{Stop: policy.StopDeadline, Disposition: policy.DispositionDeadLetter}},
		{name: "a stop is left alone", dec: policy.Decision{Stop: policy.StopTerminal, Disposition: policy.DispositionFailedTerminal},
			breaker: policy.BreakerOpen, want: policy.Decision{Stop: policy.StopTerminal, Disposition: policy.DispositionFailedTerminal}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cooldown int64
			if tt.cooldown > 0 {
				cooldown = now.Add(tt.cooldown).UnixNano()
			}
			dec := tt.dec
			ask, spread := fleet.GateRetry(&dec, &p, tt.breaker, cooldown, now.UnixNano(), tt.hasRun, 0.5)
			if ask != tt.ask || spread != tt.spread {
				t.Errorf("ask, spread = %v, %v, want %v, %v", ask, spread, tt.ask, tt.spread)
			}
			got := policy.Decision{Retry: dec.Retry, Delay: dec.Delay, Stop: dec.Stop, Disposition: dec.Disposition}
			if got != tt.want {
				t.Errorf("decision = %+v, want %+v", got, tt.want)
			}
			if dec.Checks != tt.checks {
				t.Errorf("checks = %v, want %v", dec.Checks, tt.checks)
			}
		})
	}
}

func TestSpentAndCutRun(t *testing.T) {
	now := time.Unix(1_700_000_000, 0).UnixNano()
	dec := policy.Decision{Retry: true, Delay: time.Second}
	fleet.Spent(&dec, &policy.Spend{Granted: true})
	if !dec.Retry || dec.Delay != time.Second {
		t.Fatalf("granted: %+v, want the retry unchanged", dec)
	}
	fleet.Spent(&dec, &policy.Spend{Stop: policy.StopBudgetExhausted, Disposition: policy.DispositionDeadLetter})
	if dec.Retry || dec.Delay != 0 || dec.Stop != policy.StopBudgetExhausted || dec.Disposition != policy.DispositionDeadLetter {
		t.Fatalf("refused: %+v, want a BUDGET_EXHAUSTED stop", dec)
	}
	tests := []struct {
		name     string
		dec      policy.Decision
		cutoff   int64
		cutBinds bool
		want     policy.Disposition
	}{
		{"no run", policy.Decision{Stop: policy.StopAttemptsExhausted, Disposition: policy.DispositionDeadLetter}, 0, false, policy.DispositionDeadLetter},
		{"before the cut-off", policy.Decision{Stop: policy.StopAttemptsExhausted, Disposition: policy.DispositionDeadLetter}, now + 1, false, policy.DispositionDeadLetter},
		{"past the cut-off", policy.Decision{Stop: policy.StopAttemptsExhausted, Disposition: policy.DispositionDeadLetter}, now, false, policy.DispositionDeadlineCut},
		{"a terminal failure past it", policy.Decision{Stop: policy.StopTerminal, Disposition: policy.DispositionFailedTerminal}, now, false, policy.DispositionFailedTerminal},
		{"the cut-off was the deadline", policy.Decision{Stop: policy.StopDeadline, Disposition: policy.DispositionDeadLetter}, now + 1, true, policy.DispositionDeadlineCut},
		{"the call's own deadline", policy.Decision{Stop: policy.StopDeadline, Disposition: policy.DispositionDeadLetter}, now + 1, false, policy.DispositionDeadLetter},
		{"a retry", policy.Decision{Retry: true}, now, true, policy.DispositionNone},
	}
	for _, tt := range tests {
		dec := tt.dec
		fleet.CutRun(&dec, tt.cutoff, now, tt.cutBinds)
		if dec.Disposition != tt.want {
			t.Errorf("%s: disposition %v, want %v", tt.name, dec.Disposition, tt.want)
		}
	}
}
