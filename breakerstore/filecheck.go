package breakerstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/bits"
	"os"
	"runtime/debug"
	"strings"
	"time"
)

// The bbolt file format (version 2, as go.etcd.io/bbolt v1.5 writes it), as
// far as verifyFile reads it. Integers are in the machine's byte order.
//
//	page header, 16 bytes      id uint64, flags uint16, count uint16, overflow uint32
//	meta page (0 and 1)        header, then magic uint32, version uint32, page size uint32,
//	                           flags uint32, root bucket (root pgid uint64, sequence uint64),
//	                           freelist pgid uint64, high-water pgid uint64, txid uint64,
//	                           checksum uint64 (FNV-64a of the meta fields before it)
//	branch element, 16 bytes   pos uint32, key size uint32, child pgid uint64
//	leaf element, 16 bytes     flags uint32 (1: a bucket), pos uint32, key size uint32, value size uint32
//	freelist page              count page ids uint64; a count of 0xFFFF means the first uint64 is the count
//
// An element's key starts pos bytes after the element itself, its value right
// after the key. A bucket's value is its root pgid and sequence, followed,
// when the root pgid is 0, by the bucket's own leaf page (an inline bucket).
// A page of overflow n spans n+1 pages; only the first has a header.
const (
	boltMagic        uint32 = 0xED0CDAED
	boltVersion      uint32 = 2
	pageHeaderLen           = 16
	elementLen              = 16
	metaChecksumAt          = pageHeaderLen + 56
	metaLen                 = metaChecksumAt + 8
	flagBranch              = 0x01
	flagLeaf                = 0x02
	flagMeta                = 0x04
	flagFreelist            = 0x10
	leafBucket              = 0x01
	noFreelist       uint64 = 0xffffffffffffffff
	maxTreeDepth            = 64
	maxListed               = 40
	minPageSize             = 1024
	maxPageSize             = 64 << 10
	bucketHeaderLen         = 16
	freelistOverflow        = 0xFFFF
	maxMapBytes             = 1 << 48 // bbolt's largest map on 64-bit systems
)

var native = binary.NativeEndian

// boltMeta is one decoded meta page.
type boltMeta struct {
	magic, version, pageSize uint32
	root, freelist, hwm      uint64
	txid                     uint64
	stored, sum              uint64
	headerID                 uint64
	headerFlags              uint16
}

func parseMeta(p []byte) boltMeta {
	return boltMeta{
		headerID:    native.Uint64(p[0:]),
		headerFlags: native.Uint16(p[8:]),
		magic:       native.Uint32(p[16:]),
		version:     native.Uint32(p[20:]),
		pageSize:    native.Uint32(p[24:]),
		root:        native.Uint64(p[32:]),
		freelist:    native.Uint64(p[48:]),
		hwm:         native.Uint64(p[56:]),
		txid:        native.Uint64(p[64:]),
		stored:      native.Uint64(p[metaChecksumAt:]),
		sum:         fnv64a(p[pageHeaderLen:metaChecksumAt]),
	}
}

func fnv64a(b []byte) uint64 {
	h := fnv.New64a()
	h.Write(b)
	return h.Sum64()
}

// fault says what is wrong with a meta page, or "" when it is sound.
func (m boltMeta) fault(slot int) string {
	switch {
	case m.magic != boltMagic:
		return fmt.Sprintf("no bbolt magic (found %#08x)", m.magic)
	case m.version != boltVersion:
		return fmt.Sprintf("bbolt format version %d, want %d", m.version, boltVersion)
	case m.stored != m.sum:
		return fmt.Sprintf("checksum %016x, computed %016x", m.stored, m.sum)
	case m.headerFlags != flagMeta || m.headerID != uint64(slot):
		return fmt.Sprintf("page header says page %d flags %#x, want page %d, a meta page", m.headerID, m.headerFlags, slot)
	case m.pageSize < minPageSize || m.pageSize > maxPageSize || bits.OnesCount32(m.pageSize) != 1:
		return fmt.Sprintf("page size %d is not a power of two in [%d, %d]", m.pageSize, minPageSize, maxPageSize)
	case m.hwm < 3 || m.hwm > maxMapBytes/uint64(m.pageSize):
		return fmt.Sprintf("high-water page id %d, want at least 3 and at most %d", m.hwm, maxMapBytes/uint64(max(m.pageSize, 1)))
	case m.root < 2 || m.root >= m.hwm:
		return fmt.Sprintf("root page %d outside [2, %d)", m.root, m.hwm)
	case m.freelist != noFreelist && (m.freelist < 2 || m.freelist >= m.hwm):
		return fmt.Sprintf("freelist page %d outside [2, %d)", m.freelist, m.hwm)
	}
	return ""
}

