package fleet_test

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
)

func TestPoolRules(t *testing.T) {
	const ttl, wait = 10 * sec, sec / 2
	var p fleet.Pool
	ids := seq()
	var held []string
	for i := range 3 {
		a, e := p.Acquire(0, 3, ttl, wait, ids)
		if !a.Admitted || a.Reason != fleet.ReasonLease || a.LeaseID == "" || e != fleet.Mutated {
			t.Fatalf("lease %d: got %+v effect %b, want admitted with a lease", i, a, e)
		}
		if got, want := a.LeaseExpiry, time.Unix(0, ttl); !got.Equal(want) {
			t.Fatalf("lease %d expires %v, want %v", i, got, want)
		}
		held = append(held, a.LeaseID)
	}
	// At the ceiling: refused, told to come back after wait.
	a, e := p.Acquire(sec, 3, ttl, wait, ids)
	if a.Admitted || a.Reason != fleet.ReasonFull || a.RetryAfter != time.Duration(wait) || e != 0 {
		t.Fatalf("at the ceiling: got %+v effect %b, want refused %s after %v", a, e, fleet.ReasonFull, time.Duration(wait))
	}
	// A release frees a slot; releasing it again is stray, not an error.
	if ok, _ := p.Release(2*sec, held[0]); !ok {
		t.Fatalf("release of a live lease: held false, want true")
	}
	if ok, _ := p.Release(2*sec, held[0]); ok || p.Stray != 1 {
		t.Fatalf("second release: held %v stray %d, want false and 1", ok, p.Stray)
	}
	if ok, _ := p.Release(2*sec, "not-a-lease"); ok || p.Stray != 2 {
		t.Fatalf("release of garbage: held %v stray %d, want false and 2", ok, p.Stray)
	}
	if a, _ := p.Acquire(2*sec, 3, ttl, wait, ids); !a.Admitted {
		t.Fatalf("after a release: %+v, want admitted", a)
	}
	// Near the end of the leases' life the wait shrinks to the first expiry.
	if a, _ := p.Acquire(ttl-sec/4, 3, ttl, wait, ids); a.Admitted || a.RetryAfter != time.Duration(sec/4) {
		t.Fatalf("a quarter second before an expiry: %+v, want refused after 250ms", a)
	}
	// Expired leases no longer count, and releasing one after expiry is stray.
	if n := p.Live(ttl); n != 1 {
		t.Fatalf("live at the expiry of the first leases: %d, want 1", n)
	}
	if ok, _ := p.Release(ttl, held[1]); ok || p.Stray != 3 {
		t.Fatalf("release after expiry: held %v stray %d, want false and 3", ok, p.Stray)
	}
	// A lowered ceiling refuses at once; the leases out run to their end.
	if a, _ := p.Acquire(ttl, 1, ttl, wait, ids); a.Admitted {
		t.Fatalf("ceiling lowered to 1 with 1 live: %+v, want refused", a)
	}
}

// TestPoolNeverExceedsTheCeiling: whatever the order of acquisitions,
// releases and time, the live leases never exceed the ceiling.
func TestPoolNeverExceedsTheCeiling(t *testing.T) {
	const ceiling = 4
	var p fleet.Pool
	var n uint64
	ids := func() fleet.PermitID {
		n++
		var id fleet.PermitID
		binary.BigEndian.PutUint64(id[:], n)
		return id
	}
	var out []string
	for step := range 2000 {
		now := int64(step) * sec / 10
		switch (step * 7919) % 5 {
		case 0, 1, 2:
			if a, _ := p.Acquire(now, ceiling, 3*sec, sec, ids); a.Admitted {
				out = append(out, a.LeaseID)
			}
		case 3:
			if len(out) > 0 {
				p.Release(now, out[0])
				out = out[1:]
			}
		}
		if n := p.Live(now); n > ceiling {
			t.Fatalf("step %d: %d leases live, ceiling %d", step, n, ceiling)
		}
	}
}
