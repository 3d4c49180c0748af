package breakerstore

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// budgetRecord is the JSON record of the budgets bucket: a
// policy.TenantBudget with the field names of the API.
type budgetRecord struct {
	Tenant       string  `json:"tenant"`
	Capacity     float64 `json:"capacity"`
	DepositRatio float64 `json:"deposit_ratio"`
	MinPerSecond float64 `json:"min_retries_per_second"`
	RetryCost    float64 `json:"retry_cost"`
	TimeoutCost  float64 `json:"timeout_cost"`
	DryRun       bool    `json:"dry_run"`
}

// DefaultTenantBudget returns the budget of tenants without an explicit one
// when Options.DefaultBudget is zero: fleet.DefaultBudget. It is safe for
// concurrent use.
func DefaultTenantBudget() policy.TenantBudget { return fleet.DefaultBudget() }

// ValidateBudget checks every field of b by fleet.CheckBudget's rules and
// returns ErrInvalid (wrapping a *policy.FieldError) naming the first bad
// one, then the tenant name. It is a pure function, safe for concurrent use.
func ValidateBudget(b policy.TenantBudget) error {
	if fe := fleet.CheckBudget(b); fe != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, fe)
	}
	return checkName("tenant", b.Tenant, true)
}

// CheckBudget fills b's zero numbers with the store's default budget and
// validates the result, as SetBudget will; it writes nothing. Callers that
// write several budgets all or nothing check them all first.
func (s *Store) CheckBudget(b policy.TenantBudget) error {
	return ValidateBudget(fleet.FillBudget(b, s.defBudget))
}

// tokenBucket holds a tenant's budget state, whose rules live in
// fleet.Bucket; mu guards every field but tenant. Lock order: a run's mu,
// then a bucket's mu.
type tokenBucket struct {
	mu         sync.Mutex
	tenant     string
	cfg        *policy.TenantBudget // explicit budget; nil uses the store default
	v          fleet.Bucket
	lastActive int64 // not persisted
	dirty      bool
	deleted    bool
}

// config returns the bucket's budget; tb.mu must be held.
func (tb *tokenBucket) config(s *Store) *policy.TenantBudget {
	if tb.cfg != nil {
		return tb.cfg
	}
	return &s.defBudget
}

// SpendRetry withdraws one retry, atomically from the run's pool (when
// req.RunID is set) and the tenant's bucket. The run is checked first: past
// its cut-off the retry is refused with StopDeadline and
// DispositionDeadlineCut, with its pool spent with StopBudgetExhausted and
// DispositionDeadLetter; then the tenant: without enough tokens the retry is
// refused (StopBudgetExhausted, DispositionDeadLetter) and the run is not
// charged, unless the budget is in dry run. The pool is never overspent and
// the tokens never go below 0. SpendRetry returns ErrNotFound for an unknown
// run id, and is safe for concurrent use and allocation-free in SyncGroup.
func (s *Store) SpendRetry(req policy.SpendRequest) (policy.Spend, error) {
	return s.spendRetry(req, nil)
}