// fileCheck walks one bbolt file through read(2), never a memory map, so a
// damaged file yields problems, not a fault.
type fileCheck struct {
	f         io.ReaderAt
	size      int64
	pageSize  uint64
	hwm       uint64
	pages     uint64   // pages whose first byte is in the file
	reachable []uint64 // bitset of pages reached from the root or the freelist
	free      []uint64 // bitset of pages the freelist lists
	problems  []string
	more      int // problems beyond maxListed, counted only
}

func (c *fileCheck) problem(format string, args ...any) {
	if len(c.problems) < maxListed {
		c.problems = append(c.problems, fmt.Sprintf(format, args...))
		return
	}
	c.more++
}

func bit(set []uint64, id uint64) bool { return set[id/64]&(1<<(id%64)) != 0 }
func setBit(set []uint64, id uint64)   { set[id/64] |= 1 << (id % 64) }

// verifyFile checks the file open as f, of size bytes, without a memory map:
// both meta pages, the size against the high-water mark, the freelist, and
// every page of every bucket (ids in range, page headers, element bounds,
// key order, no page reached twice or both reached and free, none lost). It
// returns every problem it finds, the first maxListed in words and a count
// of the rest; none means bbolt can map and read the file without a fault.
func verifyFile(f io.ReaderAt, size int64) (problems []string, more int) {
	c := &fileCheck{f: f, size: size}
	c.run()
	return c.problems, c.more
}

func (c *fileCheck) run() {
	if c.size == 0 {
		c.problem("empty file (0 bytes), not a policyd database; only a path that does not exist is created")
		return
	}
	if c.size < metaLen {
		c.problem("%d bytes, too short for a bbolt database", c.size)
		return
	}
	head := make([]byte, metaLen)
	if _, err := c.f.ReadAt(head, 0); err != nil {
		c.problem("reading meta page 0: %v", err)
		return
	}
	m0 := parseMeta(head)
	var m1 boltMeta
	found1 := false
	// Page 1 sits one page in; with page 0 unreadable, try every page size
	// bbolt could have used, as bbolt does.
	sizes := []uint32{m0.pageSize}
	if m0.fault(0) != "" {
		sizes = nil
		for ps := uint32(minPageSize); ps <= maxPageSize; ps *= 2 {
			sizes = append(sizes, ps)
		}
	}
	for _, ps := range sizes {
		if ps < minPageSize || ps > maxPageSize || int64(ps)+metaLen > c.size {
			continue
		}
		if _, err := c.f.ReadAt(head, int64(ps)); err != nil {
			continue
		}
		m := parseMeta(head)
		if m.fault(1) == "" && m.pageSize == ps || len(sizes) == 1 {
			m1, found1 = m, true
			break
		}
	}
	f0 := m0.fault(0)
	f1 := fmt.Sprintf("no sound meta page one page in, for any page size from %d to %d bytes", minPageSize, maxPageSize)
	if found1 {
		f1 = m1.fault(1)
	}
	if m0.magic != boltMagic && (!found1 || m1.magic != boltMagic) {
		c.problem("not a bbolt database (no bbolt magic in either meta page); a foreign file is never overwritten")
		return
	}
	if f0 != "" {
		c.problem("meta page 0: %s", f0)
	}
	if f1 != "" {
		c.problem("meta page 1: %s", f1)
	}
	var m boltMeta
	switch {
	case f0 == "" && (f1 != "" || m0.txid >= m1.txid):
		m = m0
	case f1 == "":
		m = m1
	default:
		return // neither meta page is usable: nothing else can be read
	}
	c.pageSize, c.hwm = uint64(m.pageSize), m.hwm
	c.pages = (uint64(c.size) + c.pageSize - 1) / c.pageSize
	if m.hwm > c.pages || uint64(c.size) < m.hwm*c.pageSize {
		// Go on: the pages that are there are still checked, and those
		// past the end are reported rather than read.
		c.problem("truncated: meta says %d pages of %d bytes, file has %d bytes", m.hwm, m.pageSize, c.size)
	}
	words := (c.hwm + 63) / 64
	c.reachable, c.free = make([]uint64, words), make([]uint64, words)
	setBit(c.reachable, 0)
	setBit(c.reachable, 1)
	if m.freelist != noFreelist {
		c.freelist(m.freelist)
	}
	c.bucket(m.root, "", 0)
	if m.freelist == noFreelist || len(c.problems) > 0 {
		// bbolt rebuilds a freelist that is not stored from what is
		// unreachable; after another problem, pages are unreachable
		// because the walk stopped, which says nothing more.
		return
	}
	c.lost()
}

