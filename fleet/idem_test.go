package fleet_test

import (
	"errors"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

func TestKeyRecordClaimAndComplete(t *testing.T) {
	at := func(s int64) time.Time { return time.Unix(s, 0) }
	ns := func(s int64) int64 { return at(s).UnixNano() }
	claim := func(r *fleet.KeyRecord, exists bool, now int64, lease uint64, dedupes bool) policy.KeyAnswer {
		a, _ := r.Claim(exists, ns(now), lease, &policy.KeyClaim{LeaseUntil: at(now + 10), Expires: at(now + 100), Dedupes: dedupes})
		return a
	}
	var r fleet.KeyRecord
	if a := claim(&r, false, 0, 1, false); a.State != policy.KeyNew || r.State != policy.KeyInFlight || r.Lease != 1 {
		t.Fatalf("first claim: %+v, record %+v; want NEW, leased", a, r)
	}
	if a := claim(&r, true, 5, 2, false); a.State != policy.KeyInFlight || a.RetryAfter != 5*time.Second || r.Lease != 1 {
		t.Errorf("while leased: %+v, record %+v; want IN_FLIGHT for 5s more, the lease kept", a, r)
	}
	if err := r.Complete(ns(6), 2, policy.KeyOutcomeSucceeded, "x", 0); !errors.Is(err, fleet.ErrLease) {
		t.Errorf("complete with another's lease: %v, want ErrLease", err)
	}
	if err := r.Complete(ns(6), 1, policy.KeyOutcomeFailed, "", 0); err != nil {
		t.Fatal(err)
	}
	if a := claim(&r, true, 7, 3, false); a.State != policy.KeyNew || r.Lease != 3 {
		t.Errorf("after a failed attempt: %+v, want NEW, leased again", a)
	}
	if err := r.Complete(ns(8), 3, policy.KeyOutcomeUnknown, "", 0); err != nil {
		t.Fatal(err)
	}
	if a := claim(&r, true, 9, 4, false); a.State != policy.KeyUnknown || r.Lease != 0 {
		t.Errorf("a lost outcome, no dedupe: %+v, record %+v; want UNKNOWN without a lease", a, r)
	}
	if a := claim(&r, true, 9, 5, true); a.State != policy.KeyUnknown || r.Lease != 5 {
		t.Errorf("a lost outcome, the upstream dedupes: %+v, record %+v; want UNKNOWN, leased", a, r)
	}
	if err := r.Complete(ns(10), 5, policy.KeyOutcomeSucceeded, "rec-1", ns(500)); err != nil {
		t.Fatal(err)
	}
	if a := claim(&r, true, 11, 6, false); a.State != policy.KeySucceeded || a.ResultRef != "rec-1" || r.Expires != ns(500) {
		t.Errorf("after success: %+v, record %+v; want SUCCEEDED rec-1, kept until 500", a, r)
	}
	// An expired lease: its holder lost the outcome.
	var s fleet.KeyRecord
	claim(&s, false, 0, 7, false)
	if a := claim(&s, true, 20, 8, false); a.State != policy.KeyUnknown {
		t.Errorf("after the lease expired: %+v, want UNKNOWN", a)
	}
	// An expired record is none.
	if a := claim(&s, true, 200, 9, false); a.State != policy.KeyNew {
		t.Errorf("after the record expired: %+v, want NEW", a)
	}
}
