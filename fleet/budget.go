package fleet

import (
	"math"

	"github.com/policyd/policyd/policy"
)

// DefaultBudget is the budget of tenants without an explicit one when an
// engine is given none: capacity 100 tokens, deposit ratio 0.2 tokens per
// success, a floor of 5 tokens per second, retry cost 1 token, timeout
// cost 2 tokens. Every engine starts from these numbers.
func DefaultBudget() policy.TenantBudget {
	return policy.TenantBudget{Capacity: 100, DepositRatio: 0.2, MinPerSecond: 5, RetryCost: 1, TimeoutCost: 2}
}

// FillBudget gives zero numeric fields of b the values of def; a zero
// TimeoutCost becomes the larger of def's and b's RetryCost.
func FillBudget(b, def policy.TenantBudget) policy.TenantBudget {
	if b.Capacity == 0 {
		b.Capacity = def.Capacity
	}
	if b.DepositRatio == 0 {
		b.DepositRatio = def.DepositRatio
	}
	if b.MinPerSecond == 0 {
		b.MinPerSecond = def.MinPerSecond
	}
	if b.RetryCost == 0 {
		b.RetryCost = def.RetryCost
	}
	if b.TimeoutCost == 0 {
		b.TimeoutCost = max(def.TimeoutCost, b.RetryCost)
	}
	return b
}

// CheckBudget checks the numbers of b and returns the first bad field, nil
// when all are good: capacity (finite, > 0), deposit_ratio ([0, 1]),
// min_retries_per_second (finite, >= 0), retry_cost (finite, > 0),
// timeout_cost (finite, >= retry_cost). Amounts are tokens, the refill
// tokens per second; NaN and infinities are refused. The tenant name is
// the engine's to check.
func CheckBudget(b policy.TenantBudget) *policy.FieldError {
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	switch {
	case !finite(b.Capacity) || b.Capacity <= 0:
		return &policy.FieldError{Field: "capacity", Rule: "must be finite and > 0"}
	case !(b.DepositRatio >= 0 && b.DepositRatio <= 1):
		return &policy.FieldError{Field: "deposit_ratio", Rule: "must be in [0, 1]"}
	case !finite(b.MinPerSecond) || b.MinPerSecond < 0:
		return &policy.FieldError{Field: "min_retries_per_second", Rule: "must be finite and >= 0"}
	case !finite(b.RetryCost) || b.RetryCost <= 0:
		return &policy.FieldError{Field: "retry_cost", Rule: "must be finite and > 0"}
	case !finite(b.TimeoutCost) || b.TimeoutCost < b.RetryCost:
		return &policy.FieldError{Field: "timeout_cost", Rule: "must be finite and >= retry_cost"}
	}
	return nil
}

// ResolvePolicy picks the entry a call of tenant to target follows from
// the stored entries m: tenant and target, then target alone, then tenant
// alone. It returns the entry that matched (its scope says which), or nil
// when none does and the default policy applies. The entry is m's own,
// not a copy: a Policy is some hundred bytes, and a decision resolves
// one or more, so the caller copies once what it keeps.
func ResolvePolicy(m map[policy.PolicyScope]*policy.PolicyEntry, tenant, target string) *policy.PolicyEntry {
	if len(m) == 0 {
		return nil
	}
	if tenant != "" && target != "" {
		if e, ok := m[policy.PolicyScope{Tenant: tenant, Target: target}]; ok {
			return e
		}
	}
	if target != "" {
		if e, ok := m[policy.PolicyScope{Target: target}]; ok {
			return e
		}
	}
	if tenant != "" {
		if e, ok := m[policy.PolicyScope{Tenant: tenant}]; ok {
			return e
		}
	}
	return nil
}