// pageAt reads page id and its overflow pages, checking the header's id
// and that the page lies below the high-water mark and inside the file. It
// marks the pages reachable.
func (c *fileCheck) pageAt(id uint64, what string) []byte {
	if id < 2 || id >= c.hwm {
		c.problem("%s: page %d outside the pages in use [2, %d)", what, id, c.hwm)
		return nil
	}
	off := int64(id * c.pageSize)
	if off+pageHeaderLen > c.size {
		c.problem("%s: page %d is past the end of the file", what, id)
		return nil
	}
	hdr := make([]byte, pageHeaderLen)
	if _, err := c.f.ReadAt(hdr, off); err != nil {
		c.problem("%s: page %d: %v", what, id, err)
		return nil
	}
	if got := native.Uint64(hdr); got != id {
		if bytes.Count(hdr, []byte{0}) == len(hdr) {
			c.problem("%s: page %d is zeroed", what, id)
		} else {
			c.problem("%s: page %d has the header of page %d (flags %#x)", what, id, got, native.Uint16(hdr[8:]))
		}
		return nil
	}
	overflow := uint64(native.Uint32(hdr[12:]))
	if id+overflow >= c.hwm {
		c.problem("%s: page %d claims %d overflow pages, past the high-water mark %d", what, id, overflow, c.hwm)
		return nil
	}
	n := int64((overflow + 1) * c.pageSize)
	if off+n > c.size {
		c.problem("%s: page %d (%d bytes) runs past the end of the file", what, id, n)
		return nil
	}
	for i := id; i <= id+overflow; i++ {
		if bit(c.reachable, i) {
			c.problem("%s: page %d is referenced twice", what, i)
			return nil
		}
		if bit(c.free, i) {
			c.problem("%s: page %d is in use and also listed free", what, i)
		}
		setBit(c.reachable, i)
	}
	buf := make([]byte, n)
	if _, err := c.f.ReadAt(buf, off); err != nil {
		c.problem("%s: page %d: %v", what, id, err)
		return nil
	}
	return buf
}

// freelist reads the freelist page and marks the pages it lists free.
func (c *fileCheck) freelist(id uint64) {
	const what = "freelist"
	p := c.pageAt(id, what)
	if p == nil {
		return
	}
	if fl := native.Uint16(p[8:]); fl != flagFreelist {
		c.problem("%s: page %d has flags %#x, want %#x", what, id, fl, flagFreelist)
		return
	}
	start, count := uint64(pageHeaderLen), uint64(native.Uint16(p[10:]))
	if count == freelistOverflow {
		count = native.Uint64(p[pageHeaderLen:])
		start += 8
	}
	if count > (uint64(len(p))-start)/8 {
		c.problem("%s: page %d claims %d ids, room for %d", what, id, count, (uint64(len(p))-start)/8)
		return
	}
	for i := range count {
		fid := native.Uint64(p[start+8*i:])
		switch {
		case fid < 2 || fid >= c.hwm:
			c.problem("%s: lists page %d, outside [2, %d)", what, fid, c.hwm)
		case bit(c.free, fid):
			c.problem("%s: lists page %d twice", what, fid)
		case bit(c.reachable, fid):
			c.problem("%s: lists page %d, which is itself or a meta page", what, fid)
		default:
			setBit(c.free, fid)
		}
	}
}