// spendRetry is SpendRetry; with SyncAlways the changes join p, when set,
// instead of being committed on their own.
func (s *Store) spendRetry(req policy.SpendRequest, p *pending) (policy.Spend, error) {
	if s.closed.Load() {
		return policy.Spend{}, ErrClosed
	}
	now := s.now()
	tenant := req.Tenant
	var r *run
	if req.RunID != "" {
		var ok bool
		if r, ok = s.runs.get(req.RunID); !ok {
			return policy.Spend{}, fmt.Errorf("%w: run %q", ErrNotFound, req.RunID)
		}
		if tenant == "" {
			tenant = r.hdr.Tenant
		} else if tenant != r.hdr.Tenant {
			return policy.Spend{}, invalid("run_id", "the run belongs to another tenant")
		}
	}
	if tenant == "" {
		return policy.Spend{}, invalid("tenant", "must not be empty")
	}
	var tb *tokenBucket
	for {
		var err error
		if tb, err = s.bucketFor(tenant, now); err != nil {
			return policy.Spend{}, err
		}
		if r != nil {
			r.mu.Lock()
		}
		tb.mu.Lock()
		if !tb.deleted {
			break
		}
		tb.mu.Unlock()
		if r != nil {
			r.mu.Unlock()
		}
	}
	var out policy.Spend
	runDirty, bucketDirty, charged := false, false, false
	if r != nil {
		out.HasRun = true
		out.Stop, out.Disposition = r.v.Refusal(now)
	}
	cfg := tb.config(s)
	tb.lastActive = now
	tb.v.Refill(now, cfg)
	if out.Stop == policy.StopNone {
		charged = true
		w := tb.v.Withdraw(now, cfg, req.Timeout)
		out.Granted, out.DryRunRefused = w.Granted, w.DryRunRefused
		if !w.Granted {
			out.Stop, out.Disposition = policy.StopBudgetExhausted, policy.DispositionDeadLetter
		}
		bucketDirty = tb.markDirty()
		if out.Granted && r != nil {
			r.v.Spend()
			runDirty = r.markDirty()
		}
	}
	out.TenantTokens = tb.v.Tokens
	if r != nil {
		out.RunRemaining = r.v.Remaining()
	}
	tb.mu.Unlock()
	if r != nil {
		r.mu.Unlock()
	}
	if !charged {
		return out, nil // refused by the run: nothing to commit
	}
	// Both join one commit: p's, or with SyncAlways and no p one of their own.
	own := p == nil && s.opts.Sync == SyncAlways
	if own {
		p = shared()
	}
	_ = s.changed(p, tb, bucketDirty)
	if out.Granted && r != nil {
		_ = s.changed(p, r, runDirty)
	}
	if own {
		if err := s.commit(p); err != nil {
			return policy.Spend{}, err
		}
	}
	return out, nil
}

// Deposit credits a tenant's bucket with DepositRatio tokens per success, up
// to its capacity. A tenant without state has a full bucket, so nothing
// happens. Deposit is safe for concurrent use; with SyncAlways a failed
// commit is logged and retried by the flusher.
func (s *Store) Deposit(tenant string, successes int) {
	s.deposit(tenant, successes, nil)
}

// deposit is Deposit; with SyncAlways the change joins p, when set,
// instead of being committed on its own.
func (s *Store) deposit(tenant string, successes int, p *pending) {
	if successes <= 0 || s.closed.Load() {
		return
	}
	tb, ok := s.buckets.get(tenant)
	if !ok {
		return
	}
	now := s.now()
	tb.mu.Lock()
	if tb.deleted {
		tb.mu.Unlock()
		return
	}
	tb.v.Deposit(now, tb.config(s), successes)
	tb.lastActive = now
	newlyDirty := tb.markDirty()
	tb.mu.Unlock()
	if err := s.changed(p, tb, newlyDirty); err != nil {
		s.log.Error("breakerstore: deposit not committed; retrying in the next flush", "tenant", tenant, "err", err)
	}
}

// Budget returns tenant's budget and bucket, or ErrNotFound when the tenant
// has neither an explicit budget nor any state. It is safe for concurrent use.
func (s *Store) Budget(tenant string) (policy.BudgetStatus, error) {
	if s.closed.Load() {
		return policy.BudgetStatus{}, ErrClosed
	}
	tb, ok := s.buckets.get(tenant)
	if !ok {
		return policy.BudgetStatus{}, fmt.Errorf("%w: budget of tenant %q", ErrNotFound, tenant)
	}
	now := s.now()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.deleted {
		return policy.BudgetStatus{}, fmt.Errorf("%w: budget of tenant %q", ErrNotFound, tenant)
	}
	return tb.status(s, now), nil
}

// status reports the bucket as of now without changing it; tb.mu must be held.
func (tb *tokenBucket) status(s *Store, now int64) policy.BudgetStatus {
	cfg := tb.config(s)
	b := *cfg
	b.Tenant = tb.tenant
	return policy.BudgetStatus{
		Budget:         b,
		Tokens:         tb.v.TokensAt(now, cfg),
		Granted:        tb.v.Granted,
		Refused:        tb.v.Refused,
		DryRunRefusals: tb.v.DryRun,
		IsDefault:      tb.cfg == nil,
	}
}

