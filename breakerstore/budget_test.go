package breakerstore_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

func TestValidateBudget(t *testing.T) {
	ok := breakerstore.DefaultTenantBudget()
	tests := []struct {
		name  string
		edit  func(b *policy.TenantBudget)
		field string // "" when valid
	}{
		{"default is valid", func(*policy.TenantBudget) {}, ""},
		{"zero deposit and refill are valid", func(b *policy.TenantBudget) { b.DepositRatio, b.MinPerSecond = 0, 0 }, ""},
		{"zero capacity", func(b *policy.TenantBudget) { b.Capacity = 0 }, "capacity"},
		{"infinite capacity", func(b *policy.TenantBudget) { b.Capacity = math.Inf(1) }, "capacity"},
		{"NaN capacity", func(b *policy.TenantBudget) { b.Capacity = math.NaN() }, "capacity"},
		{"deposit ratio above 1", func(b *policy.TenantBudget) { b.DepositRatio = 1.5 }, "deposit_ratio"},
		{"NaN deposit ratio", func(b *policy.TenantBudget) { b.DepositRatio = math.NaN() }, "deposit_ratio"},
		{"negative refill", func(b *policy.TenantBudget) { b.MinPerSecond = -1 }, "min_retries_per_second"},
		{"infinite refill", func(b *policy.TenantBudget) { b.MinPerSecond = math.Inf(1) }, "min_retries_per_second"},
		{"zero retry cost", func(b *policy.TenantBudget) { b.RetryCost = 0 }, "retry_cost"},
		{"timeout cheaper than a retry", func(b *policy.TenantBudget) { b.TimeoutCost = 0.5 }, "timeout_cost"},
		{"NaN timeout cost", func(b *policy.TenantBudget) { b.TimeoutCost = math.NaN() }, "timeout_cost"},
		{"NUL in tenant", func(b *policy.TenantBudget) { b.Tenant = "a\x00" }, "tenant"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := ok
			tt.edit(&b)
			err := breakerstore.ValidateBudget(b)
			switch {
			case tt.field == "" && err != nil:
				t.Errorf("ValidateBudget() = %v, want nil", err)
			case tt.field != "" && (!errors.Is(err, breakerstore.ErrInvalid) || !strings.Contains(err.Error(), tt.field+":")):
				t.Errorf("ValidateBudget() = %v, want ErrInvalid naming %s", err, tt.field)
			}
		})
	}
}