// bucket walks the tree of the bucket whose root page is root.
func (c *fileCheck) bucket(root uint64, name string, depth int) {
	c.tree(root, name, nil, nil, depth)
}

// tree checks page id of bucket name and its subtree: every key in
// [lo, hi) (nil: unbounded) and in order. It returns the subtree's last key.
func (c *fileCheck) tree(id uint64, name string, lo, hi []byte, depth int) []byte {
	if depth > maxTreeDepth {
		c.problem("%s: page %d is nested deeper than %d levels", bucketName(name), id, maxTreeDepth)
		return nil
	}
	p := c.pageAt(id, bucketName(name))
	if p == nil {
		return nil
	}
	return c.elements(p, id, name, lo, hi, depth)
}

// elements checks the elements of page p (id 0: an inline bucket's page).
func (c *fileCheck) elements(p []byte, id uint64, name string, lo, hi []byte, depth int) []byte {
	flags, count := native.Uint16(p[8:]), uint64(native.Uint16(p[10:]))
	where := fmt.Sprintf("%s: page %d", bucketName(name), id)
	if id == 0 {
		where = bucketName(name) + " (inline)"
	}
	if flags != flagBranch && flags != flagLeaf || id == 0 && flags != flagLeaf {
		c.problem("%s: flags %#x, want a branch or leaf page", where, flags)
		return nil
	}
	if pageHeaderLen+count*elementLen > uint64(len(p)) {
		c.problem("%s: %d elements do not fit in %d bytes", where, count, len(p))
		return nil
	}
	if flags == flagBranch && count == 0 {
		c.problem("%s: a branch page with no elements", where)
		return nil
	}
	prev := lo
	for i := range count {
		e := pageHeaderLen + i*elementLen
		var pos, ksize, vsize uint64
		if flags == flagBranch {
			pos, ksize = uint64(native.Uint32(p[e:])), uint64(native.Uint32(p[e+4:]))
		} else {
			pos, ksize, vsize = uint64(native.Uint32(p[e+4:])), uint64(native.Uint32(p[e+8:])), uint64(native.Uint32(p[e+12:]))
		}
		if e+pos+ksize+vsize > uint64(len(p)) {
			c.problem("%s: element %d (key %d bytes, value %d bytes at %d) overruns the page", where, i, ksize, vsize, pos)
			return prev
		}
		key := p[e+pos : e+pos+ksize]
		switch {
		case prev != nil && i > 0 && bytes.Compare(prev, key) >= 0:
			c.problem("%s: key %d (%x) is not after key %d (%x)", where, i, key, i-1, prev)
		case prev != nil && i == 0 && bytes.Compare(prev, key) > 0:
			c.problem("%s: first key %x is before its parent's key %x", where, key, prev)
		case hi != nil && bytes.Compare(key, hi) >= 0:
			c.problem("%s: key %d (%x) is not before the next key of its parent (%x)", where, i, key, hi)
		}
		if flags == flagBranch {
			next := hi
			if i+1 < count {
				ne := e + elementLen
				np, nk := uint64(native.Uint32(p[ne:])), uint64(native.Uint32(p[ne+4:]))
				if ne+np+nk <= uint64(len(p)) {
					next = p[ne+np : ne+np+nk]
				}
			}
			last := c.tree(native.Uint64(p[e+8:]), name, key, next, depth+1)
			prev = key
			if last != nil {
				prev = last
			}
			continue
		}
		prev = key
		if native.Uint32(p[e:])&leafBucket == 0 {
			continue
		}
		val := p[e+pos+ksize : e+pos+ksize+vsize]
		child := printable(key)
		if name != "" {
			child = name + "/" + child
		}
		if len(val) < bucketHeaderLen {
			c.problem("%s: bucket %s has a %d-byte header, want %d", where, child, len(val), bucketHeaderLen)
			continue
		}
		if root := native.Uint64(val); root != 0 {
			c.bucket(root, child, depth+1)
			continue
		}
		inline := val[bucketHeaderLen:]
		if len(inline) < pageHeaderLen {
			c.problem("%s (inline): %d bytes, too short for a page", bucketName(child), len(inline))
			continue
		}
		c.elements(inline, 0, child, nil, nil, depth+1)
	}
	return prev
}

