package redisstore

import (
	"testing"
	"time"
)

// TestPermitIDsTellDegradedFromEngine checks the two kinds of probe permit
// id: the engine's never read as degraded, a degraded one carries its
// expiry, and enginePermit tells the engine a live degraded permit as no
// permit, an expired one or the engine's own as they are.
func TestPermitIDsTellDegradedFromEngine(t *testing.T) {
	for range 1000 {
		if _, ok := degradedPermit(newPermitID()); ok {
			t.Fatal("an id drawn for the engine reads as a degraded permit")
		}
	}
	now := time.Unix(1_800_000_000, 123)
	clock := func() time.Time { return now }
	expiry := now.Add(10 * time.Second).UnixNano()
	id := degradedPermitID(expiry)
	if got, ok := degradedPermit(id); !ok || got != expiry {
		t.Fatalf("degradedPermit(degradedPermitID(%d)) = %d, %v; want the expiry back", expiry, got, ok)
	}
	if other := degradedPermitID(expiry); other == id {
		t.Error("two degraded permits of the same expiry have the same id")
	}
	engine := newPermitID().String()
	expired := degradedPermitID(now.UnixNano()).String() // its expiry is now: not live
	for _, tc := range []struct {
		name, permit, want string
	}{
		{"no permit", "", ""},
		{"not an id", "not-a-permit", "not-a-permit"},
		{"the engine's", engine, engine},
		{"degraded, live", id.String(), ""},
		{"degraded, expired (the engine refuses it)", expired, expired},
	} {
		if got := enginePermit(tc.permit, clock); got != tc.want {
			t.Errorf("%s: enginePermit(%q) = %q, want %q", tc.name, tc.permit, got, tc.want)
		}
	}
}
