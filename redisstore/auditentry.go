package redisstore

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/policyd/policyd/policy"
)

// An audit stream entry holds one record in one field, "r", packed by
// appendAuditEntry: a version byte (auditEntryV1), then the numbers as
// varints and the strings as a uvarint length and their bytes, in the
// order below. One field, not one per attribute: a replica encodes a
// flush's records into one buffer with no allocation per field, and the
// engine stores and returns one value an entry. Written by hand, as
// breakerstore's audit segments are: no library packs a record of this
// shape with less work, and the format is this file's to keep.
const (
	auditEntryField = "r"
	auditEntryV1    = 1
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
