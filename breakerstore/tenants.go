package breakerstore

import (
	"fmt"
	"strings"
	"sync"
)

// Tenants are declared or automatic. A declared tenant has an explicit
// budget (SetBudget, from the admin API or a policy file); its record in the
// budgets bucket is the declaration, so declaring needs no record of its
// own. An automatic tenant is one a worker call gave state (a breaker or a
// token bucket) without a declaration. Automatic tenants are capped apart,
// by Options.MaxAutoTenants, so made-up tenant names fill only their own
// quota and a declared tenant is always admitted. An automatic tenant
// counts until its last breaker and its token bucket are dropped as idle.

// declaredSet is the set of declared tenants: read on every worker call
// with --tenants=declared, written only by admin writes, so a sync.Map.
type declaredSet = sync.Map

// Declared reports whether tenant has an explicit budget. It is safe for
// concurrent use and takes no lock on the way of a read.
func (s *Store) Declared(tenant string) bool {
	_, ok := s.tenants.declared.Load(tenant)
	return ok
}

// setDeclared records that tenant is (or no longer is) declared. Admin
// writes call it under adminMu.
func (s *Store) setDeclared(tenant string, declared bool) {
	if declared {
		s.tenants.declared.Store(strings.Clone(tenant), struct{}{})
	} else {
		s.tenants.declared.Delete(tenant)
	}
	s.tenants.mu.Lock()
	if declared {
		delete(s.tenants.auto, tenant)
	} else {
		s.tenants.auto[tenant] = struct{}{} // it keeps its token bucket
	}
	s.tenants.mu.Unlock()
}

// admitAutoLocked admits state for tenant created by a worker call: a
// declared tenant, or one that has automatic state already, passes; a new
// one counts against Options.MaxAutoTenants and gets ErrTooManyAutoTenants
// beyond it. The empty tenant of target-scoped breakers always passes.
// s.tenants.mu must be held; it must not be taken under a bucket shard's lock.
func (s *Store) admitAutoLocked(tenant string) error {
	if tenant == "" || s.Declared(tenant) {
		return nil
	}
	if _, ok := s.tenants.auto[tenant]; ok {
		return nil
	}
	if n := len(s.tenants.auto); n >= s.opts.MaxAutoTenants {
		return fmt.Errorf("%w: %d undeclared tenants have state (cap %d); declare the tenant with a budget to admit it",
			ErrTooManyAutoTenants, n, s.opts.MaxAutoTenants)
	}
	s.tenants.auto[strings.Clone(tenant)] = struct{}{}
	return nil
}

// admitAuto is admitAutoLocked taking s.tenants.mu.
func (s *Store) admitAuto(tenant string) error {
	s.tenants.mu.Lock()
	defer s.tenants.mu.Unlock()
	return s.admitAutoLocked(tenant)
}

// forgetAutoLocked stops counting tenant once it has neither breakers nor a
// token bucket. s.tenants.mu must be held.
func (s *Store) forgetAutoLocked(tenant string) {
	if s.tenants.breakers[tenant] > 0 {
		return
	}
	if _, ok := s.buckets.get(tenant); ok {
		return
	}
	delete(s.tenants.auto, tenant)
}

// countTenants sets up the declared and automatic tenants of the records
// just loaded.
func (s *Store) countTenants() {
	s.tenants.mu.Lock()
	defer s.tenants.mu.Unlock()
	for _, tb := range s.buckets.values() {
		if tb.cfg != nil {
			s.tenants.declared.Store(tb.tenant, struct{}{})
		} else {
			s.tenants.auto[tb.tenant] = struct{}{}
		}
	}
	for t := range s.tenants.breakers {
		if t != "" && !s.Declared(t) {
			s.tenants.auto[t] = struct{}{}
		}
	}
}
