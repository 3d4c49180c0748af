package redisstore

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// budgetRecord is the JSON of an explicit budget in policyd:budgets, with
// the API's field names (breakerstore's record).
type budgetRecord struct {
	Tenant       string  `json:"tenant"`
	Capacity     float64 `json:"capacity"`
	DepositRatio float64 `json:"deposit_ratio"`
	MinPerSecond float64 `json:"min_retries_per_second"`
	RetryCost    float64 `json:"retry_cost"`
	TimeoutCost  float64 `json:"timeout_cost"`
	DryRun       bool    `json:"dry_run"`
}

// budgetOf returns tenant's budget: the explicit one this replica has
// cached, else the default.
func (s *Store) budgetOf(tenant string) (policy.TenantBudget, bool) {
	if b, ok := s.admin.budget(tenant); ok {
		return b, true
	}
	b := s.defBudget
	b.Tenant = tenant
	return b, false
}

// shareGrace is how many heartbeats a replica out of the live set must
// have been silent before its shares are forfeited (see degraded).
const shareGrace = 10

// SpendRetry withdraws one retry, atomically (one call of policyd_spend)
// from the run's pool when req.RunID is set and from the tenant's bucket:
// past the run's cut-off the retry is refused with StopDeadline, with its
// pool spent with StopBudgetExhausted, then without enough tokens with
// StopBudgetExhausted unless the budget is in dry run. The pool is never
// overspent and the tokens never go below zero, across all replicas and
// with their grants in degraded mode counted: a spend takes what no
// replica holds as its share first, then this replica's own, and never
// another's (see degraded), so a replica is refused when what is left is
// all in other replicas' shares. Each call sets this replica's shares
// again.
func (s *Store) SpendRetry(req policy.SpendRequest) (policy.Spend, error) {
	if err := s.check(); err != nil {
		return policy.Spend{}, err
	}
	tenant := req.Tenant
	if req.RunID != "" {
		owner, err := s.runTenant(req.RunID)
		if err != nil {
			return policy.Spend{}, err
		}
		if tenant == "" {
			tenant = owner
		} else if tenant != owner {
			return policy.Spend{}, invalid("run_id", "the run belongs to another tenant")
		}
	}
	if tenant == "" {
		return policy.Spend{}, invalid("tenant", "must not be empty")
	}
	b, _ := s.budgetOf(tenant)
	if !s.health.up() {
		return s.degraded.spend(tenant, &b, req.Timeout, req.RunID), nil
	}
	if s.degraded.owes(tenant, req.RunID) {
		// The engine is charged what this replica granted while it did not
		// answer before it grants from the same tokens again.
		s.chargeOwed(tenant, req.RunID)
	}
	sa := s.degraded.shareArgs(s.id, tenant, req.RunID, shareGrace*s.opts.Heartbeat)
	ctx, cancel := s.call()
	defer cancel()
	_, sp, sh, err := spendCall(ctx, s.lib, tenant, &b, req.Timeout, req.RunID, &sa)
	if errors.Is(err, ErrUnavailable) {
		return s.degraded.spend(tenant, &b, req.Timeout, req.RunID), nil
	}
	if err == nil {
		s.degraded.saw(tenant, req.RunID, sh)
	}
	return sp, err
}

// Deposit credits the tenant's bucket DepositRatio tokens per success, up
// to its capacity (one call of policyd_deposit). A failure is logged: a
// deposit lost costs the tenant a fraction of a retry.
func (s *Store) Deposit(tenant string, successes int) {
	if s.check() != nil || successes <= 0 || tenant == "" {
		return
	}
	b, _ := s.budgetOf(tenant)
	ctx, cancel := s.call()
	defer cancel()
	if _, _, err := depositCall(ctx, s.lib, tenant, &b, successes); err != nil {
		s.log.Warn("redisstore: deposit lost", "tenant", tenant, "successes", successes, "err", err)
	}
}

