package breakerstore

import (
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// FuzzDecodeAudit feeds arbitrary bytes to the audit record decoder: it must
// never panic, and whatever it accepts must survive an encode and decode.
func FuzzDecodeAudit(f *testing.F) {
	rec := policy.AuditRecord{Event: policy.AuditDecision, Tenant: "acme", Target: "geo", CallID: "c", RunID: "r",
		Attempt: 2, Classification: "transient:503", Verdict: policy.VerdictRetry, Delay: time.Second, Detail: "retry after 1s"}
	f.Add(encodeAudit(&rec))
	f.Add(encodeAudit(&policy.AuditRecord{}))
	f.Add([]byte{})
	f.Add([]byte{1, 2, 1, 0, 0, 0x80})
	key := akey{ns: 1e18, seq: 7}.bytes()
	f.Fuzz(func(t *testing.T, v []byte) {
		got, err := decodeAudit(key, v)
		if err != nil {
			return
		}
		again, err := decodeAudit(key, encodeAudit(&got))
		if err != nil || again != got {
			t.Errorf("decode, encode, decode: got %+v, %v; want %+v", again, err, got)
		}
	})
}
