package auditseg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"

	"github.com/policyd/policyd/policy"
)

const (
	// Max is the most records a segment holds. Larger segments make
	// commits and retention cheaper per record, but a query decodes a whole
	// segment to find one call's records in it, and retention rewrites the
	// one segment it expires in part.
	Max = 512
	// Min is the size below which the last segment is rewritten with
	// the next records appended, rather than followed by another small
	// segment: a trail written a few records at a time (a slow flush
	// interval, SyncAlways) still ends up in segments of at least Min
	// records, and the rewrite costs at most Min records.
	Min = 64
	// segVersion is the version byte of a segment.
	segVersion = 1
	// bloomBitsPerEntry and bloomK size the Bloom filter: about 1% false
	// positives, so a query by call id decodes about one segment in a
	// hundred that does not hold the call.
	bloomBitsPerEntry = 10
	bloomK            = 7
	// bloomMinBits is the smallest filter.
	bloomMinBits = 64
	// headerMax bounds the header before the filter.
	headerMax = 1 + binary.MaxVarintLen64 + KeyLen + 1 + binary.MaxVarintLen64
)

// Key is a record's key as numbers: it orders as its 16 bytes (Bytes).
type Key struct{ NS, Seq uint64 }

// KeyOf reads a 16-byte record key.
func KeyOf(k []byte) Key {
	return Key{binary.BigEndian.Uint64(k), binary.BigEndian.Uint64(k[8:])}
}

// Bytes returns the key as stored: 16 bytes, both numbers big-endian.
func (k Key) Bytes() []byte {
	b := make([]byte, 0, KeyLen)
	b = binary.BigEndian.AppendUint64(b, k.NS)
	return binary.BigEndian.AppendUint64(b, k.Seq)
}

// Compare orders keys by time, then sequence number: -1, 0 or +1.
func (k Key) Compare(o Key) int {
	switch {
	case k.NS < o.NS:
		return -1
	case k.NS > o.NS:
		return 1
	case k.Seq < o.Seq:
		return -1
	case k.Seq > o.Seq:
		return 1
	}
	return 0
}

// Entry is one record of a segment: its key and either its encoded
// body, when read from disk (pointing into the database's memory, valid
// only in its transaction), or the record itself, when new: a group commit
// encodes new records straight into the segment.
type Entry struct {
	Key  Key
	Body []byte
	Rec  *policy.AuditRecord
}

// Header is a segment's header; body is the records after it.
type Header struct {
	Count int    // records in the segment
	Last  Key    // the last record's key
	K     int    // the Bloom filter's hash functions
	Bloom []byte // the Bloom filter
	Body  []byte // the records
}

// ParseHeader reads the header of segment value v.
func ParseHeader(v []byte) (Header, error) {
	var h Header
	if len(v) < 1 || v[0] != segVersion {
		return h, errors.New("not an audit segment of version 1")
	}
	v = v[1:]
	count, n := binary.Uvarint(v)
	if n <= 0 || count == 0 || count > uint64(len(v)) {
		return h, errors.New("bad record count")
	}
	v = v[n:]
	if len(v) < KeyLen+1 {
		return h, errors.New("truncated header")
	}
	h.Count, h.Last, h.K = int(count), KeyOf(v), int(v[KeyLen])
	v = v[KeyLen+1:]
	size, n := binary.Uvarint(v)
	if n <= 0 || size > uint64(len(v)-n) || size < bloomMinBits/8 || size%8 != 0 || h.K < 1 || h.K > 32 {
		return h, errors.New("bad Bloom filter")
	}
	h.Bloom, h.Body = v[n:n+int(size)], v[n+int(size):]
	return h, nil
}

// MayHold reports whether the segment may hold a record whose name of the
// kind ('c' call id, 't' tenant) is name; false is certain.
func (h *Header) MayHold(kind byte, name string) bool {
	return bloomHas(h.Bloom, h.K, bloomHash(kind, name))
}

// Reader reads a segment's records in order.
type Reader struct {
	rest []byte
	prev Key
	left int
}

