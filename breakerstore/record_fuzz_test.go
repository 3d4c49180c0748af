package breakerstore

import (
	"bytes"
	"testing"

	"github.com/policyd/policyd/policy"
)

// FuzzDecodeBreaker feeds arbitrary bytes to the breaker record decoder: it
// must never panic, and whatever it accepts must encode back to the same bytes.
func FuzzDecodeBreaker(f *testing.F) {
	b := &breaker{state: policy.BreakerHalfOpen, forced: true, mode: 2, openUntil: 5, changed: 7, cooldownUntil: 9,
		consecutive: 3, halfOpenOK: 1, slotWidth: 6e9, permits: []permit{{id: 1, expiry: 2}}}
	b.slots[3] = slot{epoch: 42, calls: 10, failures: 4}
	f.Add(b.encode())
	f.Add((&breaker{state: policy.BreakerClosed}).encode())
	f.Add([]byte{})
	f.Add([]byte{1, 9, 0, 0})
	f.Fuzz(func(t *testing.T, v []byte) {
		var got breaker
		if err := decodeBreaker(&got, v); err != nil {
			return
		}
		if enc := got.encode(); !bytes.Equal(enc, v) {
			t.Errorf("decode then encode: got %x, want %x", enc, v)
		}
	})
}
