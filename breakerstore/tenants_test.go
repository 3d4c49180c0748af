package breakerstore_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// TestAutoTenantCap: tenants that worker calls create (by a breaker or a
// token bucket) are capped by MaxAutoTenants, apart from declared tenants,
// which are always admitted; the count survives a restart and frees up when
// an automatic tenant is declared or goes idle.
func TestAutoTenantCap(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.MaxAutoTenants = 2 })
	s := e.open()
	spend := func(s *breakerstore.Store, tenant string) error {
		_, err := s.SpendRetry(policy.SpendRequest{Tenant: tenant})
		return err
	}
	breaker := func(s *breakerstore.Store, tenant string) error {
		_, err := s.Record(policy.BreakerKey{Tenant: tenant, Target: "geo"}, consecutive, policy.ResultSuccess, "")
		return err
	}
	wantCapped := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, breakerstore.ErrTooManyAutoTenants) || !errors.Is(err, policy.ErrCapacity) || !strings.Contains(err.Error(), "cap 2") {
			t.Errorf("%s: got %v, want ErrTooManyAutoTenants naming the cap", what, err)
		}
	}
	if err := spend(s, "auto-1"); err != nil {
		t.Fatal(err)
	}
	if err := breaker(s, "auto-2"); err != nil { // a breaker creates a tenant too
		t.Fatal(err)
	}
	wantCapped("a third undeclared tenant by budget", spend(s, "squatter"))
	wantCapped("a third undeclared tenant by breaker", breaker(s, "squatter"))
	if err := spend(s, "auto-2"); err != nil {
		t.Errorf("an automatic tenant already counted: %v", err)
	}
	// Declared tenants are always admitted, beyond the automatic cap.
	for _, tenant := range []string{"declared-1", "declared-2", "declared-3"} {
		if _, err := s.SetBudget(policy.TenantBudget{Tenant: tenant, Capacity: 5}); err != nil {
			t.Fatalf("SetBudget(%s): %v", tenant, err)
		}
		if err := breaker(s, tenant); err != nil {
			t.Errorf("a declared tenant's breaker: %v", err)
		}
		if err := spend(s, tenant); err != nil {
			t.Errorf("a declared tenant's budget: %v", err)
		}
		if !s.Declared(tenant) {
			t.Errorf("Declared(%s) = false after SetBudget", tenant)
		}
	}
	if s.Declared("auto-1") || s.Declared("squatter") {
		t.Error("Declared is true for an undeclared tenant")
	}

	// The count is rebuilt from the file.
	s = e.reopen(s)
	wantCapped("a new undeclared tenant after a restart", spend(s, "squatter"))
	if !s.Declared("declared-1") || s.Declared("auto-1") {
		t.Error("the declarations did not survive a restart")
	}

	// Declaring an automatic tenant frees its slot; deleting the budget
	// counts it again.
	if _, err := s.SetBudget(policy.TenantBudget{Tenant: "auto-1", Capacity: 5}); err != nil {
		t.Fatal(err)
	}
	if err := spend(s, "newcomer"); err != nil {
		t.Errorf("a new undeclared tenant after one was declared: %v", err)
	}
	if err := s.DeleteBudget("auto-1"); err != nil {
		t.Fatal(err)
	}
	if s.Declared("auto-1") {
		t.Error("Declared(auto-1) = true after DeleteBudget")
	}
	wantCapped("a new undeclared tenant with the cap full again", spend(s, "squatter"))

	// Idle automatic tenants are dropped, and their slots with them.
	e.clock.Advance(breakerstore.DefaultIdleTTL + time.Minute)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"fresh-1", "fresh-2"} {
		if err := spend(s, tenant); err != nil {
			t.Errorf("%s after the idle ones were dropped: %v", tenant, err)
		}
	}
	wantCapped("a third after the slots were taken again", spend(s, "squatter"))
	if err := spend(s, "declared-2"); err != nil {
		t.Errorf("a declared tenant after a sweep: %v", err)
	}
}
