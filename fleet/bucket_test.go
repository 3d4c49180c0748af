package fleet_test

import (
	"testing"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

func TestBucketRules(t *testing.T) {
	budget := policy.TenantBudget{Capacity: 3, DepositRatio: 0.5, MinPerSecond: 1, RetryCost: 1, TimeoutCost: 2}
	dry := budget
	dry.DryRun = true
	type op struct {
		at      int64 // seconds
		kind    string
		timeout bool
		n       int
		granted bool
		tokens  float64
	}
	tests := []struct {
		name   string
		budget policy.TenantBudget
		ops    []op
	}{
		{"retries withdraw until empty, then refuse", budget, []op{
			{kind: "withdraw", granted: true, tokens: 2},
			{kind: "withdraw", timeout: true, granted: true, tokens: 0},
			{kind: "withdraw", granted: false, tokens: 0},
		}},
		{"the floor refills over time up to capacity", budget, []op{
			{kind: "withdraw", timeout: true, granted: true, tokens: 1},
			{at: 1, kind: "withdraw", granted: true, tokens: 1},
			{at: 100, kind: "withdraw", granted: true, tokens: 2},
		}},
		{"successes deposit a fraction, capped at capacity", budget, []op{
			{kind: "withdraw", timeout: true, granted: true, tokens: 1},
			{kind: "deposit", n: 2, tokens: 2},
			{kind: "deposit", n: 10, tokens: 3},
		}},
		{"dry run grants what it would refuse; tokens stop at zero", dry, []op{
			{kind: "withdraw", timeout: true, granted: true, tokens: 1},
			{kind: "withdraw", timeout: true, granted: true, tokens: 0},
			{kind: "withdraw", granted: true, tokens: 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := fleet.NewBucket(&tt.budget, 0)
			for i, o := range tt.ops {
				now := o.at * sec
				switch o.kind {
				case "withdraw":
					if w := k.Withdraw(now, &tt.budget, o.timeout); w.Granted != o.granted {
						t.Fatalf("op %d: Withdraw = %+v, want granted %v", i, w, o.granted)
					}
				case "deposit":
					k.Deposit(now, &tt.budget, o.n)
				}
				if k.Tokens != o.tokens || k.Tokens < 0 {
					t.Fatalf("op %d: tokens %v, want %v", i, k.Tokens, o.tokens)
				}
			}
		})
	}
}

func TestBucketRebudget(t *testing.T) {
	small := policy.TenantBudget{Capacity: 10, MinPerSecond: 0, RetryCost: 1, TimeoutCost: 1}
	big := small
	big.Capacity = 100
	k := fleet.NewBucket(&small, 0)
	k.Rebudget(0, &small, &big)
	if k.Tokens != 100 {
		t.Errorf("a full bucket under a larger budget: %v tokens, want 100 (full stays full)", k.Tokens)
	}
	k.Withdraw(0, &big, false)
	k.Rebudget(0, &big, &small)
	if k.Tokens != 10 {
		t.Errorf("a bucket moved to a smaller budget: %v tokens, want 10 (capped)", k.Tokens)
	}
	if got := k.TokensAt(sec, &small); got != 10 {
		t.Errorf("TokensAt: %v, want 10", got)
	}
}
