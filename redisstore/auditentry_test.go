package redisstore

import (
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// FuzzAuditEntry: whatever an entry's field holds, decodeAuditEntry
// returns a record or an error, never panics, and a record it returns
// packs back to the same bytes; a packed record decodes to itself.
func FuzzAuditEntry(f *testing.F) {
	full := policy.AuditRecord{Time: time.Unix(0, 1_764_547_200_123_456_789), Event: policy.AuditFinal,
		Tenant: "acme", Target: "geo-b", CallID: "doc-17", RunID: "run-1", Attempt: 3,
		Classification: "http:503", Verdict: policy.VerdictStop, Delay: -time.Millisecond,
		Stop: policy.StopAttemptsExhausted, Disposition: policy.DispositionDeadLetter,
		Detail: "max attempts (3) reached", PrimaryTarget: "geo-a"}
	f.Add(string(appendAuditEntry(nil, &full)))
	f.Add(string(appendAuditEntry(nil, &policy.AuditRecord{})))
	f.Add("")
	f.Add("\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff")
	f.Add("\x02")
	f.Fuzz(func(t *testing.T, v string) {
		r, err := decodeAuditEntry(v)
		if err != nil {
			return
		}
		if got := string(appendAuditEntry(nil, &r)); got != v {
			// Varints have one shortest form; a longer one decodes
			// but packs shorter. Anything else must round-trip.
			again, err := decodeAuditEntry(got)
			if err != nil || again != r {
				t.Fatalf("record %+v packs to %q, which decodes to %+v, %v", r, got, again, err)
			}
		}
	})
}

// TestAuditEntryRoundTrip: every field comes back, and a truncated or
// extended entry is refused.
func TestAuditEntryRoundTrip(t *testing.T) {
	r := policy.AuditRecord{Time: time.Unix(0, 1_764_547_200_123_456_789), Event: policy.AuditDecision,
		Tenant: "acme", Target: "geo-b", CallID: "doc-17", RunID: "run-1", Attempt: 70_000,
		Classification: "transport:timeout", Verdict: policy.VerdictRetry, Delay: 1500 * time.Millisecond,
		Detail: "retry after 1.5s (transport:timeout)", PrimaryTarget: "geo-a"}
	b := appendAuditEntry(nil, &r)
	got, err := decodeAuditEntry(string(b))
	if err != nil || got != r {
		t.Fatalf("decode(pack(r)) = %+v, %v; want %+v", got, err, r)
	}
	for n := range len(b) {
		if _, err := decodeAuditEntry(string(b[:n])); err == nil {
			t.Errorf("the first %d of %d bytes decode, want an error", n, len(b))
		}
	}
	if _, err := decodeAuditEntry(string(b) + "x"); err == nil {
		t.Error("an entry with a byte more decodes, want an error")
	}
}