// Budgets returns up to limit explicit budgets (all when limit <= 0) sorted
// by tenant, starting after the tenant after. It is safe for concurrent use.
func (s *Store) Budgets(after string, limit int) ([]policy.BudgetStatus, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	now := s.now()
	var out []policy.BudgetStatus
	for _, tb := range s.buckets.values() {
		if tb.tenant <= after {
			continue
		}
		tb.mu.Lock()
		if !tb.deleted && tb.cfg != nil {
			out = append(out, tb.status(s, now))
		}
		tb.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b policy.BudgetStatus) int { return cmp.Compare(a.Budget.Tenant, b.Budget.Tenant) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// SetBudget sets tenant b.Tenant's explicit budget: zero numeric fields take
// the store's default budget (a zero TimeoutCost at least RetryCost), then
// the result must pass ValidateBudget. It is committed before SetBudget returns; the
// tenant's tokens are kept, capped at the new capacity (a new tenant starts
// full). It returns the budget in force and is safe for concurrent use.
func (s *Store) SetBudget(b policy.TenantBudget) (policy.TenantBudget, error) {
	if s.closed.Load() {
		return policy.TenantBudget{}, ErrClosed
	}
	if err := checkName("tenant", b.Tenant, false); err != nil {
		return policy.TenantBudget{}, err
	}
	b = fleet.FillBudget(b, s.defBudget)
	if err := ValidateBudget(b); err != nil {
		return policy.TenantBudget{}, err
	}
	b.Tenant = strings.Clone(b.Tenant)
	v, err := json.Marshal(budgetRecord(b))
	if err != nil {
		return policy.TenantBudget{}, fmt.Errorf("breakerstore: encode budget: %w", err)
	}
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if err := s.update("write budget", func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketBudgets).Put([]byte(b.Tenant), v)
	}); err != nil {
		return policy.TenantBudget{}, err
	}
	now := s.now()
	tb := s.lockBucket(b.Tenant, now)
	cfg := b
	tb.setConfig(s, now, &cfg)
	newlyDirty := tb.markDirty()
	tb.mu.Unlock()
	s.setDeclared(b.Tenant, true)
	if err := s.changed(nil, tb, newlyDirty); err != nil {
		return policy.TenantBudget{}, err
	}
	return b, nil
}

// DeleteBudget removes tenant's explicit budget, committed before it
// returns; the tenant falls back to the default budget, keeping its tokens up
// to the default capacity. It returns ErrNotFound when there is no explicit
// budget and is safe for concurrent use.
func (s *Store) DeleteBudget(tenant string) error {
	if s.closed.Load() {
		return ErrClosed
	}
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	tb, ok := s.buckets.get(tenant)
	if ok {
		tb.mu.Lock()
		ok = tb.cfg != nil && !tb.deleted
		tb.mu.Unlock()
	}
	if !ok {
		return fmt.Errorf("%w: budget of tenant %q", ErrNotFound, tenant)
	}
	if err := s.updateFreeing("delete budget", func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketBudgets).Delete([]byte(tenant))
	}); err != nil {
		return err
	}
	now := s.now()
	tb = s.lockBucket(tenant, now)
	tb.setConfig(s, now, nil)
	tb.lastActive = now
	newlyDirty := tb.markDirty()
	tb.mu.Unlock()
	s.setDeclared(tenant, false)
	return s.changed(nil, tb, newlyDirty)
}

// setConfig switches the bucket to cfg (nil: the default). Tokens are
// refilled under the old budget; a full bucket stays full, others are capped
// at the new capacity. tb.mu must be held.
func (tb *tokenBucket) setConfig(s *Store, now int64, cfg *policy.TenantBudget) {
	old := tb.config(s)
	tb.cfg = cfg
	tb.v.Rebudget(now, old, tb.config(s))
}

// bucketFor returns tenant's bucket, creating a full one with the default
// budget. The tenant name is validated on creation.
func (s *Store) bucketFor(tenant string, now int64) (*tokenBucket, error) {
	return s.bucket(tenant, now, true)
}

// bucket returns tenant's bucket, creating it; capped applies
// Options.MaxTenants to a new tenant.
func (s *Store) bucket(tenant string, now int64, capped bool) (*tokenBucket, error) {
	if tb, ok := s.buckets.get(tenant); ok {
		return tb, nil
	}
	if err := checkName("tenant", tenant, false); err != nil {
		return nil, err
	}
	// The cap is checked before the shard lock is taken (len locks every
	// shard), so concurrent first calls may pass it by a few tenants.
	if capped {
		if n := s.buckets.len(); n >= s.opts.MaxTenants {
			return nil, fmt.Errorf("%w: %d tenants have state (cap %d)", ErrTooManyTenants, n, s.opts.MaxTenants)
		}
		if err := s.admitAuto(tenant); err != nil {
			return nil, err
		}
	}
	return s.buckets.getOrCreate(tenant, func() (*tokenBucket, error) {
		return &tokenBucket{tenant: strings.Clone(tenant), v: fleet.NewBucket(&s.defBudget, now), lastActive: now}, nil
	})
}

