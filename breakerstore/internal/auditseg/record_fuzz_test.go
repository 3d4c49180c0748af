package auditseg

import (
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// FuzzDecodeRecord feeds arbitrary bytes to the audit record decoder: it must
// never panic, and whatever it accepts must survive an encode and decode.
func FuzzDecodeRecord(f *testing.F) {
	rec := policy.AuditRecord{Event: policy.AuditDecision, Tenant: "acme", Target: "geo", CallID: "c", RunID: "r",
		Attempt: 2, Classification: "transient:503", Verdict: policy.VerdictRetry, Delay: time.Second, Detail: "retry after 1s"}
	f.Add(EncodeRecord(&rec))
	f.Add(EncodeRecord(&policy.AuditRecord{}))
	f.Add([]byte{})
	f.Add([]byte{1, 2, 1, 0, 0, 0x80})
	key := Key{NS: 1e18, Seq: 7}.Bytes()
	f.Fuzz(func(t *testing.T, v []byte) {
		got, err := DecodeRecord(key, v)
		if err != nil {
			return
		}
		again, err := DecodeRecord(key, EncodeRecord(&got))
		if err != nil || again != got {
			t.Errorf("decode, encode, decode: got %+v, %v; want %+v", again, err, got)
		}
	})
}
