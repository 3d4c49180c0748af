package breakerstore

import (
	"encoding/binary"
	"errors"

	"go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/policyd/policyd/breakerstore/internal/auditseg"
)

// migration moves a file of schema version from to from+1, inside Open's
// first transaction, after the buckets of allBuckets exist.
type migration struct {
	from uint32
	what string
	run  func(s *Store, tx *bbolt.Tx) error
}

// migrations[v-1] moves a file of schema version v to v+1; Open runs them
// in order from the file's version to schemaVersion, in one transaction,
// and then records schemaVersion. A layout change adds a step here (a new
// bucket, records rewritten) and bumps schemaVersion; see doc.go.
var migrations = []migration{
	{from: 1, what: "audit trail from a key per record into segments", run: func(s *Store, tx *bbolt.Tx) error {
		moved, err := s.migrateAudit(tx)
		if err == nil && moved > 0 {
			s.log.Info("breakerstore: audit trail moved into segments", "records", moved)
		}
		return err
	}},
	// Version 3 adds record versions that version 2 builds cannot read: a
	// call table record and an audit record with a primary target and an
	// attempts record with the next attempt's target (written for calls
	// that escalated to a fallback), which leave the records of version 2
	// files valid as they are, and flow records with the adaptive ceiling,
	// into which the flow records of version byte 1 are rewritten.
	{from: 2, what: "call table, audit and attempts records gain escalation targets; flow records gain the adaptive ceiling (version 1 rewritten as 2)", run: func(s *Store, tx *bbolt.Tx) error {
		return migrateFlow(tx)
	}},
}

// migrateAudit moves the audit records of the previous layout (bucket
// audit: a key per record, time and sequence number, valued auditseg.EncodeRecord's
// body; and the index buckets auditcall and audittenant) into segments,
// in key order, and deletes the three buckets. It runs in Open's first
// transaction, so a file is either moved in full or not at all. A record
// that does not decode is logged and left out: the old retention would
// have removed it too. Segments already in the file (written by a version 1
// build of segments, then by an older one again) are merged with, not
// overwritten.
// It returns the records moved. It is the step from schema version 1,
// whose files hold either layout (segments came within version 1), to 2.
func (s *Store) migrateAudit(tx *bbolt.Tx) (int, error) {
	old := tx.Bucket(bucketAudit)
	moved := 0
	if old != nil {
		var w auditseg.Encoder
		seg := tx.Bucket(bucketAuditSeg)
		chunk := make([]auditseg.Entry, 0, auditseg.Max)
		var top uint64
		c := old.Cursor()
		for k, v := c.First(); ; k, v = c.Next() {
			if k != nil {
				if _, err := auditseg.DecodeRecord(k, v); err != nil {
					s.log.Error("breakerstore: undecodable audit record not moved into segments", "err", corrupt(bucketAudit, k, err))
					continue
				}
				e := auditseg.Entry{Key: auditseg.KeyOf(k), Body: v}
				top = max(top, e.Key.Seq)
				chunk = append(chunk, e)
			}
			if len(chunk) == auditseg.Max || k == nil && len(chunk) > 0 {
				// The bodies point into the file's memory, valid for
				// the transaction; the segments copy them.
				if err := insertSegments(&w, seg, chunk); err != nil {
					return 0, err
				}
				moved += len(chunk)
				chunk = chunk[:0]
			}
			if k == nil {
				break
			}
		}
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(keyAuditSeq); moved > 0 && (v == nil || len(v) == 8 && binary.BigEndian.Uint64(v) < top) {
			if err := meta.Put(keyAuditSeq, binary.BigEndian.AppendUint64(nil, top)); err != nil {
				return 0, err
			}
		}
	}
	for _, name := range [][]byte{bucketAudit, bucketAuditCall, bucketAuditTenant} {
		if err := tx.DeleteBucket(name); err != nil && !errors.Is(err, berrors.ErrBucketNotFound) {
			return 0, err
		}
	}
	return moved, nil
}
