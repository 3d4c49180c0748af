package breakerstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/policy"
)

// The audit trail is stored in segments: one bbolt key per run of up to
// segMax records, in bucket auditseg. A record used to be three keys (the
// record and two index entries), and at tens of thousands of records a
// second bbolt's per-key cost (a node insert, a page write at the commit, a
// delete and a page rewrite at retention) was most of the daemon's CPU. A
// segment costs one Put and, at retention, one Delete for hundreds of
// records, and its header answers the questions retention, Open and
// queries ask without decoding the records.
//
// The key of a segment is the key of its first record: Unix nanoseconds and
// sequence number, uint64 big-endian each, so segments sort by time.
// Segments never overlap: every record of a segment sorts after every
// record of the segments before it. The value is
//
//	version     byte, segVersion (1)
//	count       uvarint, the records in the segment (at least 1)
//	last        uint64 big-endian nanoseconds and uint64 big-endian sequence
//	            number of the last record
//	k           byte, the Bloom filter's hash functions
//	bloom size  uvarint, the filter's length in bytes (a multiple of 8)
//	bloom       the Bloom filter over "c" 0x00 call id and "t" 0x00 tenant of
//	            every record (empty names are not entered)
//	records     count times: nanoseconds since the previous record (uvarint;
//	            the first record's previous is the segment key, so its delta
//	            is 0), its sequence number minus the previous one (zigzag
//	            varint: a record with an explicit earlier time may carry a
//	            later sequence number than the next one), the body's length
//	            (uvarint) and the body, as encodeAudit writes it.
const (
	// segMax is the most records a segment holds. Larger segments make
	// commits and retention cheaper per record, but a query decodes a whole
	// segment to find one call's records in it, and retention rewrites the
	// one segment it expires in part.
	segMax = 512
	// segMin is the size below which the last segment is rewritten with
	// the next records appended, rather than followed by another small
	// segment: a trail written a few records at a time (a slow flush
	// interval, SyncAlways) still ends up in segments of at least segMin
	// records, and the rewrite costs at most segMin records.
	segMin = 64
	// segVersion is the version byte of a segment.
	segVersion = 1
	// bloomBitsPerEntry and bloomK size the Bloom filter: about 1% false
	// positives, so a query by call id decodes about one segment in a
	// hundred that does not hold the call.
	bloomBitsPerEntry = 10
	bloomK            = 7
	// bloomMinBits is the smallest filter.
	bloomMinBits = 64
	// segHeaderMax bounds the header before the filter.
	segHeaderMax = 1 + binary.MaxVarintLen64 + auditKeyLen + 1 + binary.MaxVarintLen64
)

// bucketAuditSeg holds the audit trail's segments.
var bucketAuditSeg = []byte("auditseg")

// akey is a record's key as numbers: it orders as the 16 bytes of auditKey.
type akey struct{ ns, seq uint64 }

// keyOf reads a 16-byte record key.
func keyOf(k []byte) akey {
	return akey{binary.BigEndian.Uint64(k), binary.BigEndian.Uint64(k[8:])}
}

// bytes returns the key as bbolt stores it.
func (k akey) bytes() []byte {
	b := make([]byte, 0, auditKeyLen)
	b = binary.BigEndian.AppendUint64(b, k.ns)
	return binary.BigEndian.AppendUint64(b, k.seq)
}

// cmp orders keys by time, then sequence number: -1, 0 or +1.
func (k akey) cmp(o akey) int {
	switch {
	case k.ns < o.ns:
		return -1
	case k.ns > o.ns:
		return 1
	case k.seq < o.seq:
		return -1
	case k.seq > o.seq:
		return 1
	}
	return 0
}

// segEntry is one record of a segment: its key and either its encoded
// body, when read from disk (pointing into the database's memory, valid
// only in its transaction), or the record itself, when new: a group commit
// encodes new records straight into the segment.
type segEntry struct {
	key  akey
	body []byte
	rec  *policy.AuditRecord
}

// segHeader is a segment's header; body is the records after it.
type segHeader struct {
	count int
	last  akey
	k     int
	bloom []byte
	body  []byte
}

// parseSegHeader reads the header of segment value v.
func parseSegHeader(v []byte) (segHeader, error) {
	var h segHeader
	if len(v) < 1 || v[0] != segVersion {
		return h, errors.New("not an audit segment of version 1")
	}
	v = v[1:]
	count, n := binary.Uvarint(v)
	if n <= 0 || count == 0 || count > uint64(len(v)) {
		return h, errors.New("bad record count")
	}
	v = v[n:]
	if len(v) < auditKeyLen+1 {
		return h, errors.New("truncated header")
	}
	h.count, h.last, h.k = int(count), keyOf(v), int(v[auditKeyLen])
	v = v[auditKeyLen+1:]
	size, n := binary.Uvarint(v)
	if n <= 0 || size > uint64(len(v)-n) || size < bloomMinBits/8 || size%8 != 0 || h.k < 1 || h.k > 32 {
		return h, errors.New("bad Bloom filter")
	}
	h.bloom, h.body = v[n:n+int(size)], v[n+int(size):]
	return h, nil
}

