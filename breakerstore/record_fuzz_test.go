package breakerstore

import (
	"bytes"
	"testing"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// FuzzDecodeBreaker feeds arbitrary bytes to the breaker record decoder: it
// must never panic, whatever it accepts of the current version must encode
// back to the same bytes, and a version 1 record must re-encode to one that
// decodes to the same breaker.
func FuzzDecodeBreaker(f *testing.F) {
	b := &breaker{v: fleet.Breaker{State: policy.BreakerHalfOpen, Forced: true, Mode: 2, OpenUntil: 5, Changed: 7,
		Cooldown: fleet.Cooldown{Until: 9}, Consecutive: 3, HalfOpenOK: 1, SlotWidth: 6e9, Generation: 11,
		Permits: []fleet.Permit{{ID: fleet.PermitID{1, 2, 3}, Expiry: 2}}}}
	b.v.Slots[3] = fleet.Slot{Epoch: 42, Calls: 10, Failures: 4}
	f.Add(b.encode())
	f.Add((&breaker{v: fleet.Breaker{State: policy.BreakerClosed}}).encode())
	f.Add(append(append([]byte{breakerRecordV1, 3}, make([]byte, breakerFixedLenV1-4)...), 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2))
	f.Add([]byte{})
	f.Add([]byte{1, 9, 0, 0})
	f.Fuzz(func(t *testing.T, v []byte) {
		var got breaker
		if err := decodeBreaker(&got, v); err != nil {
			return
		}
		enc := got.encode()
		if v[0] == breakerRecordV2 && !bytes.Equal(enc, v) {
			t.Errorf("decode then encode: got %x, want %x", enc, v)
		}
		var again breaker
		if err := decodeBreaker(&again, enc); err != nil {
			t.Fatalf("decode of an encoded record: %v", err)
		}
		if !bytes.Equal(again.encode(), enc) {
			t.Errorf("re-encode of %x changed it", enc)
		}
	})
}

// FuzzDecodeFlow feeds arbitrary bytes to the flow record decoder: it must
// never panic, whatever it accepts of the current version must encode back
// to the same bytes, and a version 1 record must re-encode to a version 2
// one that decodes to the same flow state.
func FuzzDecodeFlow(f *testing.F) {
	full := fleet.Flow{Rate: fleet.Rate{TAT: 5}, Pool: fleet.Pool{Stray: 3, Leases: []fleet.Lease{{ID: fleet.PermitID{1, 2}, Expiry: 9}}},
		Adaptive: fleet.AdaptiveLimit{Limit: 7.5, LastDecrease: 4, Since: 2, Decreases: 1}}
	f.Add(encodeFlow(&full))
	f.Add(encodeFlow(&fleet.Flow{}))
	f.Add(append([]byte{flowRecordV1}, make([]byte, flowHeaderV1-1)...))
	f.Add([]byte{})
	f.Add([]byte{2, 0, 0})
	f.Fuzz(func(t *testing.T, v []byte) {
		got, err := decodeFlow(v)
		if err != nil {
			return
		}
		enc := encodeFlow(&got)
		if v[0] == flowRecordV2 && !bytes.Equal(enc, v) {
			t.Errorf("decode then encode: got %x, want %x", enc, v)
		}
		again, err := decodeFlow(enc)
		if err != nil {
			t.Fatalf("decode of an encoded record: %v", err)
		}
		if !bytes.Equal(encodeFlow(&again), enc) {
			t.Errorf("re-encode of %x changed it", enc)
		}
	})
}
