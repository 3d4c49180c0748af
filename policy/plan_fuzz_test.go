package policy_test

import (
	"errors"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// FuzzPlanBudgetRemaining plans partly spent, reserved windows from
// arbitrary numbers: PlanBudget answers a plan that keeps checkPlan's
// invariants (the schedule within the usable rest, the TTL beyond the
// remaining window, no attempt only with a reason) or a *FieldError.
func FuzzPlanBudgetRemaining(f *testing.F) {
	f.Add(int64(72*time.Hour), int64(71*time.Hour), 0.0, int64(30*time.Second), int64(0))
	f.Add(int64(72*time.Hour), int64(0), 0.5, int64(30*time.Second), int64(6*time.Hour))
	f.Add(int64(time.Minute), int64(2*time.Minute), 0.25, int64(time.Second), int64(0))
	f.Add(int64(time.Minute), int64(-time.Hour), 0.999999, int64(0), int64(1))
	f.Add(int64(time.Second), int64(time.Second-1), 1.0, int64(time.Second), int64(0))
	f.Add(int64(1<<63-2), int64(0), 1e-18, int64(0), int64(1)) // remaining * (1 - reserve) rounds to 2^63
	f.Fuzz(func(t *testing.T, window, since int64, reserve float64, attemptTimeout, margin int64) {
		now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
		in := policy.PlanInput{
			Window: time.Duration(window), Backoff: policy.Backoff{Base: time.Nanosecond, Factor: 2, Max: time.Duration(max(window, 1))},
			AttemptTimeout: time.Duration(attemptTimeout), TTLMargin: time.Duration(margin),
			Origin: now.Add(-time.Duration(since)), Now: now, Reserve: reserve,
		}
		got, err := policy.PlanBudget(in)
		if err != nil {
			if fe := (*policy.FieldError)(nil); !errors.As(err, &fe) {
				t.Fatalf("PlanBudget(%+v) error = %v (%T), want a *FieldError", in, err, err)
			}
			return
		}
		checkPlan(t, in, got)
	})
}
