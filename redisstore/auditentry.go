package redisstore

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/klauspost/compress/s2"

	"github.com/policyd/policyd/policy"
)

// An audit stream entry holds a chunk of one tenant's records, up to
// maxAuditChunk of them, in two fields: "n", their count in decimal (the
// library trims by it), and "b", packed by appendAuditChunk: the count as
// a uvarint, then each record as a uvarint length and that many bytes of
// appendAuditRecord: the first as appendAuditEntry packs it, each other
// one after the record before it (the strings equal to its left out). Record i of the entry with id ms-seq has the Seq
// ms<<20 | (seq+i): the library gives an entry of n records an id whose
// sequence leaves the n-1 after it free (policyd.lua's audit), so Seqs
// are unique and ordered across entries and within one, and the Seq of a
// record tells the entry to read from (auditResumeID).
//
// A chunk of at least auditCompressMin bytes is sent compressed when
// that makes it smaller: field "z" in place of "b", holding the S2 block
// (klauspost/compress/s2, the block format: its decoded length, then the
// blocks) of what "b" would hold.
//
// Entries written before chunks hold one record each, with the Seq of
// their id: one field, "r", the record packed by appendAuditEntry, or,
// before that, one field an attribute (decodeAuditFields).
//
// A record is packed by appendAuditEntry: a version byte (auditEntryV1),
// then the numbers as varints and the strings as a uvarint length and
// their bytes, in the order below. One field, not one per attribute: a
// replica encodes a flush's records into one buffer with no allocation
// per field, and the engine stores and returns one value an entry.
// Written by hand, as breakerstore's audit segments are: no library packs
// a record of this shape with less work, and the format is this file's
// to keep.
const (
	auditChunkField  = "b"
	auditZChunkField = "z"
	auditCountField  = "n"
	auditEntryField  = "r"
	auditEntryV1     = 1
	auditEntryDelta  = 2 // a record after the first of its chunk (appendAuditRecord)
	// maxAuditChunk is the most records one entry holds.
	maxAuditChunk = 1024
)

// errAuditEntry is a stream entry that does not decode.
var errAuditEntry = errors.New("redisstore: audit entry does not decode")

// maxAuditChunkBytes bounds what a field "z" may say it decodes to,
// checked before it is decoded, so a damaged entry cannot make a reader
// allocate more: a chunk is at most auditChunkBytes but for one record
// larger alone, and a record is a few names the server bounds and a
// detail, far below this.
const maxAuditChunkBytes = 64 << 20

// decompressAuditChunk returns the field "b" that field "z" z holds; a
// block that does not decode, or says it decodes to more than
// maxAuditChunkBytes, is errAuditEntry.
func decompressAuditChunk(z string) (string, error) {
	src := []byte(z)
	n, err := s2.DecodedLen(src)
	if err != nil || n > maxAuditChunkBytes {
		return "", errAuditEntry
	}
	b, err := s2.Decode(make([]byte, n), src)
	if err != nil {
		return "", errAuditEntry
	}
	return string(b), nil
}

// appendAuditEntry appends r, packed, to b.
func appendAuditEntry(b []byte, r *policy.AuditRecord) []byte { return appendAuditRecord(b, r, nil) }

