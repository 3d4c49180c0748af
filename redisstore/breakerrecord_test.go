package redisstore

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// TestBreakerFormatIsTheLibrarys: the library packs a breaker with the
// layout decodeBreakerRecord reads, over the window fleet counts in, and
// reads its fields and window with formats that split that layout.
func TestBreakerFormatIsTheLibrarys(t *testing.T) {
	checkLibraryLocals(t, map[string]string{
		"BREAKER_FMT": "'<" + strings.Repeat("i8", breakerNumbers) + "'",
		"BREAKER_LEN": strconv.Itoa(breakerRecordLen),
		// load reads the fields and the window apart, the window from
		// byte 89 (1-based) on
		"FIELDS_FMT": "'<" + strings.Repeat("i8", len(breakerFields)) + "'",
		"SLOTS_FMT":  "'<" + strings.Repeat("i8", 3*fleet.WindowSlots) + "'",
		"SLOTS":      strconv.Itoa(fleet.WindowSlots),
	})
}

// checkLibraryLocals checks that policyd.lua defines each local of want
// (a name at the start of a line) as want's text.
func checkLibraryLocals(t *testing.T, want map[string]string) {
	t.Helper()
	for name, w := range want {
		m := regexp.MustCompile(`(?m)^local ` + name + ` = (.*)$`).FindStringSubmatch(library)
		if m == nil {
			t.Fatalf("policyd.lua has no %s", name)
		}
		if m[1] != w {
			t.Errorf("policyd.lua %s = %s, want %s", name, m[1], w)
		}
	}
}

// TestBreakerOfAnEarlierLayoutIsRead: a breaker the layout before the
// packed record stored as a hash of text fields is read as it was, and
// its next change rewrites it as a record holding the same numbers.
func TestBreakerOfAnEarlierLayoutIsRead(t *testing.T) {
	c, s := storeOnStandalone(t)
	ctx := context.Background()
	key := policy.BreakerKey{Tenant: "acme", Target: "pay"}
	now := time.Now().UnixMicro()
	slots := make([]string, fleet.WindowSlots)
	for i := range slots {
		slots[i] = strconv.Itoa(100+i) + ":" + strconv.Itoa(7+i) + ":" + strconv.Itoa(i)
	}
	c.SAdd(ctx, keyIndex("acme"), "pay")
	c.HSet(ctx, keyBreaker("acme", "pay"), "state", "2", "forced", "1", "mode", "1", "open_until", "0",
		"changed", strconv.FormatInt(now, 10), "gen", "3", "cooldown", "0", "last_failure", strconv.FormatInt(now, 10),
		"consecutive", "5", "half_open_ok", "0", "slot_width", "1000000", "slots", strings.Join(slots, " "), "permits", "")

	if st, ok, err := StoredBreakerState(ctx, c, key); err != nil || !ok || st != policy.BreakerOpen {
		t.Fatalf("StoredBreakerState of a hash = %v, %v, %v; want OPEN", st, ok, err)
	}
	got, err := s.Breaker(key)
	if err != nil {
		t.Fatalf("Breaker of a hash = %v", err)
	}
	if got.State != policy.BreakerOpen || !got.Forced || got.Generation != 3 || got.ConsecutiveFailures != 5 {
		t.Fatalf("Breaker of a hash = %+v, want OPEN, forced, generation 3, 5 failures in a row", got)
	}

	if _, err := s.ForceBreaker(key, policy.BreakerClosed); err != nil {
		t.Fatalf("ForceBreaker: %v", err)
	}
	if typ := c.Type(ctx, keyBreaker("acme", "pay")).Val(); typ != "string" {
		t.Fatalf("after a change the breaker is a %s, want a string (its record)", typ)
	}
	v, err := c.Get(ctx, keyBreaker("acme", "pay")).Bytes()
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeBreakerRecord(v)
	if err != nil {
		t.Fatalf("the record %v", err)
	}
	if st, ok, err := StoredBreakerState(ctx, c, key); err != nil || !ok || st != policy.BreakerClosed {
		t.Fatalf("StoredBreakerState of the record = %v, %v, %v; want CLOSED", st, ok, err)
	}
	if _, ok, err := StoredBreakerState(ctx, c, policy.BreakerKey{Tenant: "acme", Target: "never"}); err != nil || ok {
		t.Fatalf("StoredBreakerState of no breaker = %v, %v; want none", ok, err)
	}
	for f, want := range map[string]int64{"state": 1, "forced": 1, "gen": 4, "consecutive": 5, "slot_width": 1000000} {
		if r.field(f) != want {
			t.Errorf("record's %s = %d, want %d", f, r.field(f), want)
		}
	}
	// Forcing CLOSED keeps the window's counts (fleet.Breaker.Force).
	for i := range fleet.WindowSlots {
		n := r.n[len(breakerFields)+3*i:]
		if n[0] != int64(100+i) || n[1] != int64(7+i) || n[2] != int64(i) {
			t.Errorf("record's slot %d = %v, want %d:%d:%d", i, n[:3], 100+i, 7+i, i)
		}
	}
}

// TestDamagedBreakerRecordIsRefused: a breaker's record too short to hold
// its numbers is an error naming the key, never a breaker read as new.
func TestDamagedBreakerRecordIsRefused(t *testing.T) {
	c, s := storeOnStandalone(t)
	ctx := context.Background()
	c.SAdd(ctx, keyIndex("acme"), "pay")
	c.Set(ctx, keyBreaker("acme", "pay"), "short", 0)
	_, err := s.Breaker(policy.BreakerKey{Tenant: "acme", Target: "pay"})
	if err == nil || !strings.Contains(err.Error(), "{=acme}:breaker:pay is 5 bytes, a breaker at least 328") {
		t.Fatalf("Breaker of a damaged record = %v, want an error naming the key and its length", err)
	}
}

// storeOnStandalone opens a Store on a Redis started for t, and returns
// a client of that Redis too.
func storeOnStandalone(t *testing.T) (*redis.Client, *Store) {
	t.Helper()
	c := standalone(t)
	s, err := Open(context.Background(), Options{Client: c, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return c, s
}

// TestDecodeBreakerRecord: the permits after the numbers, and what is not
// a record.
func TestDecodeBreakerRecord(t *testing.T) {
	numbers := make([]byte, breakerRecordLen)
	numbers[8*5] = 9 // gen
	for _, tc := range []struct {
		v       []byte
		permits string
		err     string
	}{
		{numbers, "", ""},
		{append(append([]byte{}, numbers...), "ab12:1700 ff:1800"...), "ab12:1700 ff:1800", ""},
		{numbers[:100], "", "is 100 bytes, a breaker at least 328"},
		{append(append([]byte{}, numbers...), "ab12:"...), "", `permits are "ab12:", want hexid:expiry, space-separated`},
	} {
		r, err := decodeBreakerRecord(tc.v)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("decode of %d bytes = %v, want %q", len(tc.v), err, tc.err)
			}
			continue
		}
		if err != nil || r.permits != tc.permits || r.field("gen") != 9 {
			t.Errorf("decode of %d bytes = %+v, %v; want gen 9, permits %q", len(tc.v), r, err, tc.permits)
		}
	}
}
