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
