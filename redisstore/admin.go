package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// Kinds of entries of the changes stream.
const (
	changePolicy = "policy"
	changeBudget = "budget"
	changeTenant = "tenant" // a tenant new to the fleet
)

// adminCache is a replica's copy of the admin objects every decision reads
// (policies, explicit budgets), replaced as a whole map on every change so
// readers take no lock; the changes feed keeps it current.
type adminCache struct {
	mu       sync.Mutex // serializes writers
	policies atomic.Pointer[map[policy.PolicyScope]*policy.PolicyEntry]
	budgets  atomic.Pointer[map[string]*policy.TenantBudget]
}

func (a *adminCache) budget(tenant string) (policy.TenantBudget, bool) {
	b, ok := (*a.budgets.Load())[tenant]
	if !ok {
		return policy.TenantBudget{}, false
	}
	return *b, true
}

func (a *adminCache) budgetTenants() []string {
	return slices.Sorted(maps.Keys(*a.budgets.Load()))
}

// setBudget replaces tenant's budget in the cache (nil deletes it).
func (a *adminCache) setBudget(tenant string, b *policy.TenantBudget) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := maps.Clone(*a.budgets.Load())
	if b == nil {
		delete(m, tenant)
	} else {
		c := *b
		m[tenant] = &c
	}
	a.budgets.Store(&m)
}

// setPolicy replaces the entry of scope in the cache (nil deletes it).
func (a *adminCache) setPolicy(scope policy.PolicyScope, e *policy.PolicyEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := maps.Clone(*a.policies.Load())
	if e == nil {
		delete(m, scope)
	} else {
		m[scope] = e
	}
	a.policies.Store(&m)
}

// policyRecord is the JSON of a policy in {policyd}:policies.
type policyRecord struct {
	Tenant  string        `json:"tenant"`
	Target  string        `json:"target"`
	Updated int64         `json:"updated_unix_nano"`
	Policy  policy.Policy `json:"policy"`
}

// policyField is the field of scope in {policyd}:policies.
func policyField(tenant, target string) string { return tenant + "\x00" + target }

// loadAdmin reads every policy and explicit budget into the cache and
// returns the id of the changes stream's last entry: the feed replays
// every change after it.
func (s *Store) loadAdmin() (string, error) {
	ctx, cancel := s.call()
	defer cancel()
	last := "0-0"
	msgs, err := s.c.XRevRangeN(ctx, keyChanges, "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("redisstore: read %s: %w", keyChanges, err)
	}
	if len(msgs) == 1 {
		last = msgs[0].ID
	}
	ps, err := s.c.HGetAll(ctx, keyPolicies).Result()
	if err != nil {
		return "", fmt.Errorf("redisstore: read %s: %w", keyPolicies, err)
	}
	pm := map[policy.PolicyScope]*policy.PolicyEntry{}
	for f, v := range ps {
		e, err := decodePolicy(v)
		if err != nil {
			return "", fmt.Errorf("redisstore: %s field %q: %w", keyPolicies, f, err)
		}
		pm[policy.PolicyScope{Tenant: e.Tenant, Target: e.Target}] = e
	}
	bs, err := s.c.HGetAll(ctx, keyBudgets).Result()
	if err != nil {
		return "", fmt.Errorf("redisstore: read %s: %w", keyBudgets, err)
	}
	bm := map[string]*policy.TenantBudget{}
	for t, v := range bs {
		b, err := decodeBudget(v)
		if err != nil {
			return "", fmt.Errorf("redisstore: %s field %q: %w", keyBudgets, t, err)
		}
		bm[t] = b
	}
	s.admin.policies.Store(&pm)
	s.admin.budgets.Store(&bm)
	return last, nil
}

func decodePolicy(v string) (*policy.PolicyEntry, error) {
	var r policyRecord
	if err := json.Unmarshal([]byte(v), &r); err != nil {
		return nil, err
	}
	return &policy.PolicyEntry{Tenant: r.Tenant, Target: r.Target, Policy: r.Policy, Updated: time.Unix(0, r.Updated)}, nil
}

func decodeBudget(v string) (*policy.TenantBudget, error) {
	var r budgetRecord
	if err := json.Unmarshal([]byte(v), &r); err != nil {
		return nil, err
	}
	b := policy.TenantBudget(r)
	return &b, nil
}

