package redisstore

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/policyd/policyd/policy"
)

// An audit stream entry holds a chunk of one tenant's records, up to
// maxAuditChunk of them, in two fields: "n", their count in decimal (the
// library trims by it), and "b", packed by appendAuditChunk: the count as
// a uvarint, then each record as a uvarint length and that many bytes of
// appendAuditEntry. Record i of the entry with id ms-seq has the Seq
// ms<<20 | (seq+i): the library gives an entry of n records an id whose
// sequence leaves the n-1 after it free (policyd.lua's audit), so Seqs
// are unique and ordered across entries and within one, and the Seq of a
// record tells the entry to read from (auditResumeID).
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
	auditChunkField = "b"
	auditCountField = "n"
	auditEntryField = "r"
	auditEntryV1    = 1
	// maxAuditChunk is the most records one entry holds.
	maxAuditChunk = 1024
)

// errAuditEntry is a stream entry that does not decode.
var errAuditEntry = errors.New("redisstore: audit entry does not decode")

// appendAuditEntry appends r, packed, to b.
func appendAuditEntry(b []byte, r *policy.AuditRecord) []byte {
	b = append(b, auditEntryV1)
	b = binary.AppendVarint(b, r.Time.UnixNano())
	b = binary.AppendUvarint(b, uint64(r.Event))
	b = binary.AppendUvarint(b, uint64(r.Attempt))
	b = binary.AppendUvarint(b, uint64(r.Verdict))
	b = binary.AppendVarint(b, int64(r.Delay))
	b = binary.AppendUvarint(b, uint64(r.Stop))
	b = binary.AppendUvarint(b, uint64(r.Disposition))
	for _, s := range [...]string{r.Tenant, r.Target, r.CallID, r.RunID, r.Classification, r.Detail, r.PrimaryTarget} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

// auditEntrySize is the length of appendAuditEntry(nil, r).
func auditEntrySize(r *policy.AuditRecord) int {
	n := 1 + varintLen(r.Time.UnixNano()) + uvarintLen(uint64(r.Event)) + uvarintLen(uint64(r.Attempt)) +
		uvarintLen(uint64(r.Verdict)) + varintLen(int64(r.Delay)) + uvarintLen(uint64(r.Stop)) +
		uvarintLen(uint64(r.Disposition))
	for _, s := range [...]string{r.Tenant, r.Target, r.CallID, r.RunID, r.Classification, r.Detail, r.PrimaryTarget} {
		n += uvarintLen(uint64(len(s))) + len(s)
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
	for i := range recs {
		b = binary.AppendUvarint(b, uint64(auditEntrySize(&recs[i])))
		b = appendAuditEntry(b, &recs[i])
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
	for i := range n {
		l := d.uvarint()
		if d.bad || l > uint64(len(d.s)) {
			return dst, errAuditEntry
		}
		r, err := decodeAuditEntry(d.s[:l])
		if err != nil {
			return dst, err
		}
		d.s = d.s[l:]
		r.Seq = seq + uint64(i)
		dst = append(dst, r)
	}
	if d.s != "" {
		return dst, errAuditEntry
	}
	return dst, nil
}

// decodeAuditEntry reads a record appendAuditEntry packed; Seq is left to
// the caller (the entry id).
func decodeAuditEntry(v string) (policy.AuditRecord, error) {
	d := entryDecoder{s: v}
	if d.byte() != auditEntryV1 {
		return policy.AuditRecord{}, errAuditEntry
	}
	var r policy.AuditRecord
	r.Time = time.Unix(0, d.varint())
	r.Event = policy.AuditEvent(d.small())
	r.Attempt = uint32(min(d.uvarint(), 1<<32-1))
	r.Verdict = policy.Verdict(d.small())
	r.Delay = time.Duration(d.varint())
	r.Stop = policy.StopReason(d.small())
	r.Disposition = policy.Disposition(d.small())
	for _, s := range [...]*string{&r.Tenant, &r.Target, &r.CallID, &r.RunID, &r.Classification, &r.Detail, &r.PrimaryTarget} {
		*s = d.str()
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