// lost reports pages below the high-water mark that are neither reachable
// nor free, as ranges.
func (c *fileCheck) lost() {
	var from uint64
	inRun := false
	for id := uint64(2); id <= c.hwm; id++ {
		gone := id < c.hwm && !bit(c.reachable, id) && !bit(c.free, id)
		switch {
		case gone && !inRun:
			from, inRun = id, true
		case !gone && inRun:
			if from == id-1 {
				c.problem("page %d is neither in use nor free", from)
			} else {
				c.problem("pages %d to %d are neither in use nor free", from, id-1)
			}
			inRun = false
		}
	}
}

// bucketName names a bucket in a message; "" is the root bucket.
func bucketName(name string) string {
	if name == "" {
		return "root bucket"
	}
	return "bucket " + name
}

// printable quotes a bucket name for a message when it is not plain text.
func printable(b []byte) string {
	for _, r := range string(b) {
		if r < 0x20 || r > 0x7e {
			return fmt.Sprintf("%q", b)
		}
	}
	return string(b)
}

// damaged is ErrCorrupt naming path and listing its problems on one line.
func damaged(path string, problems []string, more int) error {
	msg := strings.Join(problems, "; ")
	if more > 0 {
		msg += fmt.Sprintf("; and %d more problems", more)
	}
	return fmt.Errorf("%w: %s: %s", ErrCorrupt, path, msg)
}

// inFile names path in an error of the file's content that does not name
// it yet (the loaders name only the bucket and key).
func inFile(path string, err error) error {
	if err == nil || strings.Contains(err.Error(), path) {
		return err
	}
	for _, class := range []error{ErrCorrupt, ErrSchema} {
		if errors.Is(err, class) {
			rest := strings.TrimPrefix(err.Error(), class.Error()+": ")
			return fmt.Errorf("%w: %s: %s", class, path, rest)
		}
	}
	return err
}

// guarded runs fn, which reads the mapped file, with memory faults turned
// into panics (runtime/debug.SetPanicOnFault) and any panic into ErrCorrupt
// naming path. After a panic the bbolt handle's locks may be held, so the
// caller must not Close it; panicked says so.
func guarded(path string, fn func() error) (err error, panicked bool) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			err, panicked = fmt.Errorf("%w: %s: reading the file failed: %v", ErrCorrupt, path, r), true
		}
	}()
	return fn(), false
}

// openChecked opens path for bbolt: a missing path is created (when create
// is set), an existing one is locked (shared when readOnly) within timeout
// and verified by verifyFile before bbolt maps it. The returned file holds
// the lock; bbolt.Options.OpenFile hands it to bbolt, which closes it.
func openChecked(path string, create, readOnly bool, timeout time.Duration) (*os.File, error) {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if errors.Is(err, os.ErrNotExist) && create {
		if f, err = os.OpenFile(path, flag|os.O_CREATE|os.O_EXCL, 0o600); err == nil {
			if err := lockFile(f, !readOnly, timeout); err != nil {
				f.Close()
				return nil, lockErr(path, timeout, err)
			}
			return f, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("breakerstore: %w", err) // the *PathError names the file
	}
	if err := lockFile(f, !readOnly, timeout); err != nil {
		f.Close()
		return nil, lockErr(path, timeout, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("breakerstore: open %s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%w: %s: not a regular file", ErrCorrupt, path)
	}
	if problems, more := verifyFile(f, st.Size()); len(problems) > 0 {
		f.Close()
		return nil, damaged(path, problems, more)
	}
	return f, nil
}

func lockErr(path string, timeout time.Duration, err error) error {
	if errors.Is(err, errLockTimeout) {
		return fmt.Errorf("%w: %s (gave up after %v)", ErrLocked, path, timeout)
	}
	return fmt.Errorf("breakerstore: lock %s: %w", path, err)
}
