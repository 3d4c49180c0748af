package breakerstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// TestKeysAreDurable: a claim and a success are committed before they
// return, so a restart (without a Close: a crash) keeps the lease and the
// result.
func TestKeysAreDurable(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	now := e.clock.Now()
	c := policy.KeyClaim{LeaseUntil: now.Add(10 * time.Second), Expires: now.Add(time.Hour)}
	k1, k2 := policy.KeyRef{Tenant: "t", Key: "k1"}, policy.KeyRef{Tenant: "t", Key: "k2"}
	a1 := must(s.ClaimKey(k1, c)).get(t)
	must(s.ClaimKey(k2, c)).get(t)
	if _, err := s.CompleteKey(k1, a1.LeaseID, policy.KeyOutcomeSucceeded, "rec-1", time.Time{}); err != nil {
		t.Fatal(err)
	}
	s = e.crashAndReopen(s)
	if a := must(s.ClaimKey(k1, c)).get(t); a.State != policy.KeySucceeded || a.ResultRef != "rec-1" {
		t.Errorf("k1 after a crash: %+v, want SUCCEEDED rec-1", a)
	}
	if a := must(s.ClaimKey(k2, c)).get(t); a.State != policy.KeyInFlight {
		t.Errorf("k2 after a crash: %+v, want IN_FLIGHT (the lease survives)", a)
	}
	if _, err := s.CompleteKey(k2, "1", policy.KeyOutcomeFailed, "", time.Time{}); !errors.Is(err, fleet.ErrLease) {
		t.Errorf("CompleteKey with a wrong lease: %v, want fleet.ErrLease", err)
	}
	e.clock.Advance(2 * time.Hour)
	if _, err := s.Key(k1); err == nil {
		t.Errorf("Key of an expired record: nil error, want not found")
	}
	// The flusher's sweep deletes expired records from disk too.
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, err := breakerstore.KeyRecordsOnDisk(s); err != nil || n != 0 {
		t.Errorf("%d idempotency records on disk after the sweep (%v), want none", n, err)
	}
}

// TestAnExpiredKeyClaimedAgainAtTheCap: a tenant at its key cap claims a
// key whose record has expired. Making room drops that very record, so the
// new claim must go into a fresh record the store holds, not into the one
// just dropped; before the fix the claim reached the disk only, and the
// key read as not found until a restart.
func TestAnExpiredKeyClaimedAgainAtTheCap(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.MaxKeysPerTenant = 1 })
	s := e.open()
	now := e.clock.Now()
	k := policy.KeyRef{Tenant: "t", Key: "k"}
	must(s.ClaimKey(k, policy.KeyClaim{LeaseUntil: now.Add(time.Second), Expires: now.Add(time.Minute)})).get(t)
	e.clock.Advance(2 * time.Minute)
	now = e.clock.Now()
	a := must(s.ClaimKey(k, policy.KeyClaim{LeaseUntil: now.Add(time.Second), Expires: now.Add(time.Minute)})).get(t)
	if a.State != policy.KeyNew || a.LeaseID == "" {
		t.Fatalf("claim of the expired key: %+v, want NEW with a lease", a)
	}
	if v, err := s.Key(k); err != nil || v.State != policy.KeyInFlight {
		t.Errorf("Key after the new claim = %+v, %v; want IN_FLIGHT", v, err)
	}
	other := policy.KeyRef{Tenant: "t", Key: "other"}
	if _, err := s.ClaimKey(other, policy.KeyClaim{LeaseUntil: now.Add(time.Second), Expires: now.Add(time.Minute)}); err == nil {
		t.Errorf("a second live key beyond the cap of 1 was admitted, want it refused")
	}
}