// adminWrite runs write and appends a change entry (kind, tenant, target)
// in one MULTI, so every replica that follows the changes stream reloads
// what changed.
func (s *Store) adminWrite(kind, tenant, target string, write func(redis.Pipeliner)) error {
	ctx, cancel := s.adminCtx()
	defer cancel()
	err := s.durably(ctx, keyChanges, func(c redis.Cmdable) error {
		_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
			write(p)
			p.XAdd(ctx, &redis.XAddArgs{Stream: keyChanges, MaxLen: 10000, Approx: true,
				Values: []any{"kind", kind, "tenant", tenant, "target", target}})
			return nil
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("redisstore: admin write (%s %q/%q): %w", kind, tenant, target, err)
	}
	return nil
}

// adminCtx bounds an admin write: the store's timeout, plus the wait for
// replicas when WaitReplicas asks for one.
func (s *Store) adminCtx() (context.Context, context.CancelFunc) {
	d := s.opts.Timeout
	if s.opts.WaitReplicas > 0 {
		d += s.opts.WaitTimeout
	}
	return context.WithTimeout(s.ctx, d)
}

// durably runs write, and with Options.WaitReplicas set waits (WAIT) until
// that many replicas of the primary holding key have it: write then runs
// on a connection of its own to that primary, since WAIT counts the
// writes of its connection. Fewer replicas within WaitTimeout is
// ErrNotReplicated; the write stays on the primary.
func (s *Store) durably(ctx context.Context, key string, write func(redis.Cmdable) error) error {
	if s.opts.WaitReplicas <= 0 {
		return write(s.c)
	}
	var primary *redis.Client
	switch c := s.c.(type) {
	case *redis.ClusterClient:
		var err error
		if primary, err = c.MasterForKey(ctx, key); err != nil {
			return err
		}
	case *redis.Client:
		primary = c
	default:
		return fmt.Errorf("redisstore: WaitReplicas needs a *redis.Client or *redis.ClusterClient, not %T", s.c)
	}
	conn := primary.Conn()
	defer conn.Close()
	if err := write(conn); err != nil {
		return err
	}
	n, err := conn.Wait(ctx, s.opts.WaitReplicas, s.opts.WaitTimeout).Result()
	if err != nil {
		return fmt.Errorf("redisstore: WAIT: %w", err)
	}
	if n < int64(s.opts.WaitReplicas) {
		return fmt.Errorf("%w: acknowledged by %d of %d replicas within %v (the write is on the primary)",
			ErrNotReplicated, n, s.opts.WaitReplicas, s.opts.WaitTimeout)
	}
	return nil
}

// followChanges reads the changes stream from last until the store closes
// and reloads each changed object into the cache.
func (s *Store) followChanges(last string) {
	defer s.wg.Done()
	woken := "0-0"
	for s.ctx.Err() == nil {
		res, err := s.readWoken([]string{keyChanges, last}, keyWakeChanges(s.id), &woken)
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case err != nil:
			if s.ctx.Err() != nil {
				return
			}
			if s.health.up() {
				s.log.Warn("redisstore: changes stream read failed; retrying", "err", err)
			}
			s.pause(100 * time.Millisecond)
			continue
		}
		for _, str := range res {
			for _, m := range str.Messages {
				kind, _ := m.Values["kind"].(string)
				tenant, _ := m.Values["tenant"].(string)
				target, _ := m.Values["target"].(string)
				if err := s.reload(kind, tenant, target); err != nil {
					s.log.Warn("redisstore: reload after a change failed; retrying", "kind", kind, "err", err)
					s.pause(100 * time.Millisecond)
					break
				}
				last = m.ID
			}
		}
	}
}

// pause waits d or until the store closes.
func (s *Store) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
	case <-t.C:
	}
}

// reload reads one changed object into the cache.
func (s *Store) reload(kind, tenant, target string) error {
	ctx, cancel := s.call()
	defer cancel()
	switch kind {
	case changeTenant:
		s.mu.RLock()
		watched := len(s.allSubs) > 0
		s.mu.RUnlock()
		if watched {
			// New to the fleet: its stream holds only what happened since,
			// which the subscribers to every tenant must see whole.
			_, err := s.followFrom(tenant, "0-0")
			return err
		}
	case changePolicy:
		v, err := s.c.HGet(ctx, keyPolicies, policyField(tenant, target)).Result()
		scope := policy.PolicyScope{Tenant: tenant, Target: target}
		switch {
		case errors.Is(err, redis.Nil):
			s.admin.setPolicy(scope, nil)
		case err != nil:
			return err
		default:
			e, err := decodePolicy(v)
			if err != nil {
				return err
			}
			s.admin.setPolicy(scope, e)
		}
	case changeBudget:
		v, err := s.c.HGet(ctx, keyBudgets, tenant).Result()
		switch {
		case errors.Is(err, redis.Nil):
			s.admin.setBudget(tenant, nil)
		case err != nil:
			return err
		default:
			b, err := decodeBudget(v)
			if err != nil {
				return err
			}
			s.admin.setBudget(tenant, b)
		}
	}
	return nil
}

