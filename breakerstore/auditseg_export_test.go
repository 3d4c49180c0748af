package breakerstore

import (
	"encoding/binary"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/policy"
)

// SegMax and SegMin are the most records of an audit segment and the
// fewest of a last segment that is not rewritten, for tests that fill some.
const (
	SegMax = segMax
	SegMin = segMin
)

// AuditSweepBatch is the most records one flush deletes.
const AuditSweepBatch = auditSweepBatch

// AuditOnDisk decodes the audit trail on disk: its records in order and
// the number of segments that hold them.
func (s *Store) AuditOnDisk() (recs []policy.AuditRecord, segments int, err error) {
	err = s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketAuditSeg).ForEach(func(k, v []byte) error {
			_, ents, err := segEntries(k, v)
			if err != nil {
				return corrupt(bucketAuditSeg, k, err)
			}
			for _, e := range ents {
				rec, err := decodeAudit(e.key.bytes(), e.body)
				if err != nil {
					return corrupt(bucketAuditSeg, k, err)
				}
				recs = append(recs, rec)
			}
			segments++
			return nil
		})
	})
	return recs, segments, err
}

// EncodeAudit is the encoding of an audit record's body, the value of a
// record in the previous layout's audit bucket.
func EncodeAudit(rec policy.AuditRecord) []byte { return encodeAudit(&rec) }

// ClearAuditBloom empties the Bloom filter of audit segment value v in
// place, so that no record of the segment is in it.
func ClearAuditBloom(v []byte) error {
	h, err := parseSegHeader(v)
	if err != nil {
		return err
	}
	clear(h.bloom)
	return nil
}

// MangleFirstAuditRecord gives the body of the first record of audit
// segment value v, in place, a version byte that no decoder accepts.
func MangleFirstAuditRecord(v []byte) error {
	h, err := parseSegHeader(v)
	if err != nil {
		return err
	}
	// The first record's deltas are 0 (a byte each), then its length.
	_, n := binary.Uvarint(h.body[2:])
	h.body[2+n] = 0xff
	return nil
}