// appendAuditRecord appends r packed after prev, the record before it in
// its chunk (nil for the first, or a record alone): without prev as
// appendAuditEntry packs it; with prev a version byte auditEntryDelta, a
// byte whose bit i says the i-th string equals prev's (and is left out),
// the time as a varint difference from prev's, the other numbers, and the
// strings not left out. A chunk's records share their tenant and most of
// their targets, classifications and details: each costs Redis and its
// AOF about a third of its bytes alone.
func appendAuditRecord(b []byte, r, prev *policy.AuditRecord) []byte {
	strs := auditStrings(r)
	t := r.Time.UnixNano()
	var same byte
	if prev == nil {
		b = append(b, auditEntryV1)
	} else {
		ps := auditStrings(prev)
		for i := range strs {
			if strs[i] == ps[i] {
				same |= 1 << i
			}
		}
		b = append(b, auditEntryDelta, same)
		t -= prev.Time.UnixNano()
	}
	b = binary.AppendVarint(b, t)
	b = binary.AppendUvarint(b, uint64(r.Event))
	b = binary.AppendUvarint(b, uint64(r.Attempt))
	b = binary.AppendUvarint(b, uint64(r.Verdict))
	b = binary.AppendVarint(b, int64(r.Delay))
	b = binary.AppendUvarint(b, uint64(r.Stop))
	b = binary.AppendUvarint(b, uint64(r.Disposition))
	for i, s := range strs {
		if same&(1<<i) == 0 {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	return b
}

// auditStrings are r's strings in the order they are packed.
func auditStrings(r *policy.AuditRecord) [7]string {
	return [...]string{r.Tenant, r.Target, r.CallID, r.RunID, r.Classification, r.Detail, r.PrimaryTarget}
}

// auditRecordSize is the length of appendAuditRecord(nil, r, prev).
func auditRecordSize(r, prev *policy.AuditRecord) int {
	strs := auditStrings(r)
	t := r.Time.UnixNano()
	n := 1
	var ps [7]string
	if prev != nil {
		ps = auditStrings(prev)
		t -= prev.Time.UnixNano()
		n++
	}
	n += varintLen(t) + uvarintLen(uint64(r.Event)) + uvarintLen(uint64(r.Attempt)) +
		uvarintLen(uint64(r.Verdict)) + varintLen(int64(r.Delay)) + uvarintLen(uint64(r.Stop)) +
		uvarintLen(uint64(r.Disposition))
	for i, s := range strs {
		if prev == nil || s != ps[i] {
			n += uvarintLen(uint64(len(s))) + len(s)
		}
	}
	return n
}

// uvarintLen is the length of x as binary.AppendUvarint writes it.
func uvarintLen(x uint64) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// varintLen is the length of x as binary.AppendVarint writes it.
func varintLen(x int64) int {
	ux := uint64(x) << 1
	if x < 0 {
		ux = ^ux
	}
	return uvarintLen(ux)
}

// appendAuditChunk appends recs (at most maxAuditChunk), packed as an
// entry's field "b", to b.
func appendAuditChunk(b []byte, recs []policy.AuditRecord) []byte {
	b = binary.AppendUvarint(b, uint64(len(recs)))
	var prev *policy.AuditRecord
	for i := range recs {
		b = binary.AppendUvarint(b, uint64(auditRecordSize(&recs[i], prev)))
		b = appendAuditRecord(b, &recs[i], prev)
		prev = &recs[i]
	}
	return b
}

// decodeAuditChunk appends the records of field "b" v, whose entry says
// it holds n, to dst, with the Seqs from seq on; a chunk that does not
// decode, holds another count or more than maxAuditChunk records is
// errAuditEntry.
func decodeAuditChunk(dst []policy.AuditRecord, v string, n int, seq uint64) ([]policy.AuditRecord, error) {
	d := entryDecoder{s: v}
	if c := d.uvarint(); d.bad || c != uint64(n) || n < 1 || n > maxAuditChunk {
		return dst, errAuditEntry
	}
	var prev policy.AuditRecord
	for i := range n {
		l := d.uvarint()
		if d.bad || l > uint64(len(d.s)) {
			return dst, errAuditEntry
		}
		p := &prev
		if i == 0 {
			p = nil
		}
		r, err := decodeAuditRecord(d.s[:l], p)
		if err != nil {
			return dst, err
		}
		d.s = d.s[l:]
		r.Seq = seq + uint64(i)
		dst = append(dst, r)
		prev = r
	}
	if d.s != "" {
		return dst, errAuditEntry
	}
	return dst, nil
}

// decodeAuditEntry reads a record appendAuditEntry packed; Seq is left to
// the caller (the entry id).
func decodeAuditEntry(v string) (policy.AuditRecord, error) { return decodeAuditRecord(v, nil) }

// decodeAuditRecord reads a record appendAuditRecord packed after prev
// (nil: one packed alone, or the first of its chunk); Seq is left to the
// caller.
func decodeAuditRecord(v string, prev *policy.AuditRecord) (policy.AuditRecord, error) {
	d := entryDecoder{s: v}
	var same byte
	var base int64
	switch ver := d.byte(); {
	case ver == auditEntryV1 && prev == nil:
	case ver == auditEntryDelta && prev != nil:
		same, base = d.byte(), prev.Time.UnixNano()
		if same >= 1<<7 {
			return policy.AuditRecord{}, errAuditEntry
		}
	default:
		return policy.AuditRecord{}, errAuditEntry
	}
	var r policy.AuditRecord
	r.Time = time.Unix(0, base+d.varint())
	r.Event = policy.AuditEvent(d.small())
	r.Attempt = uint32(min(d.uvarint(), 1<<32-1))
	r.Verdict = policy.Verdict(d.small())
	r.Delay = time.Duration(d.varint())
	r.Stop = policy.StopReason(d.small())
	r.Disposition = policy.Disposition(d.small())
	var ps [7]string
	if prev != nil {
		ps = auditStrings(prev)
	}
	for i, s := range [...]*string{&r.Tenant, &r.Target, &r.CallID, &r.RunID, &r.Classification, &r.Detail, &r.PrimaryTarget} {
		if same&(1<<i) != 0 {
			*s = ps[i]
		} else {
			*s = d.str()
		}
	}
	if d.bad || d.s != "" {
		return policy.AuditRecord{}, errAuditEntry
	}
	return r, nil
}

// entryDecoder reads an entry's fields off s; bad is set, and s emptied,
// at the first field that does not decode.
type entryDecoder struct {
	s   string
	bad bool
}

func (d *entryDecoder) fail() { d.bad, d.s = true, "" }

func (d *entryDecoder) byte() byte {
	if d.s == "" {
		d.fail()
		return 0
	}
	c := d.s[0]
	d.s = d.s[1:]
	return c
}

func (d *entryDecoder) uvarint() uint64 {
	var x uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if d.s == "" {
			break
		}
		c := d.s[0]
		d.s = d.s[1:]
		x |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return x
		}
	}
	d.fail()
	return 0
}

func (d *entryDecoder) varint() int64 {
	u := d.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

// small reads an enum's number, which fits a byte.
func (d *entryDecoder) small() uint8 {
	u := d.uvarint()
	if u > 255 {
		d.fail()
	}
	return uint8(u)
}

func (d *entryDecoder) str() string {
	n := d.uvarint()
	if n > uint64(len(d.s)) {
		d.fail()
		return ""
	}
	s := d.s[:n]
	d.s = d.s[n:]
	return s
}