// checkScope validates a policy scope by fleet.CheckScope's rule.
func checkScope(tenant, target string) error { return fieldErr(fleet.CheckScope(tenant, target)) }

// SetPolicy stores the policy of a scope (tenant and target, target only,
// or tenant only) and tells every replica. The caller has validated p.
func (s *Store) SetPolicy(tenant, target string, p policy.Policy) (policy.PolicyEntry, error) {
	if err := s.check(); err != nil {
		return policy.PolicyEntry{}, err
	}
	if err := checkScope(tenant, target); err != nil {
		return policy.PolicyEntry{}, err
	}
	e := &policy.PolicyEntry{Tenant: strings.Clone(tenant), Target: strings.Clone(target), Policy: clonePolicy(p),
		Updated: s.opts.Clock()}
	v, err := json.Marshal(policyRecord{Tenant: e.Tenant, Target: e.Target, Updated: e.Updated.UnixNano(), Policy: e.Policy})
	if err != nil {
		return policy.PolicyEntry{}, fmt.Errorf("redisstore: encode policy: %w", err)
	}
	if err := s.adminWrite(changePolicy, tenant, target, func(pl redis.Pipeliner) {
		pl.HSet(s.ctx, keyPolicies, policyField(tenant, target), v)
	}); err != nil {
		return policy.PolicyEntry{}, err
	}
	s.admin.setPolicy(policy.PolicyScope{Tenant: e.Tenant, Target: e.Target}, e)
	out := *e
	out.Policy = clonePolicy(e.Policy)
	return out, nil
}

// Policy returns the entry of exactly the scope tenant/target (as this
// replica has it cached), or ErrNotFound.
func (s *Store) Policy(tenant, target string) (policy.PolicyEntry, error) {
	if err := s.check(); err != nil {
		return policy.PolicyEntry{}, err
	}
	e, ok := (*s.admin.policies.Load())[policy.PolicyScope{Tenant: tenant, Target: target}]
	if !ok {
		return policy.PolicyEntry{}, fmt.Errorf("%w: policy %q/%q", ErrNotFound, tenant, target)
	}
	out := *e
	out.Policy = clonePolicy(e.Policy)
	return out, nil
}

// Resolve returns the policy a call of tenant to target follows, by the
// order fleet.ResolvePolicy gives, from the replica's cache without
// locking or a round trip; the Policy shares its slices with the cache and
// must not be modified.
func (s *Store) Resolve(tenant, target string) (policy.Policy, policy.PolicyEntry) {
	if e := fleet.ResolvePolicy(*s.admin.policies.Load(), tenant, target); e != nil {
		return e.Policy, *e
	}
	return s.defaultPolicy, policy.PolicyEntry{Policy: s.defaultPolicy}
}

// Policies returns up to limit entries (all when limit <= 0) sorted by
// scope, after the scope after.
func (s *Store) Policies(after policy.PolicyScope, limit int) ([]policy.PolicyEntry, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	m := *s.admin.policies.Load()
	scopes := slices.SortedFunc(maps.Keys(m), policy.PolicyScope.Compare)
	var out []policy.PolicyEntry
	for _, sc := range scopes {
		if after != (policy.PolicyScope{}) && sc.Compare(after) <= 0 {
			continue
		}
		if limit > 0 && len(out) == limit {
			break
		}
		e := *m[sc]
		e.Policy = clonePolicy(e.Policy)
		out = append(out, e)
	}
	return out, nil
}

// DeletePolicy removes the policy of exactly the scope tenant/target, or
// returns ErrNotFound.
func (s *Store) DeletePolicy(tenant, target string) error {
	if err := s.check(); err != nil {
		return err
	}
	ctx, cancel := s.call()
	defer cancel()
	ok, err := s.c.HExists(ctx, keyPolicies, policyField(tenant, target)).Result()
	if err != nil {
		return fmt.Errorf("redisstore: read policy: %w", err)
	}
	if !ok {
		return fmt.Errorf("%w: policy %q/%q", ErrNotFound, tenant, target)
	}
	if err := s.adminWrite(changePolicy, tenant, target, func(p redis.Pipeliner) {
		p.HDel(s.ctx, keyPolicies, policyField(tenant, target))
	}); err != nil {
		return err
	}
	s.admin.setPolicy(policy.PolicyScope{Tenant: tenant, Target: target}, nil)
	return nil
}

// clonePolicy copies p's slices.
func clonePolicy(p policy.Policy) policy.Policy {
	p.TransientHTTP = slices.Clone(p.TransientHTTP)
	p.TerminalHTTP = slices.Clone(p.TerminalHTTP)
	p.TransientGRPC = slices.Clone(p.TransientGRPC)
	return p
}
