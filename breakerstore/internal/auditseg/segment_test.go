package auditseg

import (
	"fmt"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// TestBloomHashIsFNV1a pins the filter's hash: filters on disk were built
// with it, so it must be the same in every process and every version.
func TestBloomHashIsFNV1a(t *testing.T) {
	for _, tt := range []struct {
		kind byte
		name string
		want uint64
	}{
		{'c', "call-1", 0xb7afbf43d8c6cd8c}, // FNV-1a 64 of "c\x00call-1"
		{'t', "acme", 0x29fbd691d7bc5a23},   // FNV-1a 64 of "t\x00acme"
	} {
		if got := bloomHash(tt.kind, tt.name); got != tt.want {
			t.Errorf("bloomHash(%q, %q) = %#x, want %#x", tt.kind, tt.name, got, tt.want)
		}
		if got := bloomHash(tt.kind, []byte(tt.name)); got != tt.want {
			t.Errorf("bloomHash(%q, []byte(%q)) = %#x, want %#x", tt.kind, tt.name, got, tt.want)
		}
	}
}

// testEntries returns n records of distinct calls in key order, as entries.
func testEntries(n int) []Entry {
	recs := make([]policy.AuditRecord, n)
	for i := range recs {
		recs[i] = policy.AuditRecord{Time: time.Unix(0, 1e18+int64(i/3)), Seq: uint64(100 + i), Event: policy.AuditOutcome,
			Tenant: fmt.Sprint("tenant-", i%8), CallID: fmt.Sprint("call-", i), Attempt: 1, Detail: "attempt succeeded"}
	}
	return FromRecords(recs)
}

// TestBloomFilterFalsePositives checks that a full segment's filter holds
// every name and lets through about 1% of names it does not hold: a filter
// that says yes to everything would make every query decode every segment.
func TestBloomFilterFalsePositives(t *testing.T) {
	var w Encoder
	ents := testEntries(Max)
	h, err := ParseHeader(w.Encode(ents))
	if err != nil {
		t.Fatal(err)
	}
	if want := bloomSize(Max + 8); len(h.Bloom) != want {
		t.Errorf("filter: got %d bytes, want %d (sized for the distinct names)", len(h.Bloom), want)
	}
	for i := range Max {
		if !h.MayHold('c', fmt.Sprint("call-", i)) {
			t.Fatalf("call-%d missing from the filter", i)
		}
	}
	for i := range 8 {
		if !h.MayHold('t', fmt.Sprint("tenant-", i)) {
			t.Fatalf("tenant-%d missing from the filter", i)
		}
	}
	const probes = 20000
	fp := 0
	for i := range probes {
		if h.MayHold('c', fmt.Sprint("absent-", i)) {
			fp++
		}
	}
	rate := float64(fp) / probes
	t.Logf("false positives: %.2f%% of %d names", 100*rate, probes)
	if rate > 0.03 {
		t.Errorf("false positives: %.2f%%, want about 1%%", 100*rate)
	}
	if h.MayHold('t', "call-1") {
		t.Errorf("a call id matches as a tenant")
	}
}

// TestSegmentRoundTrip encodes records whose sequence numbers go down
// within a segment (a record stamped with an earlier time of its own) and
// reads them back.
func TestSegmentRoundTrip(t *testing.T) {
	recs := []policy.AuditRecord{
		{Time: time.Unix(0, 5), Seq: 10, CallID: "a", Tenant: "t"},
		{Time: time.Unix(0, 5), Seq: 11, CallID: "b"},
		{Time: time.Unix(0, 6), Seq: 3, Detail: "no names"},
		{Time: time.Unix(0, 1<<62), Seq: 1 << 63, CallID: "c", Tenant: "t"},
	}
	ents := FromRecords(recs)
	for i := range ents {
		ents[i].Body = EncodeRecord(ents[i].Rec)
	}
	var fromRecs Encoder
	want := fromRecs.Encode(ents)
	for i := range ents {
		ents[i].Rec = nil
	}
	var w Encoder
	v := w.Encode(ents)
	if string(v) != string(want) {
		t.Errorf("a segment encoded from bodies differs from one encoded from records:\n%x\n%x", v, want)
	}
	if _, err := Check(ents[0].Key.Bytes(), v, nil); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if _, err := Check(ents[0].Key.Bytes(), v, &Key{5, 10}); err == nil {
		t.Errorf("Check after an overlapping segment: got nil, want an error")
	}
	h, got, err := Entries(ents[0].Key.Bytes(), v)
	if err != nil {
		t.Fatal(err)
	}
	if h.Count != len(ents) || h.Last != ents[len(ents)-1].Key || len(got) != len(ents) {
		t.Fatalf("header: count %d last %v, %d records; want %d, %v", h.Count, h.Last, len(got), len(ents), ents[len(ents)-1].Key)
	}
	for i := range ents {
		if got[i].Key != ents[i].Key || string(got[i].Body) != string(ents[i].Body) {
			t.Errorf("record %d: got %v %x, want %v %x", i, got[i].Key, got[i].Body, ents[i].Key, ents[i].Body)
		}
	}
}

// TestMergeEntriesReplacesEqualKeys checks the merge of records into a
// segment.
func TestMergeEntriesReplacesEqualKeys(t *testing.T) {
	e := func(ns uint64, body string) Entry { return Entry{Key: Key{ns, 0}, Body: []byte(body)} }
	got := Merge([]Entry{e(1, "a"), e(3, "c"), e(5, "e")}, []Entry{e(2, "B"), e(3, "C"), e(6, "F")})
	var s string
	for _, g := range got {
		s += fmt.Sprint(g.Key.NS, string(g.Body), " ")
	}
	if want := "1a 2B 3C 5e 6F "; s != want {
		t.Errorf("merge: got %q, want %q", s, want)
	}
}

// FuzzSegment feeds arbitrary bytes to the segment decoders: they must
// never panic, and a segment Check accepts must read back the same
// through a query's path (header, filter, reader).
func FuzzSegment(f *testing.F) {
	var w Encoder
	ents := testEntries(5)
	f.Add(w.Encode(ents))
	f.Add(w.Encode(ents[:1]))
	f.Add([]byte{segVersion, 1})
	key := ents[0].Key.Bytes()
	f.Fuzz(func(t *testing.T, v []byte) {
		_, _, _ = Entries(key, v)
		if _, err := Check(key, v, nil); err != nil {
			return
		}
		h, err := ParseHeader(v)
		if err != nil {
			t.Fatalf("Check accepts what ParseHeader refuses: %v", err)
		}
		r := NewReader(KeyOf(key), &h)
		n := 0
		for {
			e, ok, err := r.Next()
			if err != nil {
				t.Fatalf("Check accepts what the reader refuses: %v", err)
			}
			if !ok {
				break
			}
			if _, _, ok := Names(e.Body); !ok {
				t.Fatalf("record %d: names do not decode", n)
			}
			n++
		}
		if n != h.Count {
			t.Fatalf("read %d records, header says %d", n, h.Count)
		}
	})
}

// TestRecordPrimaryTarget: a record with a primary target is of version 2
// and decodes with it; one without stays of version 1, the bytes a build
// before primary targets wrote.
func TestRecordPrimaryTarget(t *testing.T) {
	key := make([]byte, KeyLen)
	for _, tt := range []struct {
		name    string
		rec     policy.AuditRecord
		version byte
	}{
		{"none", policy.AuditRecord{Tenant: "acme", Target: "geo-a", CallID: "c", Attempt: 1, Detail: "d"}, 1},
		{"primary", policy.AuditRecord{Tenant: "acme", Target: "geo-b", CallID: "c", Attempt: 2, Detail: "d", PrimaryTarget: "geo-a"}, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := EncodeRecord(&tt.rec)
			if v[0] != tt.version || len(v) != RecordLen(&tt.rec) {
				t.Fatalf("encoded: version %d, %d bytes (RecordLen %d); want version %d", v[0], len(v), RecordLen(&tt.rec), tt.version)
			}
			got, err := DecodeRecord(key, v)
			if err != nil {
				t.Fatal(err)
			}
			got.Time, got.Seq = time.Time{}, 0
			if got != tt.rec {
				t.Fatalf("decoded %+v, want %+v", got, tt.rec)
			}
		})
	}
	// The bytes of version 1 as the build before wrote them.
	v1 := []byte{1, 0, 0, 0, 0, 1, 0, 4, 'a', 'c', 'm', 'e', 1, 'x', 1, 'c', 0, 0, 0}
	if got, err := DecodeRecord(key, v1); err != nil || got.Target != "x" || got.PrimaryTarget != "" {
		t.Fatalf("version 1 record: %+v, %v; want target x, no primary", got, err)
	}
}
