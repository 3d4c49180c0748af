package breakerstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// policyMap is an immutable map of scopes to entries, replaced as a whole on
// every admin write so that Resolve takes no lock.
type policyMap struct {
	m map[policy.PolicyScope]*policy.PolicyEntry
}

// policyRecord is the JSON record of the policies bucket.
type policyRecord struct {
	Tenant  string        `json:"tenant"`
	Target  string        `json:"target"`
	Updated int64         `json:"updated_unix_nano"`
	Policy  policy.Policy `json:"policy"`
}

// checkScope validates a policy scope by fleet.CheckScope's rule.
func checkScope(tenant, target string) error { return fieldErr(fleet.CheckScope(tenant, target)) }

// SetPolicy sets the policy of a scope (tenant and target, target only with
// tenant "", or tenant only with target ""), committed before it returns. The
// caller has validated p; the store keeps its own copy. It is safe for
// concurrent use.
func (s *Store) SetPolicy(tenant, target string, p policy.Policy) (policy.PolicyEntry, error) {
	if s.closed.Load() {
		return policy.PolicyEntry{}, ErrClosed
	}
	if err := checkScope(tenant, target); err != nil {
		return policy.PolicyEntry{}, err
	}
	e := &policy.PolicyEntry{Tenant: strings.Clone(tenant), Target: strings.Clone(target), Policy: clonePolicy(p), Updated: s.clock.Now()}
	v, err := json.Marshal(policyRecord{Tenant: e.Tenant, Target: e.Target, Updated: e.Updated.UnixNano(), Policy: e.Policy})
	if err != nil {
		return policy.PolicyEntry{}, fmt.Errorf("breakerstore: encode policy: %w", err)
	}
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	if err := s.update("write policy", func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketPolicies).Put(joinKey(tenant, target), v)
	}); err != nil {
		return policy.PolicyEntry{}, err
	}
	m := maps.Clone(s.policies.Load().m)
	m[policy.PolicyScope{Tenant: e.Tenant, Target: e.Target}] = e
	s.policies.Store(&policyMap{m: m})
	out := *e
	out.Policy = clonePolicy(e.Policy)
	return out, nil
}

// Policy returns the entry of exactly the scope tenant/target, or
// ErrNotFound. The Policy is the caller's copy. It is safe for concurrent use.
func (s *Store) Policy(tenant, target string) (policy.PolicyEntry, error) {
	if s.closed.Load() {
		return policy.PolicyEntry{}, ErrClosed
	}
	e, ok := s.policies.Load().m[policy.PolicyScope{Tenant: tenant, Target: target}]
	if !ok {
		return policy.PolicyEntry{}, fmt.Errorf("%w: policy %q/%q", ErrNotFound, tenant, target)
	}
	out := *e
	out.Policy = clonePolicy(e.Policy)
	return out, nil
}

// Resolve returns the policy a call of tenant to target follows, by the
// order fleet.ResolvePolicy gives, without locking; the Policy shares its
// slices with the store and must not be modified. It is safe for
// concurrent use.
func (s *Store) Resolve(tenant, target string) (policy.Policy, policy.PolicyEntry) {
	if e := fleet.ResolvePolicy(s.policies.Load().m, tenant, target); e != nil {
		return e.Policy, *e
	}
	return s.defaultPolicy, policy.PolicyEntry{Policy: s.defaultPolicy}
}

// Policies returns up to limit entries (all when limit <= 0) sorted by scope
// scope, starting after the scope after (the zero policy.PolicyScope starts at the beginning).
// It is safe for concurrent use.
func (s *Store) Policies(after policy.PolicyScope, limit int) ([]policy.PolicyEntry, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	var out []policy.PolicyEntry
	for k, e := range s.policies.Load().m {
		if after != (policy.PolicyScope{}) && after.Compare(k) >= 0 {
			continue
		}
		c := *e
		c.Policy = clonePolicy(e.Policy)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b policy.PolicyEntry) int {
		return policy.PolicyScope{Tenant: a.Tenant, Target: a.Target}.Compare(policy.PolicyScope{Tenant: b.Tenant, Target: b.Target})
	})
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// DeletePolicy removes the policy of exactly the scope tenant/target,
// committed before it returns, or returns ErrNotFound. It is safe for
// concurrent use.
func (s *Store) DeletePolicy(tenant, target string) error {
	if s.closed.Load() {
		return ErrClosed
	}
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	k := policy.PolicyScope{Tenant: tenant, Target: target}
	if _, ok := s.policies.Load().m[k]; !ok {
		return fmt.Errorf("%w: policy %q/%q", ErrNotFound, tenant, target)
	}
	if err := s.updateFreeing("delete policy", func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketPolicies).Delete(joinKey(tenant, target))
	}); err != nil {
		return err
	}
	m := maps.Clone(s.policies.Load().m)
	delete(m, k)
	s.policies.Store(&policyMap{m: m})
	return nil
}

// clonePolicy copies p's slices.
func clonePolicy(p policy.Policy) policy.Policy {
	p.TransientHTTP = slices.Clone(p.TransientHTTP)
	p.TerminalHTTP = slices.Clone(p.TerminalHTTP)
	p.TransientGRPC = slices.Clone(p.TransientGRPC)
	return p
}

// loadPolicies reads the policies bucket into memory.
func (s *Store) loadPolicies(tx *bbolt.Tx) error {
	m := map[policy.PolicyScope]*policy.PolicyEntry{}
	err := tx.Bucket(bucketPolicies).ForEach(func(k, v []byte) error {
		var r policyRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return corrupt(bucketPolicies, k, err)
		}
		tenant, target, ok := splitKey(k)
		if !ok || tenant != r.Tenant || target != r.Target {
			return corrupt(bucketPolicies, k, errors.New("record does not match its key"))
		}
		m[policy.PolicyScope{Tenant: tenant, Target: target}] = &policy.PolicyEntry{Tenant: tenant, Target: target, Policy: r.Policy, Updated: time.Unix(0, r.Updated)}
		return nil
	})
	if err != nil {
		return err
	}
	s.policies.Store(&policyMap{m: m})
	return nil
}