// ValidateBudget checks every field of b by fleet.CheckBudget's rules,
// naming the first bad one, then the tenant name.
func ValidateBudget(b policy.TenantBudget) error {
	if fe := fleet.CheckBudget(b); fe != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, fe)
	}
	return checkName("tenant", b.Tenant, false)
}

// SetBudget stores tenant b.Tenant's explicit budget (zero numbers take
// the default's) and tells every replica; the bucket keeps its tokens,
// capped at the new capacity at its next change.
func (s *Store) SetBudget(b policy.TenantBudget) (policy.TenantBudget, error) {
	if err := s.check(); err != nil {
		return policy.TenantBudget{}, err
	}
	b = fleet.FillBudget(b, s.defBudget)
	if err := ValidateBudget(b); err != nil {
		return policy.TenantBudget{}, err
	}
	v, err := json.Marshal(budgetRecord(b))
	if err != nil {
		return policy.TenantBudget{}, fmt.Errorf("redisstore: encode budget: %w", err)
	}
	if err := s.adminWrite(changeBudget, b.Tenant, "", func(p redis.Pipeliner) {
		p.HSet(s.ctx, keyBudgets, b.Tenant, v)
	}); err != nil {
		return policy.TenantBudget{}, err
	}
	s.admin.setBudget(b.Tenant, &b)
	return b, nil
}

// Budget returns tenant's budget and live counters, or ErrNotFound for a
// tenant with neither an explicit budget nor a bucket.
func (s *Store) Budget(tenant string) (policy.BudgetStatus, error) {
	if err := s.check(); err != nil {
		return policy.BudgetStatus{}, err
	}
	b, explicit := s.budgetOf(tenant)
	ctx, cancel := s.call()
	defer cancel()
	k, stored, err := readBucket(ctx, s.c, tenant)
	if err != nil {
		return policy.BudgetStatus{}, err
	}
	if !stored && !explicit {
		return policy.BudgetStatus{}, fmt.Errorf("%w: budget of tenant %q", ErrNotFound, tenant)
	}
	st := policy.BudgetStatus{Budget: b, Tokens: b.Capacity, IsDefault: !explicit}
	if stored {
		now, err := s.c.Time(ctx).Result()
		if err != nil {
			return policy.BudgetStatus{}, fmt.Errorf("redisstore: TIME: %w", err)
		}
		tokens := k.tokens
		if n := now.UnixMicro(); n > k.last {
			tokens += b.MinPerSecond * float64(n-k.last) / 1e6
		}
		st.Tokens = min(max(tokens, 0), b.Capacity)
		st.Granted, st.Refused, st.DryRunRefusals = k.granted, k.refused, k.dry
	}
	return st, nil
}

// Budgets returns up to limit explicit budgets (all when limit <= 0)
// sorted by tenant, after the tenant after.
func (s *Store) Budgets(after string, limit int) ([]policy.BudgetStatus, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	tenants := s.admin.budgetTenants()
	var out []policy.BudgetStatus
	for _, t := range tenants {
		if after != "" && t <= after {
			continue
		}
		if limit > 0 && len(out) == limit {
			break
		}
		st, err := s.Budget(t)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// DeleteBudget removes tenant's explicit budget (the default applies
// again), or returns ErrNotFound.
func (s *Store) DeleteBudget(tenant string) error {
	if err := s.check(); err != nil {
		return err
	}
	if _, ok := s.admin.budget(tenant); !ok {
		ctx, cancel := s.call()
		defer cancel()
		if n, err := s.c.HExists(ctx, keyBudgets, tenant).Result(); err != nil || !n {
			if err != nil {
				return fmt.Errorf("redisstore: read budget: %w", err)
			}
			return fmt.Errorf("%w: budget of tenant %q", ErrNotFound, tenant)
		}
	}
	if err := s.adminWrite(changeBudget, tenant, "", func(p redis.Pipeliner) {
		p.HDel(s.ctx, keyBudgets, tenant)
	}); err != nil {
		return err
	}
	s.admin.setBudget(tenant, nil)
	return nil
}