// lockBucket returns tenant's bucket locked, creating it whatever the
// tenant cap (an explicit budget is always admitted); tenant is valid.
func (s *Store) lockBucket(tenant string, now int64) *tokenBucket {
	for {
		tb, _ := s.bucket(tenant, now, false)
		tb.mu.Lock()
		if !tb.deleted {
			return tb
		}
		tb.mu.Unlock()
	}
}

func (tb *tokenBucket) markDirty() bool {
	if tb.dirty {
		return false
	}
	tb.dirty = true
	return true
}

// redirty implements entity.
func (tb *tokenBucket) redirty() bool {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.dirty || tb.deleted {
		return false
	}
	tb.dirty = true
	return true
}

// tokensRecordV1 is the version byte of the tokens record: version, tokens
// (float64 bits), last refill (Unix ns), granted, refused, dry-run refusals,
// each 8 bytes big-endian; 41 bytes.
const tokensRecordV1 = 1

// write implements entity.
func (tb *tokenBucket) write(tx *bbolt.Tx, clear bool) (int, error) {
	tb.mu.Lock()
	if tb.deleted {
		tb.mu.Unlock()
		return 0, nil
	}
	if clear {
		tb.dirty = false
	}
	v := make([]byte, 0, 41)
	v = append(v, tokensRecordV1)
	v = binary.BigEndian.AppendUint64(v, math.Float64bits(tb.v.Tokens))
	v = binary.BigEndian.AppendUint64(v, uint64(tb.v.Last))
	v = binary.BigEndian.AppendUint64(v, tb.v.Granted)
	v = binary.BigEndian.AppendUint64(v, tb.v.Refused)
	v = binary.BigEndian.AppendUint64(v, tb.v.DryRun)
	tb.mu.Unlock()
	return 1, tx.Bucket(bucketTokens).Put([]byte(tb.tenant), v)
}

// loadBudgets reads the budgets and tokens buckets into memory.
func (s *Store) loadBudgets(tx *bbolt.Tx, now int64) error {
	err := tx.Bucket(bucketBudgets).ForEach(func(k, v []byte) error {
		var rec budgetRecord
		if err := json.Unmarshal(v, &rec); err != nil {
			return corrupt(bucketBudgets, k, err)
		}
		b := policy.TenantBudget(rec)
		if b.Tenant != string(k) {
			return corrupt(bucketBudgets, k, fmt.Errorf("record names tenant %q", b.Tenant))
		}
		if err := ValidateBudget(b); err != nil {
			return corrupt(bucketBudgets, k, err)
		}
		s.buckets.put(b.Tenant, &tokenBucket{tenant: b.Tenant, cfg: &b, v: fleet.NewBucket(&b, now), lastActive: now})
		return nil
	})
	if err != nil {
		return err
	}
	return tx.Bucket(bucketTokens).ForEach(func(k, v []byte) error {
		if len(v) != 41 || v[0] != tokensRecordV1 {
			return corrupt(bucketTokens, k, fmt.Errorf("tokens record of %d bytes, want 41 of version %d", len(v), tokensRecordV1))
		}
		tenant := string(k)
		tb, ok := s.buckets.get(tenant)
		if !ok {
			tb = &tokenBucket{tenant: tenant, lastActive: now}
			s.buckets.put(tenant, tb)
		}
		be := binary.BigEndian
		tb.v = fleet.Bucket{
			Tokens:  math.Float64frombits(be.Uint64(v[1:])),
			Last:    int64(be.Uint64(v[9:])),
			Granted: be.Uint64(v[17:]),
			Refused: be.Uint64(v[25:]),
			DryRun:  be.Uint64(v[33:]),
		}
		if !finite(tb.v.Tokens) {
			return corrupt(bucketTokens, k, fmt.Errorf("tokens %v", tb.v.Tokens))
		}
		tb.v.Loaded(tb.config(s))
		return nil
	})
}