func TestBudgetRules(t *testing.T) {
	tests := []struct {
		name   string
		budget *policy.TenantBudget                              // nil: the default budget
		run    func(t *testing.T, e *env, s *breakerstore.Store) // ends with the tenant's status checked below
		want   policy.BudgetStatus
	}{
		{
			name: "default budget starts full",
			run: func(t *testing.T, e *env, s *breakerstore.Store) {
				got := must(s.SpendRetry(policy.SpendRequest{Tenant: "t"})).get(t)
				if !got.Granted || got.TenantTokens != 99 {
					t.Errorf("first retry: got %+v, want granted with 99 tokens left", got)
				}
			},
			want: policy.BudgetStatus{Tokens: 99, Granted: 1, IsDefault: true},
		},
		{
			name: "a timeout costs timeout_cost",
			run: func(t *testing.T, e *env, s *breakerstore.Store) {
				must(s.SpendRetry(policy.SpendRequest{Tenant: "t", Timeout: true})).get(t)
			},
			want: policy.BudgetStatus{Tokens: 98, Granted: 1, IsDefault: true},
		},
		{
			name:   "refused when empty",
			budget: &policy.TenantBudget{Capacity: 2, MinPerSecond: 0.0001},
			run: func(t *testing.T, e *env, s *breakerstore.Store) {
				for i, want := range []bool{true, true, false} {
					got := must(s.SpendRetry(policy.SpendRequest{Tenant: "t"})).get(t)
					if got.Granted != want {
						t.Fatalf("retry %d: got %+v, want granted=%v", i, got, want)
					}
					if !want && (got.Stop != policy.StopBudgetExhausted || got.Disposition != policy.DispositionDeadLetter) {
						t.Errorf("refusal: got %+v, want BUDGET_EXHAUSTED / DEAD_LETTER", got)
					}
				}
			},
			want: policy.BudgetStatus{Tokens: 0, Granted: 2, Refused: 1},
		},
		{
			name:   "a timeout needs timeout_cost tokens",
			budget: &policy.TenantBudget{Capacity: 3, MinPerSecond: 0.0001, TimeoutCost: 2},
			run: func(t *testing.T, e *env, s *breakerstore.Store) {
				must(s.SpendRetry(policy.SpendRequest{Tenant: "t", Timeout: true})).get(t)
				if got := must(s.SpendRetry(policy.SpendRequest{Tenant: "t", Timeout: true})).get(t); got.Granted {
					t.Errorf("timeout retry with 1 token: got granted, want refused")
				}
				must(s.SpendRetry(policy.SpendRequest{Tenant: "t"})).get(t)
			},
			want: policy.BudgetStatus{Tokens: 0, Granted: 2, Refused: 1},
		},
		{
			name:   "refill floor",
			budget: &policy.TenantBudget{Capacity: 10, MinPerSecond: 2},
			run: func(t *testing.T, e *env, s *breakerstore.Store) {
				for range 10 {
					must(s.SpendRetry(policy.SpendRequest{Tenant: "t"})).get(t)
				}
				e.clock.Advance(time.Second)
				for i, want := range []bool{true, true, false} {
					if got := must(s.SpendRetry(policy.SpendRequest{Tenant: "t"})).get(t); got.Granted != want {
						t.Fatalf("retry %d a second after emptying: got granted=%v, want %v", i, got.Granted, want)
					}
				}
			},
			want: policy.BudgetStatus{Tokens: 0, Granted: 12, Refused: 1},
		},
		{
			name:   "refill stops at capacity",
			budget: &policy.TenantBudget{Capacity: 10, MinPerSecond: 2},
			run: func(t *testing.T, e *env, s *breakerstore.Store) {
				must(s.SpendRetry(policy.SpendRequest{Tenant: "t"})).get(t)
				e.clock.Advance(time.Hour)
			},
			want: policy.BudgetStatus{Tokens: 10, Granted: 1},
		},
		{
			name:   "successes deposit up to capacity",
			budget: &policy.TenantBudget{Capacity: 4, MinPerSecond: 0.0001, DepositRatio: 0.5},
			run: func(t *testing.T, e *env, s *breakerstore.Store) {
				for range 4 {
					must(s.SpendRetry(policy.SpendRequest{Tenant: "t"})).get(t)
				}
				s.Deposit("t", 3) // 1.5 tokens
				must(s.SpendRetry(policy.SpendRequest{Tenant: "t"})).get(t)
				s.Deposit("t", 1000)
			},
			want: policy.BudgetStatus{Tokens: 4, Granted: 5},
		},
		{
			name:   "dry run grants what it would refuse",
			budget: &policy.TenantBudget{Capacity: 1, MinPerSecond: 0.0001, DryRun: true},
			run: func(t *testing.T, e *env, s *breakerstore.Store) {
				for i, want := range []bool{false, true, true} {
					got := must(s.SpendRetry(policy.SpendRequest{Tenant: "t"})).get(t)
					if !got.Granted || got.DryRunRefused != want || got.TenantTokens != 0 {
						t.Errorf("retry %d: got %+v, want granted, dry-run refused=%v, 0 tokens", i, got, want)
					}
				}
			},
			want: policy.BudgetStatus{Tokens: 0, Granted: 3, DryRunRefusals: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			s := e.open()
			if tt.budget != nil {
				b := *tt.budget
				b.Tenant = "t"
				must(s.SetBudget(b)).get(t)
			}
			tt.run(t, e, s)
			got := must(s.Budget("t")).get(t)
			if math.Abs(got.Tokens-tt.want.Tokens) > 1e-3 || got.Granted != tt.want.Granted || got.Refused != tt.want.Refused ||
				got.DryRunRefusals != tt.want.DryRunRefusals || got.IsDefault != tt.want.IsDefault {
				t.Errorf("status: got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestBudgetAdmin(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) {
		o.DefaultBudget = policy.TenantBudget{Capacity: 50}
	})
	s := e.open()
	_, err := s.Budget("nobody")
	wantErr(t, "Budget of an unknown tenant", err, breakerstore.ErrNotFound)
	wantErr(t, "DeleteBudget of an unknown tenant", s.DeleteBudget("nobody"), breakerstore.ErrNotFound)
	_, err = s.SetBudget(policy.TenantBudget{Tenant: "t", Capacity: math.NaN()})
	wantErr(t, "SetBudget(NaN capacity)", err, breakerstore.ErrInvalid)
	_, err = s.SetBudget(policy.TenantBudget{Capacity: 3})
	wantErr(t, "SetBudget without a tenant", err, breakerstore.ErrInvalid)

	got := must(s.SetBudget(policy.TenantBudget{Tenant: "t", RetryCost: 5})).get(t)
	want := policy.TenantBudget{Tenant: "t", Capacity: 50, DepositRatio: 0.2, MinPerSecond: 5, RetryCost: 5, TimeoutCost: 5}
	if got != want {
		t.Errorf("SetBudget with zero fields: got %+v, want %+v", got, want)
	}
	must(s.SetBudget(policy.TenantBudget{Tenant: "u", Capacity: 7})).get(t)
	must(s.SpendRetry(policy.SpendRequest{Tenant: "v"})).get(t) // state, no explicit budget

	list := must(s.Budgets("", 0)).get(t)
	if len(list) != 2 || list[0].Budget.Tenant != "t" || list[1].Budget.Tenant != "u" || list[1].Tokens != 7 {
		t.Errorf("Budgets: got %+v, want explicit t and u (full, 7 tokens)", list)
	}
	if page := must(s.Budgets("t", 1)).get(t); len(page) != 1 || page[0].Budget.Tenant != "u" {
		t.Errorf("Budgets after t: got %+v, want u", page)
	}

	s = e.reopen(s)
	if got := must(s.Budget("t")).get(t); got.Budget != want || got.IsDefault {
		t.Errorf("budget after reopen: got %+v, want %+v", got.Budget, want)
	}
	if err := s.DeleteBudget("t"); err != nil {
		t.Fatal(err)
	}
	s = e.reopen(s)
	if got := must(s.Budget("t")).get(t); !got.IsDefault || got.Budget.Capacity != 50 || got.Tokens != 50 {
		t.Errorf("budget after delete: got %+v, want the full default", got)
	}
}

// TestTenantIsolation floods one tenant with failures and retries; the
// other's budget and breakers are untouched.
func TestTenantIsolation(t *testing.T) {
	s := newEnv(t).open()
	noisy := policy.BreakerKey{Tenant: "noisy", Target: "api"}
	record(t, s, noisy, consecutive, policy.ResultTransientFailure, 1000)
	for range 1000 {
		must(s.SpendRetry(policy.SpendRequest{Tenant: "noisy", Timeout: true})).get(t)
	}
	if got := must(s.Budget("noisy")).get(t); got.Refused == 0 || got.Tokens > 1 {
		t.Fatalf("noisy tenant: got %+v, want its budget spent", got)
	}

	if _, err := s.Breaker(policy.BreakerKey{Tenant: "quiet", Target: "api"}); !errors.Is(err, breakerstore.ErrNotFound) {
		t.Errorf("quiet tenant's breaker: got %v, want none", err)
	}
	if res := must(s.Admit(policy.BreakerKey{Tenant: "quiet", Target: "api"}, consecutive)).get(t); !res.Admitted {
		t.Errorf("quiet tenant's Admit: got %+v, want admitted", res)
	}
	if _, err := s.Budget("quiet"); !errors.Is(err, breakerstore.ErrNotFound) {
		t.Errorf("quiet tenant's budget: got %v, want no state", err)
	}
	if got := must(s.SpendRetry(policy.SpendRequest{Tenant: "quiet"})).get(t); !got.Granted || got.TenantTokens != 99 {
		t.Errorf("quiet tenant's retry: got %+v, want granted from a full bucket", got)
	}
}

// TestSpendRetryNeverOverspends is a property test: whatever the
// interleaving of concurrent spends, deposits and clock moves, a run's pool
// is never overspent, tokens never go below 0, and the tokens granted never
// exceed capacity + deposits + refill.
func TestSpendRetryNeverOverspends(t *testing.T) {
	for seed := range uint64(4) {
		t.Run("seed "+string(rune('0'+seed)), func(t *testing.T) {
			e := newEnv(t)
			s := e.open()
			budget := policy.TenantBudget{Tenant: "t", Capacity: 20, DepositRatio: 0.5, MinPerSecond: 2, RetryCost: 1, TimeoutCost: 2}
			must(s.SetBudget(budget)).get(t)
			const pool = 60
			run := must(s.OpenRun(policy.Run{Tenant: "t", Pool: pool, Cutoff: e.clock.Now().Add(24 * time.Hour)})).get(t)
			start := e.clock.Now()

			var (
				mu         sync.Mutex
				grantedRun uint64
				spentCost  float64
				deposits   atomic.Int64
			)
			var wg sync.WaitGroup
			for g := range 16 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(seed, uint64(g)))
					for range 400 {
						switch p := rng.IntN(100); {
						case p < 60:
							req := policy.SpendRequest{Tenant: "t", Timeout: rng.IntN(3) == 0}
							if rng.IntN(2) == 0 {
								req.RunID = run.ID
							}
							got, err := s.SpendRetry(req)
							if err != nil {
								t.Error(err)
								return
							}
							if got.TenantTokens < 0 {
								t.Errorf("tokens went below 0: %v", got.TenantTokens)
							}
							if got.Granted {
								cost := budget.RetryCost
								if req.Timeout {
									cost = budget.TimeoutCost
								}
								mu.Lock()
								spentCost += cost
								if req.RunID != "" {
									grantedRun++
								}
								mu.Unlock()
							}
						case p < 85:
							n := 1 + rng.IntN(3)
							deposits.Add(int64(n))
							s.Deposit("t", n)
						default:
							e.clock.Advance(time.Duration(rng.IntN(200)) * time.Millisecond)
						}
					}
				})
			}
			wg.Wait()

			r := must(s.Run(run.ID)).get(t)
			if r.Spent > pool || r.Spent != grantedRun {
				t.Errorf("run: spent %d, granted %d, pool %d; want spent == granted <= pool", r.Spent, grantedRun, pool)
			}
			st := must(s.Budget("t")).get(t)
			elapsed := e.clock.Now().Sub(start).Seconds()
			bound := budget.Capacity + budget.DepositRatio*float64(deposits.Load()) + budget.MinPerSecond*elapsed
			if st.Tokens < 0 || spentCost > bound+1e-6 {
				t.Errorf("tokens %v, spent %v; want tokens >= 0 and spent <= %v (capacity + deposits + refill)", st.Tokens, spentCost, bound)
			}
			if st.Refused == 0 {
				t.Logf("seed %d never exhausted the budget; the bound was not exercised", seed)
			}
		})
	}
}
