package breakerstore

import (
	"encoding/binary"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/breakerstore/internal/auditseg"
	"github.com/policyd/policyd/policy"
)

// SegMax and SegMin are the most records of an audit segment and the
// fewest of a last segment that is not rewritten, for tests that fill some.
const (
	SegMax = auditseg.Max
	SegMin = auditseg.Min
)

// AuditSweepBatch is the most records one flush deletes.
const AuditSweepBatch = auditSweepBatch

// AuditOnDisk decodes the audit trail on disk: its records in order and
// the number of segments that hold them.
func (s *Store) AuditOnDisk() (recs []policy.AuditRecord, segments int, err error) {
	err = s.db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketAuditSeg).ForEach(func(k, v []byte) error {
			_, ents, err := auditseg.Entries(k, v)
			if err != nil {
				return corrupt(bucketAuditSeg, k, err)
			}
			for _, e := range ents {
				rec, err := auditseg.DecodeRecord(e.Key.Bytes(), e.Body)
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
func EncodeAudit(rec policy.AuditRecord) []byte { return auditseg.EncodeRecord(&rec) }

// ClearAuditBloom empties the Bloom filter of audit segment value v in
// place, so that no record of the segment is in it.
func ClearAuditBloom(v []byte) error {
	h, err := auditseg.ParseHeader(v)
	if err != nil {
		return err
	}
	clear(h.Bloom)
	return nil
}

// MangleFirstAuditRecord gives the body of the first record of audit
// segment value v, in place, a version byte that no decoder accepts.
func MangleFirstAuditRecord(v []byte) error {
	h, err := auditseg.ParseHeader(v)
	if err != nil {
		return err
	}
	// The first record's deltas are 0 (a byte each), then its length.
	_, n := binary.Uvarint(h.Body[2:])
	h.Body[2+n] = 0xff
	return nil
}