// mayHold reports whether the segment may hold a record whose name of the
// kind ('c' call id, 't' tenant) is name; false is certain.
func (h *segHeader) mayHold(kind byte, name string) bool {
	return bloomHas(h.bloom, h.k, bloomHash(kind, name))
}

// segReader reads a segment's records in order.
type segReader struct {
	rest []byte
	prev akey
	left int
}

// newSegReader reads the records of the segment under key k with header h.
func newSegReader(k akey, h *segHeader) segReader {
	return segReader{rest: h.body, prev: k, left: h.count}
}

// next returns the next record's key and body; ok is false after the
// last one, or with err when the records do not decode.
func (r *segReader) next() (e segEntry, ok bool, err error) {
	if r.left == 0 {
		if len(r.rest) != 0 {
			return e, false, fmt.Errorf("%d bytes after the last record", len(r.rest))
		}
		return e, false, nil
	}
	dns, n := binary.Uvarint(r.rest)
	if n <= 0 {
		return e, false, errors.New("bad time delta")
	}
	r.rest = r.rest[n:]
	dseq, n := binary.Varint(r.rest)
	if n <= 0 {
		return e, false, errors.New("bad sequence delta")
	}
	r.rest = r.rest[n:]
	l, n := binary.Uvarint(r.rest)
	if n <= 0 || l > uint64(len(r.rest)-n) {
		return e, false, errors.New("truncated record")
	}
	e.key = akey{r.prev.ns + dns, r.prev.seq + uint64(dseq)}
	e.body = r.rest[n : n+int(l) : n+int(l)]
	r.rest = r.rest[n+int(l):]
	r.prev = e.key
	r.left--
	return e, true, nil
}

// segEntries decodes the records of segment k, v (their bodies stay
// encoded, pointing into v) and checks that the header agrees with them.
func segEntries(k, v []byte) (segHeader, []segEntry, error) {
	if len(k) != auditKeyLen {
		return segHeader{}, nil, errors.New("key is not time and sequence number")
	}
	h, err := parseSegHeader(v)
	if err != nil {
		return h, nil, err
	}
	ents := make([]segEntry, 0, h.count)
	r := newSegReader(keyOf(k), &h)
	for {
		e, ok, err := r.next()
		if err != nil {
			return h, nil, err
		}
		if !ok {
			break
		}
		if len(ents) > 0 && e.key.cmp(ents[len(ents)-1].key) <= 0 {
			return h, nil, fmt.Errorf("record %d does not sort after the one before", len(ents))
		}
		ents = append(ents, e)
	}
	if ents[0].key != keyOf(k) {
		return h, nil, errors.New("first record's key is not the segment's key")
	}
	if ents[len(ents)-1].key != h.last {
		return h, nil, errors.New("last record's key is not the header's")
	}
	return h, ents, nil
}

// auditNames returns the tenant and call id of an encoded record body
// without copying them; ok is false when the body does not decode that far.
func auditNames(v []byte) (tenant, callID []byte, ok bool) {
	if len(v) < 5 {
		return nil, nil, false
	}
	v = v[5:]
	if _, n := binary.Uvarint(v); n > 0 {
		v = v[n:]
	} else {
		return nil, nil, false
	}
	if _, n := binary.Varint(v); n > 0 {
		v = v[n:]
	} else {
		return nil, nil, false
	}
	var strs [3][]byte // tenant, target, call id
	for i := range strs {
		l, n := binary.Uvarint(v)
		if n <= 0 || l > uint64(len(v)-n) {
			return nil, nil, false
		}
		strs[i] = v[n : n+int(l)]
		v = v[n+int(l):]
	}
	return strs[0], strs[2], true
}

// bloomHash is the 64-bit FNV-1a hash of kind 0x00 name. It must never
// change (hash/maphash is seeded per process): filters on disk were built
// with it.
func bloomHash[T ~string | ~[]byte](kind byte, name T) uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	h = (h ^ uint64(kind)) * prime
	h *= prime // ^ 0x00
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * prime
	}
	return h
}

// bloomProbe returns the i-th of a filter's k bit positions for hash h in
// a filter of m bits, by double hashing: h and a remix of it (FNV-1a's
// low bits are weak, so both are mixed, and the positions are taken from
// the high bits).
func bloomProbe(h1, h2 uint64, i int, m uint64) uint64 {
	return ((h1 + uint64(i)*h2) >> 32) * m >> 32
}

