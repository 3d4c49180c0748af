package fleet_test

import (
	"testing"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

func TestBreakerResult(t *testing.T) {
	counted := consecutive(3)
	counted.CountPushback = true
	def := consecutive(3)
	tests := []struct {
		name   string
		c      policy.Category
		hinted bool
		cfg    *policy.BreakerConfig
		want   policy.Result
	}{
		{"a transient failure counts", policy.CategoryTransient, false, &def, policy.ResultTransientFailure},
		{"a transient failure with a hint is pushback", policy.CategoryTransient, true, &def, policy.ResultPushback},
		{"count_pushback counts it", policy.CategoryTransient, true, &counted, policy.ResultTransientFailure},
		{"a terminal failure means the upstream answered", policy.CategoryTerminal, true, &def, policy.ResultTerminal},
		{"so does an unclassified one", policy.CategoryUnclassified, false, &def, policy.ResultTerminal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fleet.BreakerResult(tt.c, tt.hinted, tt.cfg); got != tt.want {
				t.Fatalf("BreakerResult = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPushbackCountsNothing(t *testing.T) {
	fail, push := policy.ResultTransientFailure, policy.ResultPushback
	closed, open, half := policy.BreakerClosed, policy.BreakerOpen, policy.BreakerHalfOpen
	cons := consecutive(3)
	t.Run("pushback neither trips nor breaks a chain", func(t *testing.T) {
		run(t, cons, []step{
			{at: 1, op: "record", r: push, permit: -1, want: closed, effect: 0},
			{at: 1, op: "record", r: push, permit: -1, want: closed},
			{at: 1, op: "record", r: push, permit: -1, want: closed},
			{at: 1, op: "record", r: push, permit: -1, want: closed},
			{at: 2, op: "record", r: fail, permit: -1, want: closed},
			{at: 2, op: "record", r: fail, permit: -1, want: closed},
			{at: 3, op: "record", r: push, permit: -1, want: closed},
			{at: 4, op: "record", r: fail, permit: -1, want: open},
		})
	})
	t.Run("a probe answered with pushback frees its permit and settles nothing", func(t *testing.T) {
		run(t, cons, []step{
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 1, op: "record", r: fail, permit: -1, want: open},
			{at: 11, op: "admit", want: half, admit: true, reason: fleet.ReasonProbe},
			{at: 11, op: "admit", want: half, admit: true, reason: fleet.ReasonProbe},
			{at: 11, op: "admit", want: half, reason: fleet.ReasonProbesTaken},
			{at: 12, op: "record", r: push, permit: 0, want: half, effect: fleet.Mutated},
			{at: 12, op: "admit", want: half, admit: true, reason: fleet.ReasonProbe},
		})
	})
}
