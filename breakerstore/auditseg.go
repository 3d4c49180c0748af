package breakerstore

import (
	"bytes"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/breakerstore/internal/auditseg"
)

// bucketAuditSeg holds the audit trail's segments; their format is package
// auditseg's.
var bucketAuditSeg = []byte("auditseg")

// putSegments writes ents, in chunks of at most auditseg.Max, as new segments.
func putSegments(w *auditseg.Encoder, b *bbolt.Bucket, ents []auditseg.Entry) error {
	for len(ents) > 0 {
		n := min(len(ents), auditseg.Max)
		if err := b.Put(ents[0].Key.Bytes(), w.Encode(ents[:n])); err != nil {
			return err
		}
		ents = ents[n:]
	}
	return nil
}

// segAt positions c at the segment that holds key k or would: the last
// segment whose key is at most k, or the first segment when k sorts before
// every one. It returns nil in an empty bucket.
func segAt(c *bbolt.Cursor, k []byte) (key, value []byte) {
	key, value = c.Seek(k)
	switch {
	case key == nil:
		return c.Last()
	case bytes.Equal(key, k):
		return key, value
	}
	if pk, pv := c.Prev(); pk != nil {
		return pk, pv
	}
	return c.First()
}

// insertSegments writes ents (in key order, keys distinct) into the segments of b,
// keeping them sorted and disjoint. Records sorting after every segment,
// the usual case, become new segments, after a small last segment is
// rewritten with the first of them (see auditseg.Min). A record sorting inside
// a segment's range (its time was given by the caller, or a SyncAlways
// batch committed late) is merged into that segment, which is rewritten; a
// record already on disk under the same key is replaced. insert is
// deterministic, so bbolt's Batch may run it again.
func insertSegments(w *auditseg.Encoder, b *bbolt.Bucket, ents []auditseg.Entry) error {
	for len(ents) > 0 {
		first := ents[0].Key
		fk := first.Bytes()
		c := b.Cursor()
		sk, sv := segAt(c, fk)
		var next []byte // the key of the segment after the one ents[0] goes to
		if sk != nil && bytes.Compare(sk, fk) > 0 {
			next, sk = bytes.Clone(sk), nil
		} else if sk != nil {
			if nk, _ := c.Next(); nk != nil {
				next = bytes.Clone(nk)
			}
		}
		take := len(ents)
		if next != nil {
			bound := auditseg.KeyOf(next)
			take = 0
			for take < len(ents) && ents[take].Key.Compare(bound) < 0 {
				take++
			}
		}
		batch := ents[:take]
		ents = ents[take:]
		if sk == nil {
			if err := putSegments(w, b, batch); err != nil {
				return err
			}
			continue
		}
		h, err := auditseg.ParseHeader(sv)
		if err != nil {
			return corrupt(bucketAuditSeg, sk, err)
		}
		if h.Last.Compare(first) < 0 && (h.Count >= auditseg.Min || next != nil) {
			if err := putSegments(w, b, batch); err != nil {
				return err
			}
			continue
		}
		_, old, err := auditseg.Entries(sk, sv)
		if err != nil {
			return corrupt(bucketAuditSeg, sk, err)
		}
		if err := b.Delete(bytes.Clone(sk)); err != nil {
			return err
		}
		if err := putSegments(w, b, auditseg.Merge(old, batch)); err != nil {
			return err
		}
	}
	return nil
}