// NewReader reads the records of the segment under key k with header h.
func NewReader(k Key, h *Header) Reader {
	return Reader{rest: h.Body, prev: k, left: h.Count}
}

// Next returns the next record's key and body; ok is false after the
// last one, or with err when the records do not decode.
func (r *Reader) Next() (e Entry, ok bool, err error) {
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
	e.Key = Key{r.prev.NS + dns, r.prev.Seq + uint64(dseq)}
	e.Body = r.rest[n : n+int(l) : n+int(l)]
	r.rest = r.rest[n+int(l):]
	r.prev = e.Key
	r.left--
	return e, true, nil
}

// Entries decodes the records of segment k, v (their bodies stay
// encoded, pointing into v) and checks that the header agrees with them.
func Entries(k, v []byte) (Header, []Entry, error) {
	if len(k) != KeyLen {
		return Header{}, nil, errors.New("key is not time and sequence number")
	}
	h, err := ParseHeader(v)
	if err != nil {
		return h, nil, err
	}
	ents := make([]Entry, 0, h.Count)
	r := NewReader(KeyOf(k), &h)
	for {
		e, ok, err := r.Next()
		if err != nil {
			return h, nil, err
		}
		if !ok {
			break
		}
		if len(ents) > 0 && e.Key.Compare(ents[len(ents)-1].Key) <= 0 {
			return h, nil, fmt.Errorf("record %d does not sort after the one before", len(ents))
		}
		ents = append(ents, e)
	}
	if ents[0].Key != KeyOf(k) {
		return h, nil, errors.New("first record's key is not the segment's key")
	}
	if ents[len(ents)-1].Key != h.Last {
		return h, nil, errors.New("last record's key is not the header's")
	}
	return h, ents, nil
}