// bloomMix is splitmix64's finaliser; it turns h into the two hashes of
// double hashing.
func bloomMix(h uint64) (uint64, uint64) {
	h1 := h ^ h>>30
	h1 *= 0xbf58476d1ce4e5b9
	h1 ^= h1 >> 27
	h2 := h1 * 0x94d049bb133111eb
	h2 ^= h2 >> 31
	return h1, h2 | 1
}

// bloomSet enters hash h in filter f.
func bloomSet(f []byte, k int, h uint64) {
	m := uint64(len(f)) * 8
	h1, h2 := bloomMix(h)
	for i := range k {
		b := bloomProbe(h1, h2, i, m)
		f[b>>3] |= 1 << (b & 7)
	}
}

// bloomHas reports whether hash h may be in filter f.
func bloomHas(f []byte, k int, h uint64) bool {
	m := uint64(len(f)) * 8
	h1, h2 := bloomMix(h)
	for i := range k {
		b := bloomProbe(h1, h2, i, m)
		if f[b>>3]&(1<<(b&7)) == 0 {
			return false
		}
	}
	return true
}

// bloomSize is the length in bytes of a filter for n distinct entries.
func bloomSize(n int) int {
	b := max(n*bloomBitsPerEntry, bloomMinBits)
	return (b + 63) / 64 * 8
}

