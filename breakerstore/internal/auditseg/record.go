package auditseg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/policyd/policyd/policy"
)

// KeyLen is the length of a record key: time and sequence number.
const KeyLen = 16

// Version bytes of an encoded record: 1, or 2 for a record with a primary
// target (an attempt sent to a fallback), which appends it.
const (
	recordVersion        = 1
	recordVersionPrimary = 2
)

// EncodeRecord encodes a record without its key: version 1 (2 with a
// primary target), event, verdict, stop reason, disposition (a byte each),
// attempt (uvarint), delay in nanoseconds (varint), then tenant, target,
// call id, run id, classification and detail and, in version 2, the
// primary target, each a uvarint length and its bytes.
func EncodeRecord(rec *policy.AuditRecord) []byte {
	return AppendRecord(make([]byte, 0, RecordLen(rec)), rec)
}

// AppendRecord appends rec encoded as EncodeRecord does to b.
func AppendRecord(b []byte, rec *policy.AuditRecord) []byte {
	version := byte(recordVersion)
	if rec.PrimaryTarget != "" {
		version = recordVersionPrimary
	}
	b = append(b, version, byte(rec.Event), byte(rec.Verdict), byte(rec.Stop), byte(rec.Disposition))
	b = binary.AppendUvarint(b, uint64(rec.Attempt))
	b = binary.AppendVarint(b, int64(rec.Delay))
	// Unrolled: a loop over an array of the six strings costs a group
	// commit a third more.
	b = appendString(b, rec.Tenant)
	b = appendString(b, rec.Target)
	b = appendString(b, rec.CallID)
	b = appendString(b, rec.RunID)
	b = appendString(b, rec.Classification)
	b = appendString(b, rec.Detail)
	if version == recordVersionPrimary {
		b = appendString(b, rec.PrimaryTarget)
	}
	return b
}

// appendString appends s's length as a uvarint and s.
func appendString(b []byte, s string) []byte {
	if len(s) < 0x80 {
		b = append(b, byte(len(s)))
	} else {
		b = binary.AppendUvarint(b, uint64(len(s)))
	}
	return append(b, s...)
}

// RecordLen is the length of rec encoded by EncodeRecord.
func RecordLen(rec *policy.AuditRecord) int {
	return 5 + uvarintLen(uint64(rec.Attempt)) + uvarintLen(zigzag(uint64(rec.Delay))) +
		uvarintLen(uint64(len(rec.Tenant))) + len(rec.Tenant) + uvarintLen(uint64(len(rec.Target))) + len(rec.Target) +
		uvarintLen(uint64(len(rec.CallID))) + len(rec.CallID) + uvarintLen(uint64(len(rec.RunID))) + len(rec.RunID) +
		uvarintLen(uint64(len(rec.Classification))) + len(rec.Classification) +
		uvarintLen(uint64(len(rec.Detail))) + len(rec.Detail) + primaryLen(rec)
}

// primaryLen is the length of rec's primary target as encoded, 0 in a
// record of version 1.
func primaryLen(rec *policy.AuditRecord) int {
	if rec.PrimaryTarget == "" {
		return 0
	}
	return uvarintLen(uint64(len(rec.PrimaryTarget))) + len(rec.PrimaryTarget)
}

// DecodeRecord decodes a record written by EncodeRecord under key k,
// copying every byte it keeps.
func DecodeRecord(k, v []byte) (policy.AuditRecord, error) {
	var rec policy.AuditRecord
	if len(k) != KeyLen {
		return rec, fmt.Errorf("key is %d bytes, want %d", len(k), KeyLen)
	}
	rec.Time = time.Unix(0, int64(binary.BigEndian.Uint64(k)))
	rec.Seq = binary.BigEndian.Uint64(k[8:])
	if len(v) < 5 || (v[0] != recordVersion && v[0] != recordVersionPrimary) {
		return rec, errors.New("not an audit record of version 1 or 2")
	}
	version := v[0]
	rec.Event, rec.Verdict = policy.AuditEvent(v[1]), policy.Verdict(v[2])
	rec.Stop, rec.Disposition = policy.StopReason(v[3]), policy.Disposition(v[4])
	v = v[5:]
	attempt, n := binary.Uvarint(v)
	if n <= 0 || attempt > math.MaxUint32 {
		return rec, errors.New("bad attempt")
	}
	rec.Attempt = uint32(attempt)
	v = v[n:]
	delay, n := binary.Varint(v)
	if n <= 0 {
		return rec, errors.New("bad delay")
	}
	rec.Delay = time.Duration(delay)
	v = v[n:]
	strs := []*string{&rec.Tenant, &rec.Target, &rec.CallID, &rec.RunID, &rec.Classification, &rec.Detail, &rec.PrimaryTarget}
	if version == recordVersion {
		strs = strs[:6]
	}
	for _, dst := range strs {
		l, n := binary.Uvarint(v)
		if n <= 0 || l > uint64(len(v)-n) {
			return rec, errors.New("truncated string")
		}
		*dst = string(v[n : n+int(l)])
		v = v[n+int(l):]
	}
	if len(v) != 0 {
		return rec, fmt.Errorf("%d trailing bytes", len(v))
	}
	return rec, nil
}
