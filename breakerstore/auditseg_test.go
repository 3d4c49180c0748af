package breakerstore

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
func testEntries(n int) []segEntry {
	recs := make([]policy.AuditRecord, n)
	for i := range recs {
		recs[i] = policy.AuditRecord{Time: time.Unix(0, 1e18+int64(i/3)), Seq: uint64(100 + i), Event: policy.AuditOutcome,
			Tenant: fmt.Sprint("tenant-", i%8), CallID: fmt.Sprint("call-", i), Attempt: 1, Detail: "attempt succeeded"}
	}
	return auditEntries(recs)
}

// TestBloomFilterFalsePositives checks that a full segment's filter holds
// every name and lets through about 1% of names it does not hold: a filter
// that says yes to everything would make every query decode every segment.
func TestBloomFilterFalsePositives(t *testing.T) {
	var w segEncoder
	ents := testEntries(segMax)
	h, err := parseSegHeader(w.encode(ents))
	if err != nil {
		t.Fatal(err)
	}
	if want := bloomSize(segMax + 8); len(h.bloom) != want {
		t.Errorf("filter: got %d bytes, want %d (sized for the distinct names)", len(h.bloom), want)
	}
	for i := range segMax {
		if !h.mayHold('c', fmt.Sprint("call-", i)) {
			t.Fatalf("call-%d missing from the filter", i)
		}
	}
	for i := range 8 {
		if !h.mayHold('t', fmt.Sprint("tenant-", i)) {
			t.Fatalf("tenant-%d missing from the filter", i)
		}
	}
	const probes = 20000
	fp := 0
	for i := range probes {
		if h.mayHold('c', fmt.Sprint("absent-", i)) {
			fp++
		}
	}
	rate := float64(fp) / probes
	t.Logf("false positives: %.2f%% of %d names", 100*rate, probes)
	if rate > 0.03 {
		t.Errorf("false positives: %.2f%%, want about 1%%", 100*rate)
	}
	if h.mayHold('t', "call-1") {
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
	ents := auditEntries(recs)
	for i := range ents {
		ents[i].body = encodeAudit(ents[i].rec)
	}
	var fromRecs segEncoder
	want := fromRecs.encode(ents)
	for i := range ents {
		ents[i].rec = nil
	}
	var w segEncoder
	v := w.encode(ents)
	if string(v) != string(want) {
		t.Errorf("a segment encoded from bodies differs from one encoded from records:\n%x\n%x", v, want)
	}
	if _, err := checkSegment(ents[0].key.bytes(), v, nil); err != nil {
		t.Fatalf("checkSegment: %v", err)
	}
	if _, err := checkSegment(ents[0].key.bytes(), v, &akey{5, 10}); err == nil {
		t.Errorf("checkSegment after an overlapping segment: got nil, want an error")
	}
	h, got, err := segEntries(ents[0].key.bytes(), v)
	if err != nil {
		t.Fatal(err)
	}
	if h.count != len(ents) || h.last != ents[len(ents)-1].key || len(got) != len(ents) {
		t.Fatalf("header: count %d last %v, %d records; want %d, %v", h.count, h.last, len(got), len(ents), ents[len(ents)-1].key)
	}
	for i := range ents {
		if got[i].key != ents[i].key || string(got[i].body) != string(ents[i].body) {
			t.Errorf("record %d: got %v %x, want %v %x", i, got[i].key, got[i].body, ents[i].key, ents[i].body)
		}
	}
}

// TestMergeEntriesReplacesEqualKeys checks the merge of records into a
// segment.
func TestMergeEntriesReplacesEqualKeys(t *testing.T) {
	e := func(ns uint64, body string) segEntry { return segEntry{key: akey{ns, 0}, body: []byte(body)} }
	got := mergeEntries([]segEntry{e(1, "a"), e(3, "c"), e(5, "e")}, []segEntry{e(2, "B"), e(3, "C"), e(6, "F")})
	var s string
	for _, g := range got {
		s += fmt.Sprint(g.key.ns, string(g.body), " ")
	}
	if want := "1a 2B 3C 5e 6F "; s != want {
		t.Errorf("merge: got %q, want %q", s, want)
	}
}

// FuzzSegment feeds arbitrary bytes to the segment decoders: they must
// never panic, and a segment checkSegment accepts must read back the same
// through a query's path (header, filter, reader).
func FuzzSegment(f *testing.F) {
	var w segEncoder
	ents := testEntries(5)
	f.Add(w.encode(ents))
	f.Add(w.encode(ents[:1]))
	f.Add([]byte{segVersion, 1})
	key := ents[0].key.bytes()
	f.Fuzz(func(t *testing.T, v []byte) {
		_, _, _ = segEntries(key, v)
		if _, err := checkSegment(key, v, nil); err != nil {
			return
		}
		h, err := parseSegHeader(v)
		if err != nil {
			t.Fatalf("checkSegment accepts what parseSegHeader refuses: %v", err)
		}
		r := newSegReader(keyOf(key), &h)
		n := 0
		for {
			e, ok, err := r.next()
			if err != nil {
				t.Fatalf("checkSegment accepts what the reader refuses: %v", err)
			}
			if !ok {
				break
			}
			if _, _, ok := auditNames(e.body); !ok {
				t.Fatalf("record %d: names do not decode", n)
			}
			n++
		}
		if n != h.count {
			t.Fatalf("read %d records, header says %d", n, h.count)
		}
	})
}
