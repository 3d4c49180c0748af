package redisstore

import (
	"strconv"
	"testing"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// TestDownAttemptsBounded: past maxDownAttempts records a new call's is
// not kept (counted) until some have expired, which are then forgotten;
// a call already kept still moves on to a later attempt, never back.
func TestDownAttemptsBounded(t *testing.T) {
	var d downAttempts
	key := func(i int) policy.CallKey { return policy.CallKey{Tenant: "acme", CallID: "c" + strconv.Itoa(i)} }
	retry := policy.Answer{Retry: true}
	for i := range maxDownAttempts {
		expiry := int64(2000)
		if i < 10 {
			expiry = 1000 // the first ten expire first
		}
		if !d.decided(key(i), 1, retry, expiry, 0) {
			t.Fatalf("record %d not kept below the bound", i)
		}
	}
	if d.decided(key(-1), 1, retry, 2000, 500) {
		t.Fatal("a new call's record kept past the bound with none expired")
	}
	if got := d.dropped.Load(); got != 1 {
		t.Errorf("not kept = %d, want 1", got)
	}
	if !d.decided(key(0), 2, policy.Answer{}, 2000, 500) || d.get(key(0)).Attempt != 2 {
		t.Errorf("a kept call's later attempt: %+v; want attempt 2 kept at the bound", d.get(key(0)))
	}
	d.decided(key(0), 1, retry, 2000, 500)
	if a := d.get(key(0)); a.Attempt != 2 || a.Answer.Retry {
		t.Errorf("an earlier attempt rewound the record to %+v", a)
	}
	if !d.decided(key(-1), 1, retry, 2000, 1500) {
		t.Fatal("a new call's record not kept once some had expired")
	}
	if want := maxDownAttempts - 9 + 1; d.len() != want { // c1-c9 expired and forgotten (c0 lives on to 2000), one added
		t.Errorf("kept = %d, want %d", d.len(), want)
	}
	if got := d.get(key(5)); got != (fleet.Attempts{}) {
		t.Errorf("an expired record is still kept: %+v", got)
	}
	d.written(downAttempt{key(0), fleet.Attempts{Attempt: 1}})
	if d.get(key(0)).Attempt != 2 {
		t.Error("written of attempt 1 forgot the later attempt 2 kept since")
	}
	d.written(downAttempt{key(0), fleet.Attempts{Attempt: 2}})
	if d.get(key(0)).Attempt != 0 {
		t.Error("written of attempt 2 left it kept")
	}
}