// uvarintLen is the length of x as a uvarint.
func uvarintLen(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

// segEncoder encodes segments; it keeps its scratch space from one segment
// to the next. It is not safe for concurrent use.
type segEncoder struct {
	set    []uint64 // open-addressing set of the entries' hashes; 0 is empty
	zero   bool     // the hash 0, which set cannot hold, was added
	hashes []uint64 // the distinct hashes, in order of insertion
	lens   []int    // the entries' body lengths
	// tenants caches tenants already entered in the current segment, by
	// a hash of their length and last byte: a segment's records come from
	// a few tenants, and most need neither hash nor set lookup.
	tenants [16]string
}

// addTenant enters tenant t once.
func (w *segEncoder) addTenant(t string) {
	slot := &w.tenants[(len(t)+int(t[len(t)-1]))&(len(w.tenants)-1)]
	if *slot == t {
		return
	}
	*slot = t
	w.add(bloomHash('t', t))
}

// add enters hash h once.
func (w *segEncoder) add(h uint64) {
	if h == 0 {
		if !w.zero {
			w.zero = true
			w.hashes = append(w.hashes, 0)
		}
		return
	}
	mask := uint64(len(w.set) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		switch w.set[i] {
		case h:
			return
		case 0:
			w.set[i] = h
			w.hashes = append(w.hashes, h)
			return
		}
	}
}

// encode returns the value of the segment of ents (at least one, in key
// order); its key is ents[0].key. The value shares no memory with ents.
func (w *segEncoder) encode(ents []segEntry) []byte {
	size := 1 << bits.Len(uint(2*len(ents))) // at most half full: two names a record
	if cap(w.set) < size {
		w.set = make([]uint64, size)
	}
	w.set = w.set[:size]
	clear(w.set)
	w.zero, w.hashes, w.lens = false, w.hashes[:0], w.lens[:0]
	clear(w.tenants[:])
	n := 0
	prev := ents[0].key
	for i := range ents {
		e := &ents[i]
		l := len(e.body)
		if e.rec != nil {
			l = auditBodyLen(e.rec)
			if e.rec.CallID != "" {
				w.add(bloomHash('c', e.rec.CallID))
			}
			if e.rec.Tenant != "" {
				w.addTenant(e.rec.Tenant)
			}
		} else if tenant, callID, ok := auditNames(e.body); ok {
			if len(callID) > 0 {
				w.add(bloomHash('c', callID))
			}
			if len(tenant) > 0 {
				w.add(bloomHash('t', tenant))
			}
		}
		w.lens = append(w.lens, l)
		n += uvarintLen(e.key.ns-prev.ns) + uvarintLen(zigzag(e.key.seq-prev.seq)) + uvarintLen(uint64(l)) + l
		prev = e.key
	}
	fsize := bloomSize(len(w.hashes))
	last := ents[len(ents)-1].key
	v := make([]byte, 0, segHeaderMax+fsize+n)
	v = append(v, segVersion)
	v = binary.AppendUvarint(v, uint64(len(ents)))
	v = binary.BigEndian.AppendUint64(v, last.ns)
	v = binary.BigEndian.AppendUint64(v, last.seq)
	v = append(v, bloomK)
	v = binary.AppendUvarint(v, uint64(fsize))
	v = v[:len(v)+fsize] // zero: make cleared the capacity
	filter := v[len(v)-fsize:]
	for _, h := range w.hashes {
		bloomSet(filter, bloomK, h)
	}
	prev = ents[0].key
	for i := range ents {
		e := &ents[i]
		v = binary.AppendUvarint(v, e.key.ns-prev.ns)
		v = binary.AppendVarint(v, int64(e.key.seq-prev.seq))
		v = binary.AppendUvarint(v, uint64(w.lens[i]))
		if e.rec != nil {
			v = appendAuditBody(v, e.rec)
		} else {
			v = append(v, e.body...)
		}
		prev = e.key
	}
	return v
}

// zigzag is the unsigned form binary.AppendVarint writes for int64(x).
func zigzag(x uint64) uint64 { return x<<1 ^ uint64(int64(x)>>63) }

// putSegments writes ents, in chunks of at most segMax, as new segments.
func (w *segEncoder) putSegments(b *bbolt.Bucket, ents []segEntry) error {
	for len(ents) > 0 {
		n := min(len(ents), segMax)
		if err := b.Put(ents[0].key.bytes(), w.encode(ents[:n])); err != nil {
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

// insert writes ents (in key order, keys distinct) into the segments of b,
// keeping them sorted and disjoint. Records sorting after every segment,
// the usual case, become new segments, after a small last segment is
// rewritten with the first of them (see segMin). A record sorting inside
// a segment's range (its time was given by the caller, or a SyncAlways
// batch committed late) is merged into that segment, which is rewritten; a
// record already on disk under the same key is replaced. insert is
// deterministic, so bbolt's Batch may run it again.
func (w *segEncoder) insert(b *bbolt.Bucket, ents []segEntry) error {
	for len(ents) > 0 {
		first := ents[0].key
		fk := first.bytes()
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
			bound := keyOf(next)
			take = 0
			for take < len(ents) && ents[take].key.cmp(bound) < 0 {
				take++
			}
		}
		batch := ents[:take]
		ents = ents[take:]
		if sk == nil {
			if err := w.putSegments(b, batch); err != nil {
				return err
			}
			continue
		}
		h, err := parseSegHeader(sv)
		if err != nil {
			return corrupt(bucketAuditSeg, sk, err)
		}
		if h.last.cmp(first) < 0 && (h.count >= segMin || next != nil) {
			if err := w.putSegments(b, batch); err != nil {
				return err
			}
			continue
		}
		_, old, err := segEntries(sk, sv)
		if err != nil {
			return corrupt(bucketAuditSeg, sk, err)
		}
		if err := b.Delete(bytes.Clone(sk)); err != nil {
			return err
		}
		if err := w.putSegments(b, mergeEntries(old, batch)); err != nil {
			return err
		}
	}
	return nil
}

// mergeEntries merges two runs of entries in key order; on equal keys the
// entry of add replaces the one of old.
func mergeEntries(old, add []segEntry) []segEntry {
	if len(old) == 0 || old[len(old)-1].key.cmp(add[0].key) < 0 {
		return append(old[:len(old):len(old)], add...)
	}
	out := make([]segEntry, 0, len(old)+len(add))
	i, j := 0, 0
	for i < len(old) && j < len(add) {
		switch old[i].key.cmp(add[j].key) {
		case -1:
			out = append(out, old[i])
			i++
		case 1:
			out = append(out, add[j])
			j++
		default:
			out = append(out, add[j])
			i++
			j++
		}
	}
	out = append(out, old[i:]...)
	return append(out, add[j:]...)
}

// checkSegment checks segment k, v in full for Check: the header agrees
// with the records, the records sort after prev (the last key of the
// segment before, nil for the first) and within, every body decodes, and
// every call id and tenant is in the Bloom filter. It returns the last key.
func checkSegment(k, v []byte, prev *akey) (akey, error) {
	h, ents, err := segEntries(k, v)
	if err != nil {
		return akey{}, err
	}
	if prev != nil && ents[0].key.cmp(*prev) <= 0 {
		return akey{}, errors.New("segment overlaps the one before")
	}
	for i, e := range ents {
		rec, err := decodeAudit(e.key.bytes(), e.body)
		if err != nil {
			return akey{}, fmt.Errorf("record %d: %v", i, err)
		}
		if rec.CallID != "" && !h.mayHold('c', rec.CallID) {
			return akey{}, fmt.Errorf("record %d: call id %q missing from the Bloom filter", i, rec.CallID)
		}
		if rec.Tenant != "" && !h.mayHold('t', rec.Tenant) {
			return akey{}, fmt.Errorf("record %d: tenant %q missing from the Bloom filter", i, rec.Tenant)
		}
	}
	return h.last, nil
}
