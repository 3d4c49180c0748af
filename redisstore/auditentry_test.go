package redisstore

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"

	"github.com/klauspost/compress/s2"
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
		if n, want := auditRecordSize(&r, nil), len(appendAuditEntry(nil, &r)); n != want {
			t.Fatalf("auditRecordSize(%+v) = %d, want %d", r, n, want)
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

// FuzzAuditChunk: whatever an entry's field "b" (or "z") holds and
// whatever count its field "n" says, decodeAuditChunk (after
// decompressAuditChunk) returns its records or an error, never panics; records it returns are as many as n says, numbered from
// the entry's Seq, and pack back to a chunk that decodes to them; packed
// records decode to themselves.
func FuzzAuditChunk(f *testing.F) {
	recs := []policy.AuditRecord{{Time: time.Unix(0, 1_764_547_200_123_456_789), Event: policy.AuditFinal,
		Tenant: "acme", Target: "geo-b", CallID: "doc-17", Attempt: 3, Detail: "max attempts (3) reached",
		PrimaryTarget: "geo-a"}, {}, {Tenant: "acme", CallID: "doc-18", Delay: time.Second}}
	f.Add(string(appendAuditChunk(nil, recs)), 3)
	f.Add(string(appendAuditChunk(nil, recs[:1])), 1)
	f.Add(string(appendAuditChunk(nil, recs)), 2)
	f.Add("", 0)
	f.Add("\x01\x05\x01", 1)
	f.Add("\x80\x08", 1024)
	f.Add(string(s2.Encode(nil, appendAuditChunk(nil, recs))), 3)
	f.Fuzz(func(t *testing.T, v string, n int) {
		const seq = 7 << 20
		if b, err := decompressAuditChunk(v); err == nil { // as a field z
			if len(b) > maxAuditChunkBytes {
				t.Fatalf("a field z of %d bytes decompresses to %d, past the bound", len(v), len(b))
			}
			_, _ = decodeAuditChunk(nil, b, n, seq)
		}
		got, err := decodeAuditChunk(nil, v, n, seq)
		if err != nil {
			return
		}
		if len(got) != n {
			t.Fatalf("a chunk said to hold %d records decodes to %d", n, len(got))
		}
		for i, r := range got {
			if r.Seq != seq+uint64(i) {
				t.Fatalf("record %d: Seq %d, want %d", i, r.Seq, seq+uint64(i))
			}
		}
		again, err := decodeAuditChunk(nil, string(appendAuditChunk(nil, got)), n, seq)
		if err != nil || !slices.Equal(again, got) {
			t.Fatalf("records %+v pack to a chunk that decodes to %+v, %v", got, again, err)
		}
	})
}

// TestAuditChunkRoundTrip: a chunk of up to maxAuditChunk records decodes
// to them, numbered from the entry's Seq; a chunk truncated, extended, of
// another count or of more records is refused.
func TestAuditChunkRoundTrip(t *testing.T) {
	recs := make([]policy.AuditRecord, maxAuditChunk+1)
	for i := range recs {
		recs[i] = policy.AuditRecord{Time: time.Unix(0, int64(i)), Tenant: "acme", CallID: "doc", Attempt: uint32(i),
			Seq: 5<<20 + uint64(i)}
	}
	b := appendAuditChunk(nil, recs[:maxAuditChunk])
	got, err := decodeAuditChunk(nil, string(b), maxAuditChunk, 5<<20)
	if err != nil || !slices.Equal(got, recs[:maxAuditChunk]) {
		t.Fatalf("decode(pack(%d records)) = %d records, %v; want them", maxAuditChunk, len(got), err)
	}
	small := appendAuditChunk(nil, recs[:3])
	for n := range len(small) {
		if _, err := decodeAuditChunk(nil, string(small[:n]), 3, 0); err == nil {
			t.Errorf("the first %d of %d bytes decode, want an error", n, len(small))
		}
	}
	for name, c := range map[string]struct {
		v string
		n int
	}{
		"a byte more":     {string(small) + "x", 3},
		"another count":   {string(small), 2},
		"more than 1,024": {string(appendAuditChunk(nil, recs)), maxAuditChunk + 1},
	} {
		if _, err := decodeAuditChunk(nil, c.v, c.n, 0); err == nil {
			t.Errorf("%s: decodes, want an error", name)
		}
	}
}

// TestAuditPackerPacksChunks: the packer's chunks are each one tenant's
// records in their order, at most maxAuditChunk and auditChunkBytes (but
// for one record larger alone), their bodies what appendAuditChunk packs,
// compressed (field z) where that makes one of auditCompressMin bytes or
// more smaller, and a second pack with the buffers reused does the same.
func TestAuditPackerPacksChunks(t *testing.T) {
	var recs []policy.AuditRecord
	for i := range 5000 {
		r := policy.AuditRecord{Time: time.Unix(0, int64(1_764_547_200_000_000_000+i*1000)), Event: policy.AuditOutcome,
			Tenant: []string{"acme", "beta", "gamma"}[i%3], Target: []string{"geo", "geo-b"}[i%7/5], CallID: "call-" + string(rune('a'+i%26)),
			Attempt: uint32(1 + i%3), Detail: strings.Repeat("d", i%50)}
		if i == 77 {
			r.Detail = strings.Repeat("x", auditChunkBytes) // larger than a chunk alone
		}
		recs = append(recs, r)
	}
	var w auditPacker
	for round := range 2 {
		compressed := 0
		chunks := w.pack(recs[round*100:])
		next := map[string]int{} // tenant -> index in recs of its next record
		for _, c := range chunks {
			var want []policy.AuditRecord
			for i := max(next[c.tenant], round*100); len(want) < c.n && i < len(recs); i++ {
				if recs[i].Tenant == c.tenant {
					want = append(want, recs[i])
					next[c.tenant] = i + 1
				}
			}
			body := string(c.body)
			switch c.field {
			case auditZChunkField:
				var err error
				if body, err = decompressAuditChunk(body); err != nil {
					t.Fatalf("round %d: chunk of %d records of %s: field z does not decompress: %v", round, c.n, c.tenant, err)
				}
				if len(c.body) >= len(body) {
					t.Errorf("round %d: chunk of %d records compressed to %d bytes from %d", round, c.n, len(c.body), len(body))
				}
				compressed++
			case auditChunkField:
				if len(c.body) >= auditCompressMin && len(s2.Encode(nil, c.body)) < len(c.body) {
					t.Errorf("round %d: a chunk of %d bytes that compresses sent as it is", round, len(c.body))
				}
			default:
				t.Fatalf("round %d: chunk field %q", round, c.field)
			}
			if got := appendAuditChunk(nil, want); string(got) != body {
				t.Fatalf("round %d: chunk of %d records of %s: body differs from appendAuditChunk of them", round, c.n, c.tenant)
			}
			if c.n > maxAuditChunk || c.n > 1 && len(body) > auditChunkBytes {
				t.Errorf("round %d: a chunk of %d records in %d bytes", round, c.n, len(body))
			}
		}
		if compressed == 0 {
			t.Errorf("round %d: no chunk of %d compressed", round, len(chunks))
		}
	}
}