// Names returns the tenant and call id of an encoded record body
// without copying them; ok is false when the body does not decode that far.
func Names(v []byte) (tenant, callID []byte, ok bool) {
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

// Encoder encodes segments; it keeps its scratch space from one segment
// to the next. It is not safe for concurrent use.
type Encoder struct {
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
func (w *Encoder) addTenant(t string) {
	slot := &w.tenants[(len(t)+int(t[len(t)-1]))&(len(w.tenants)-1)]
	if *slot == t {
		return
	}
	*slot = t
	w.add(bloomHash('t', t))
}

// add enters hash h once.
func (w *Encoder) add(h uint64) {
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

// Encode returns the value of the segment of ents (at least one, in key
// order); its key is ents[0].Key. The value shares no memory with ents.
func (w *Encoder) Encode(ents []Entry) []byte {
	size := 1 << bits.Len(uint(2*len(ents))) // at most half full: two names a record
	if cap(w.set) < size {
		w.set = make([]uint64, size)
	}
	w.set = w.set[:size]
	clear(w.set)
	w.zero, w.hashes, w.lens = false, w.hashes[:0], w.lens[:0]
	clear(w.tenants[:])
	n := 0
	prev := ents[0].Key
	for i := range ents {
		e := &ents[i]
		l := len(e.Body)
		if e.Rec != nil {
			l = RecordLen(e.Rec)
			if e.Rec.CallID != "" {
				w.add(bloomHash('c', e.Rec.CallID))
			}
			if e.Rec.Tenant != "" {
				w.addTenant(e.Rec.Tenant)
			}
		} else if tenant, callID, ok := Names(e.Body); ok {
			if len(callID) > 0 {
				w.add(bloomHash('c', callID))
			}
			if len(tenant) > 0 {
				w.add(bloomHash('t', tenant))
			}
		}
		w.lens = append(w.lens, l)
		n += uvarintLen(e.Key.NS-prev.NS) + uvarintLen(zigzag(e.Key.Seq-prev.Seq)) + uvarintLen(uint64(l)) + l
		prev = e.Key
	}
	fsize := bloomSize(len(w.hashes))
	last := ents[len(ents)-1].Key
	v := make([]byte, 0, headerMax+fsize+n)
	v = append(v, segVersion)
	v = binary.AppendUvarint(v, uint64(len(ents)))
	v = binary.BigEndian.AppendUint64(v, last.NS)
	v = binary.BigEndian.AppendUint64(v, last.Seq)
	v = append(v, bloomK)
	v = binary.AppendUvarint(v, uint64(fsize))
	v = v[:len(v)+fsize] // zero: make cleared the capacity
	filter := v[len(v)-fsize:]
	for _, h := range w.hashes {
		bloomSet(filter, bloomK, h)
	}
	prev = ents[0].Key
	for i := range ents {
		e := &ents[i]
		v = binary.AppendUvarint(v, e.Key.NS-prev.NS)
		v = binary.AppendVarint(v, int64(e.Key.Seq-prev.Seq))
		v = binary.AppendUvarint(v, uint64(w.lens[i]))
		if e.Rec != nil {
			v = AppendRecord(v, e.Rec)
		} else {
			v = append(v, e.Body...)
		}
		prev = e.Key
	}
	return v
}

// zigzag is the unsigned form binary.AppendVarint writes for int64(x).
func zigzag(x uint64) uint64 { return x<<1 ^ uint64(int64(x)>>63) }

// Merge merges two runs of entries in key order; on equal keys the
// entry of add replaces the one of old.
func Merge(old, add []Entry) []Entry {
	if len(old) == 0 || old[len(old)-1].Key.Compare(add[0].Key) < 0 {
		return append(old[:len(old):len(old)], add...)
	}
	out := make([]Entry, 0, len(old)+len(add))
	i, j := 0, 0
	for i < len(old) && j < len(add) {
		switch old[i].Key.Compare(add[j].Key) {
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

// Check checks segment k, v in full, for breakerstore.Check: the header agrees
// with the records, the records sort after prev (the last key of the
// segment before, nil for the first) and within, every body decodes, and
// every call id and tenant is in the Bloom filter. It returns the last key.
func Check(k, v []byte, prev *Key) (Key, error) {
	h, ents, err := Entries(k, v)
	if err != nil {
		return Key{}, err
	}
	if prev != nil && ents[0].Key.Compare(*prev) <= 0 {
		return Key{}, errors.New("segment overlaps the one before")
	}
	for i, e := range ents {
		rec, err := DecodeRecord(e.Key.Bytes(), e.Body)
		if err != nil {
			return Key{}, fmt.Errorf("record %d: %v", i, err)
		}
		if rec.CallID != "" && !h.MayHold('c', rec.CallID) {
			return Key{}, fmt.Errorf("record %d: call id %q missing from the Bloom filter", i, rec.CallID)
		}
		if rec.Tenant != "" && !h.MayHold('t', rec.Tenant) {
			return Key{}, fmt.Errorf("record %d: tenant %q missing from the Bloom filter", i, rec.Tenant)
		}
	}
	return h.Last, nil
}

// FromRecords returns recs as segment entries in key order; they point at
// recs, whose Time and Seq are their keys. The records are normally in key order already (stamped in order);
// a record with a time of its own, or records a failed SyncAlways commit
// left to the flusher, may not be. Of records with the same key the last
// one is kept, as a Put of each would.
func FromRecords(recs []policy.AuditRecord) []Entry {
	ents := make([]Entry, len(recs))
	sorted := true
	for i := range recs {
		rec := &recs[i]
		ents[i] = Entry{Key: Key{uint64(max(rec.Time.UnixNano(), 0)), rec.Seq}, Rec: rec}
		if i > 0 && ents[i].Key.Compare(ents[i-1].Key) <= 0 {
			sorted = false
		}
	}
	if sorted {
		return ents
	}
	slices.SortStableFunc(ents, func(a, b Entry) int { return a.Key.Compare(b.Key) })
	out := ents[:0]
	for i, e := range ents {
		if i+1 < len(ents) && ents[i+1].Key == e.Key {
			continue
		}
		out = append(out, e)
	}
	return out
}
