package breakerstore

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// bucketAttempts holds what was decided per call; see doc.go.
var bucketAttempts = []byte("attempts")

// DefaultMaxAttemptRecords is Options.MaxAttemptRecords' default.
const DefaultMaxAttemptRecords = 100_000

// attemptShards is the number of independently locked parts of the table.
const attemptShards = 16

// attemptTable remembers, per call (tenant and call id), the highest
// attempt decided and its answer (a fleet.Attempts), bounded in memory by
// Options.MaxAttemptRecords and on disk by the same count: past the cap
// the oldest record goes first, and the flusher's sweep drops records past
// their expiry.
//
// The table holds no pointers for the garbage collector to mark, however
// many calls it remembers: a shard's records are fixed-size slots in one
// slice, found through a map from the 64-bit hash of the call's key to the
// first slot of that hash (slots of one hash chain through next), and each
// slot's key (tenant 0x00 call id) and encoded record (appendAttempts, the
// bytes written to disk) lie in the shard's arena. A slot keeps the fields
// the attempts check reads, so only a replay decodes its record.
//
// The table is one entity of the group commit: its write puts the records
// changed since the last one and deletes those dropped, each set sorted by
// key, in one pass over the bucket. With SyncAlways a request's batch also
// writes its own records (attemptRecord).
type attemptTable struct {
	seed   maphash.Seed
	cap    int // per shard
	queued bool
	qmu    sync.Mutex // guards queued
	shards [attemptShards]attemptShard
}

// attemptShard is one independently locked part of the table; mu guards
// every field.
type attemptShard struct {
	mu      sync.Mutex
	index   map[uint64]int32 // key hash -> the first slot of that hash
	slots   []attemptSlot
	free    []int32 // slots not in use
	arena   []byte  // the slots' keys and records
	garbage int     // bytes of arena no slot uses
	fifo    []fifoEntry
	dirty   []fifoEntry // records to write: changed since the last group commit took the list
	writing []fifoEntry // the records a group commit is writing: back to dirty if it fails
	dels    []byte      // keys dropped since the last group commit, each a uvarint length and the key
	ndels   int         // keys in dels
	wakes   map[int32]chan struct{}
	_       [32]byte
}

// attemptSlot is one call's record, or a free slot (seq 0). A slot made
// by ClaimAttempt for a call never decided has attempt 0 and no record
// until its answer is recorded; it is not written, evicted or expired
// while claimed.
type attemptSlot struct {
	hash    uint64
	seq     uint64 // matches the fifo entry that inserted it; 0: free
	expiry  int64  // fleet.Attempts.Expiry
	off     uint32 // the key's offset in the arena; the record follows it
	klen    uint32
	vlen    uint32 // the record's length, 0 before the first answer
	vcap    uint32 // bytes of arena the record may use in place
	next    int32  // the next slot of the same hash, -1 for none
	attempt uint32 // fleet.Attempts.Attempt
	stop    policy.StopReason
	retry   bool // the answer's Retry
	flow    bool // the answer's FlowControlled, not in the record
	degr    bool // the answer's Degraded, not in the record
	claimed bool // a request is deciding the call's next attempt
	listed  bool // in dirty
}

// attemptReserve is the room for a record kept after a new slot's key:
// a record with a classification and a note of 32 bytes together fits.
const attemptReserve = attemptsFixedLen + 6 + 32

// fifoEntry names the occupant of a slot: seq tells a slot's later
// occupants apart.
type fifoEntry struct {
	slot int32
	seq  uint64
}

// attemptRecord is one record of the table as an entity of a request's
// SyncAlways batch: its write puts the record, if the call still holds
// the slot. The group commit writes it again, harmlessly.
type attemptRecord struct {
	sh *attemptShard
	at fifoEntry
}

func (t *attemptTable) init(records int) {
	t.seed = maphash.MakeSeed()
	t.cap = max(records/attemptShards, 1)
	for i := range t.shards {
		t.shards[i].index = map[uint64]int32{}
	}
}

// hash returns the hash of call k, which picks its shard and its slots.
func (t *attemptTable) hash(k policy.CallKey) uint64 {
	var h maphash.Hash
	h.SetSeed(t.seed)
	h.WriteString(k.Tenant)
	h.WriteByte(0)
	h.WriteString(k.CallID)
	return h.Sum64()
}

// hashKey returns the hash of the call whose key (tenant 0x00 call id) is
// key: the same as hash's, which writes the same bytes.
func (t *attemptTable) hashKey(key []byte) uint64 {
	return maphash.Bytes(t.seed, key)
}

func (t *attemptTable) shard(h uint64) *attemptShard {
	return &t.shards[h%attemptShards]
}

// key returns slot i's key; sh.mu is held and the bytes are the arena's.
func (sh *attemptShard) key(i int32) []byte {
	sl := &sh.slots[i]
	return sh.arena[sl.off : sl.off+sl.klen]
}

// record returns slot i's encoded record; sh.mu is held.
func (sh *attemptShard) record(i int32) []byte {
	sl := &sh.slots[i]
	at := sl.off + sl.klen
	return sh.arena[at : at+sl.vlen]
}

// find returns the slot of call k, of hash h, or -1; sh.mu is held.
func (sh *attemptShard) find(h uint64, k policy.CallKey) int32 {
	i, ok := sh.index[h]
	if !ok {
		return -1
	}
	for ; i >= 0; i = sh.slots[i].next {
		if sh.slots[i].hash == h && keyIs(sh.key(i), k) {
			return i
		}
	}
	return -1
}

// findKey is find for the call whose key is key.
func (sh *attemptShard) findKey(h uint64, key []byte) int32 {
	i, ok := sh.index[h]
	if !ok {
		return -1
	}
	for ; i >= 0; i = sh.slots[i].next {
		if sh.slots[i].hash == h && bytes.Equal(sh.key(i), key) {
			return i
		}
	}
	return -1
}

// keyIs reports whether key is k's tenant 0x00 call id.
func keyIs(key []byte, k policy.CallKey) bool {
	n := len(k.Tenant)
	return len(key) == n+1+len(k.CallID) && string(key[:n]) == k.Tenant && key[n] == 0 && string(key[n+1:]) == k.CallID
}

// insert adds a slot for call k (key, its tenant 0x00 call id), of hash h,
// with no record yet, and returns it; sh.mu is held.
func (sh *attemptShard) insert(h uint64, key []byte, seq uint64) int32 {
	var i int32
	if n := len(sh.free); n > 0 {
		i, sh.free = sh.free[n-1], sh.free[:n-1]
	} else {
		sh.slots = append(sh.slots, attemptSlot{})
		i = int32(len(sh.slots) - 1)
	}
	next, ok := sh.index[h]
	if !ok {
		next = -1
	}
	sh.index[h] = i
	sh.slots[i] = attemptSlot{hash: h, seq: seq, off: uint32(len(sh.arena)), klen: uint32(len(key)), vcap: attemptReserve, next: next}
	sh.arena = append(sh.arena, key...)
	sh.arena = append(sh.arena, make([]byte, attemptReserve)...)
	sh.fifo = append(sh.fifo, fifoEntry{slot: i, seq: seq})
	return i
}

// insertKey is insert for call k.
func (sh *attemptShard) insertKey(h uint64, k policy.CallKey, seq uint64) int32 {
	var buf [128]byte
	key := append(append(append(buf[:0], k.Tenant...), 0), k.CallID...)
	return sh.insert(h, key, seq)
}

// unlink frees slot i, without noting its key for deletion; sh.mu is held.
func (sh *attemptShard) unlink(i int32) {
	sl := &sh.slots[i]
	if head := sh.index[sl.hash]; head == i {
		if sl.next < 0 {
			delete(sh.index, sl.hash)
		} else {
			sh.index[sl.hash] = sl.next
		}
	} else {
		for j := head; j >= 0; j = sh.slots[j].next {
			if sh.slots[j].next == i {
				sh.slots[j].next = sl.next
				break
			}
		}
	}
	sh.garbage += int(sl.klen + sl.vcap)
	*sl = attemptSlot{}
	sh.free = append(sh.free, i)
	sh.compact()
}

// drop removes slot i from the table, to be deleted from disk; sh.mu is
// held.
func (sh *attemptShard) drop(i int32) {
	key := sh.key(i)
	sh.dels = binary.AppendUvarint(sh.dels, uint64(len(key)))
	sh.dels = append(sh.dels, key...)
	sh.ndels++
	sh.unlink(i)
}

// compact copies the slots' keys and records into a new arena once more
// than half of it is garbage; sh.mu is held.
func (sh *attemptShard) compact() {
	if sh.garbage < 64<<10 || sh.garbage < len(sh.arena)/2 {
		return
	}
	arena := make([]byte, 0, (len(sh.arena)-sh.garbage)*5/4)
	for i := range sh.slots {
		sl := &sh.slots[i]
		if sl.seq == 0 {
			continue
		}
		off := uint32(len(arena))
		arena = append(arena, sh.arena[sl.off:sl.off+sl.klen+sl.vlen]...)
		sl.off, sl.vcap = off, sl.vlen
	}
	sh.arena, sh.garbage = arena, 0
}

// set records a as slot i's record, with ans's flags the record does not
// hold; sh.mu is held.
func (sh *attemptShard) set(i int32, a *fleet.Attempts) {
	sl := &sh.slots[i]
	n := uint32(attemptsLen(a))
	if n > sl.vcap {
		// Too long for its place: the key and the record move to the end.
		sh.garbage += int(sl.klen + sl.vcap)
		off := uint32(len(sh.arena))
		sh.arena = append(sh.arena, sh.arena[sl.off:sl.off+sl.klen]...)
		sh.arena = slices.Grow(sh.arena, int(n))
		sl.off, sl.vcap = off, n
	}
	at := sl.off + sl.klen
	n = uint32(len(appendAttempts(sh.arena[at:at:at+n], a))) // attemptsLen is a bound: a record without a target is shorter
	if end := int(at + n); end > len(sh.arena) {
		sh.arena = sh.arena[:end]
	}
	sl.vlen, sl.attempt, sl.expiry = n, a.Attempt, a.Expiry
	sl.stop, sl.retry = a.Answer.Stop, a.Answer.Retry
	sl.flow, sl.degr = a.Answer.FlowControlled, a.Answer.Degraded
	sh.compact()
}

// attempts returns slot i's record: with full, its answer decoded from
// the arena; otherwise only what fleet.Attempts.Check reads. sh.mu is held.
func (sh *attemptShard) attempts(i int32, full bool) fleet.Attempts {
	sl := &sh.slots[i]
	if full && sl.attempt != 0 {
		a, err := decodeAttempts(sh.record(i))
		if err != nil {
			panic("breakerstore: attempt record in memory does not decode: " + err.Error()) // a bug of set
		}
		a.Answer.FlowControlled, a.Answer.Degraded = sl.flow, sl.degr
		return a
	}
	return fleet.Attempts{Attempt: sl.attempt, Expiry: sl.expiry, Answer: policy.Answer{Retry: sl.retry, Stop: sl.stop}}
}

// endClaim ends slot i's claim and wakes the requests waiting for it;
// sh.mu is held.
func (sh *attemptShard) endClaim(i int32) {
	sh.slots[i].claimed = false
	if w, ok := sh.wakes[i]; ok {
		close(w)
		delete(sh.wakes, i)
	}
}

// ClaimAttempt is the attempts check and the claim on deciding, in one step
// per call (see fleet.Attempts.Check): for the same attempt again it
// returns the answer recorded, with replay true; for a lower attempt, or
// any after a STOP, a *fleet.Refusal naming attempt; otherwise the caller
// holds the call's claim and decides the attempt, then records the answer
// through Changes.RecordAttempt or, when the decision fails, lets go with
// ReleaseAttempt. While the claim is held, a ClaimAttempt of the same call
// (a duplicate RPC, say) waits for it to end and then answers as above, so
// one attempt is decided once and every duplicate replays its answer. It
// is safe for concurrent use, and allocation-free but for a refusal, a
// replay (its answer's strings), a wait and the growth of the table.
func (s *Store) ClaimAttempt(k policy.CallKey, attempt uint32) (ans policy.Answer, replay bool, err error) {
	if s.closed.Load() {
		return policy.Answer{}, false, ErrClosed
	}
	t := &s.attempts
	h := t.hash(k)
	sh := t.shard(h)
	for {
		now := s.now()
		sh.mu.Lock()
		i := sh.find(h, k)
		if i < 0 {
			i = sh.insertKey(h, k, s.attemptSeq.Add(1))
			sh.slots[i].claimed = true
			sh.mu.Unlock()
			return policy.Answer{}, false, nil
		}
		if sh.slots[i].claimed {
			if sh.wakes == nil {
				sh.wakes = map[int32]chan struct{}{}
			}
			wake, ok := sh.wakes[i]
			if !ok {
				wake = make(chan struct{})
				sh.wakes[i] = wake
			}
			sh.mu.Unlock()
			<-wake
			continue
		}
		a := sh.attempts(i, false)
		replay, err = a.Check(now, attempt)
		if replay {
			ans = sh.attempts(i, true).Answer
		}
		sh.slots[i].claimed = !replay && err == nil
		sh.mu.Unlock()
		return ans, replay, err
	}
}

// ReleaseAttempt ends the claim ClaimAttempt gave on call k without an
// answer recorded (the decision failed), so a request waiting for it
// decides instead. It is safe for concurrent use.
func (s *Store) ReleaseAttempt(k policy.CallKey) {
	h := s.attempts.hash(k)
	sh := s.attempts.shard(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(h, k)
	if i < 0 || !sh.slots[i].claimed {
		return
	}
	sh.endClaim(i)
	if sh.slots[i].attempt == 0 {
		sh.unlink(i) // never decided, never written: nothing to delete on disk
	}
}

// LastAnswer returns the answer policyd gave to the highest attempt of call
// k it decided, while it is remembered. It is safe for concurrent use.
func (s *Store) LastAnswer(k policy.CallKey) (policy.Answer, bool) {
	a, n := s.lastAnswer(k)
	return a, n > 0
}

// lastAnswer is LastAnswer with the attempt it answered (0: none).
func (s *Store) lastAnswer(k policy.CallKey) (policy.Answer, uint32) {
	h := s.attempts.hash(k)
	sh := s.attempts.shard(h)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.find(h, k)
	if i < 0 || sh.slots[i].attempt == 0 || now >= sh.slots[i].expiry {
		return policy.Answer{}, 0
	}
	a := sh.attempts(i, true)
	return a.Answer, a.Attempt
}

// evict drops the oldest records of sh, claimed ones aside, until it holds
// at most the cap, and reports whether any went; sh.mu is held.
func (t *attemptTable) evict(sh *attemptShard) bool {
	evicted := false
	for n := len(sh.fifo); len(sh.slots)-len(sh.free) > t.cap && n > 0; n-- {
		old := sh.fifo[0]
		sh.fifo = sh.fifo[1:]
		switch sl := &sh.slots[old.slot]; {
		case sl.seq != old.seq:
			// gone already
		case sl.claimed:
			sh.fifo = append(sh.fifo, old) // being decided: keep it
		default:
			sh.drop(old.slot)
			evicted = true
		}
	}
	return evicted
}

// recordAttempt remembers ans as the answer to attempt of call k, kept
// until keep (Unix ns), and ends the call's claim (see ClaimAttempt); a
// call decided for the first time evicts the oldest record of its shard
// past the cap. It is a counter change: flushed per the sync mode, or
// joining p.
func (s *Store) recordAttempt(k policy.CallKey, attempt uint32, ans policy.Answer, keep int64, p *pending) error {
	if s.closed.Load() {
		s.ReleaseAttempt(k)
		return ErrClosed
	}
	t := &s.attempts
	h := t.hash(k)
	sh := t.shard(h)
	sh.mu.Lock()
	i := sh.find(h, k)
	if i < 0 {
		i = sh.insertKey(h, k, s.attemptSeq.Add(1))
	}
	evicted := false
	if sh.slots[i].attempt == 0 {
		sh.slots[i].claimed = true // the record being made is not the one to evict
		evicted = t.evict(sh)
	}
	sh.endClaim(i)
	a := sh.attempts(i, false)
	changed := a.Decided(attempt, ans, keep) != 0
	if changed {
		sh.set(i, &a)
		if sl := &sh.slots[i]; !sl.listed {
			sl.listed = true
			sh.dirty = append(sh.dirty, fifoEntry{slot: i, seq: sl.seq})
		}
	}
	rec := attemptRecord{sh: sh, at: fifoEntry{slot: i, seq: sh.slots[i].seq}}
	sh.mu.Unlock()
	if (evicted || changed) && t.markDirty() {
		s.queue(t)
	}
	if !changed || s.opts.Sync != SyncAlways {
		return nil
	}
	if p != nil {
		p.add(rec)
		return nil
	}
	p = shared()
	p.add(rec)
	return s.commit(p)
}

// expire drops the records past their expiry at now; the flusher's sweep
// calls it. It reports whether any went.
func (t *attemptTable) expire(now int64) bool {
	dropped := false
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for j := range sh.slots {
			if sl := &sh.slots[j]; sl.seq != 0 && now >= sl.expiry && !sl.claimed {
				sh.drop(int32(j))
				dropped = true
			}
		}
		sh.fifo = slices.DeleteFunc(sh.fifo, func(f fifoEntry) bool { return sh.slots[f.slot].seq != f.seq })
		sh.mu.Unlock()
	}
	return dropped
}

func (t *attemptTable) markDirty() bool {
	t.qmu.Lock()
	defer t.qmu.Unlock()
	if t.queued {
		return false
	}
	t.queued = true
	return true
}

// redirty implements entity: after a failed group commit, the records it
// was writing are listed again.
func (t *attemptTable) redirty() bool {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, d := range sh.writing {
			if sl := &sh.slots[d.slot]; sl.seq == d.seq && !sl.listed {
				sl.listed = true
				sh.dirty = append(sh.dirty, d)
			}
		}
		sh.writing = sh.writing[:0]
		sh.mu.Unlock()
	}
	return t.markDirty()
}

// attemptPut is a record to put: key and value, slices of one buffer.
type attemptPut struct{ k, v []byte }

// write implements entity: the records changed and the deletions of the
// records dropped, each set in key order. With clear, the records leave
// the dirty lists (listed again by redirty if tx fails) and the deletions
// leave theirs once tx commits.
func (t *attemptTable) write(tx *bbolt.Tx, clear bool) (int, error) {
	if clear {
		t.qmu.Lock()
		t.queued = false
		t.qmu.Unlock()
	}
	var puts []attemptPut
	var dels [][]byte
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		puts = sh.appendPuts(puts)
		for d := sh.dels; len(d) > 0; {
			n, w := binary.Uvarint(d)
			k := d[w : w+int(n) : w+int(n)]
			d = d[w+int(n):]
			if sh.findKey(t.hashKey(k), k) >= 0 {
				continue // decided again since: its record is among the puts
			}
			dels = append(dels, k)
		}
		if clear {
			for _, d := range sh.dirty {
				sh.slots[d.slot].listed = false
			}
			sh.writing = append(sh.writing, sh.dirty...)
			sh.dirty = sh.dirty[:0]
		}
		nb, nk := len(sh.dels), sh.ndels
		sh.mu.Unlock()
		if clear {
			tx.OnCommit(func() { sh.written(nb, nk) })
		}
	}
	b := tx.Bucket(bucketAttempts)
	slices.SortFunc(puts, func(a, b attemptPut) int { return bytes.Compare(a.k, b.k) })
	for _, p := range puts {
		if err := b.Put(p.k, p.v); err != nil {
			return 0, err
		}
	}
	slices.SortFunc(dels, bytes.Compare)
	for _, k := range dels {
		if err := b.Delete(k); err != nil {
			return 0, err
		}
	}
	return len(puts) + len(dels), nil
}

// appendPuts appends the records of the dirty list still held, copied out
// of the arena into one buffer (bbolt keeps them until the transaction
// ends, and the shard is not held through its Puts); sh.mu is held.
func (sh *attemptShard) appendPuts(puts []attemptPut) []attemptPut {
	n := 0
	for _, d := range sh.dirty {
		if sl := &sh.slots[d.slot]; sl.seq == d.seq {
			n += int(sl.klen + sl.vlen)
		}
	}
	buf := make([]byte, 0, n)
	for _, d := range sh.dirty {
		sl := &sh.slots[d.slot]
		if sl.seq != d.seq {
			continue // dropped since
		}
		at := len(buf)
		buf = append(buf, sh.arena[sl.off:sl.off+sl.klen+sl.vlen]...)
		k := at + int(sl.klen)
		puts = append(puts, attemptPut{k: buf[at:k:k], v: buf[k:len(buf):len(buf)]})
	}
	return puts
}

// written takes the deletions a group commit made (the first nb bytes of
// dels, nk keys) off the list and forgets the records it wrote.
func (sh *attemptShard) written(nb, nk int) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.dels = slices.Delete(sh.dels, 0, nb)
	sh.ndels -= nk
	sh.writing = sh.writing[:0]
}

// write implements entity: r's record, if its call still holds the slot.
func (r attemptRecord) write(tx *bbolt.Tx, _ bool) (int, error) {
	sh := r.sh
	sh.mu.Lock()
	sl := &sh.slots[r.at.slot]
	if sl.seq != r.at.seq || sl.vlen == 0 {
		sh.mu.Unlock()
		return 0, nil // dropped since: among the table's deletions
	}
	kv := slices.Clone(sh.arena[sl.off : sl.off+sl.klen+sl.vlen])
	k := int(sl.klen)
	sh.mu.Unlock()
	return 1, tx.Bucket(bucketAttempts).Put(kv[:k:k], kv[k:])
}

// redirty implements entity: the record stays listed for the group commit
// until one writes it, so a failed batch has nothing to queue.
func (r attemptRecord) redirty() bool { return false }

// attemptsRecordV1 is the version byte of the attempts record; from
// offset 13 it is fleet's packed answer (fleet.AppendAnswer), whose
// layout this table repeats:
//
//	off  size  field
//	0    1     version (1)
//	1    4     attempt, uint32 big-endian
//	5    8     expiry, Unix ns
//	13   1     retry (0/1)
//	14   8     delay, ns
//	22   8     attempt timeout, ns
//	30   1     policy.StopReason
//	31   1     policy.Disposition
//	32   1     policy.Category
//	33   2     policy.Check bits
//	35   1     policy.BreakerState
//	36   8     tenant tokens, float64 bits
//	44   8     run retries remaining
//	52   8     the call's deadline, Unix ns (0: none)
//	60   2+n   classification reason (uint16 length, bytes)
//	...  2+n   pushback note (uint16 length, bytes)
//	...  2+n   version 2 only: the target of the next attempt, when the
//	           call escalated to a fallback (policy.Answer.Target)
//
// A record without a target is written as version 1, as before.
const (
	attemptsRecordV1 = 1
	attemptsRecordV2 = 2
)

const attemptsFixedLen = 60

func encodeAttempts(a *fleet.Attempts) []byte {
	return appendAttempts(make([]byte, 0, attemptsLen(a)), a)
}

// attemptsLen is the length of a's record.
func attemptsLen(a *fleet.Attempts) int {
	return attemptsFixedLen + 6 + len(a.Answer.Class) + len(a.Answer.Note) + len(a.Answer.Target)
}

// appendAttempts appends a's record to v.
func appendAttempts(v []byte, a *fleet.Attempts) []byte {
	version := byte(attemptsRecordV1)
	if a.Answer.Target != "" {
		version = attemptsRecordV2
	}
	v = append(v, version)
	v = binary.BigEndian.AppendUint32(v, a.Attempt)
	v = binary.BigEndian.AppendUint64(v, uint64(a.Expiry))
	return fleet.AppendAnswer(v, &a.Answer)
}

func decodeAttempts(v []byte) (fleet.Attempts, error) {
	var a fleet.Attempts
	if len(v) < attemptsFixedLen+4 || (v[0] != attemptsRecordV1 && v[0] != attemptsRecordV2) {
		return a, fmt.Errorf("attempts record of %d bytes, want at least %d of version %d or %d", len(v), attemptsFixedLen+4,
			attemptsRecordV1, attemptsRecordV2)
	}
	a.Attempt = binary.BigEndian.Uint32(v[1:])
	a.Expiry = int64(binary.BigEndian.Uint64(v[5:]))
	rest, err := fleet.ReadAnswer(v[13:], &a.Answer, v[0] == attemptsRecordV2)
	if err != nil {
		return a, fmt.Errorf("attempts record: %w", err)
	}
	if len(rest) != 0 {
		return a, errors.New("attempts record: bytes follow its last field")
	}
	return a, nil
}

// loadAttempts reads the attempts bucket into memory, dropping records past
// their expiry and the oldest beyond the cap (the next group commit deletes
// them).
func (s *Store) loadAttempts(tx *bbolt.Tx, now int64) error {
	t := &s.attempts
	dropped := false
	defer func() {
		// The shards' seed is new at every open, so a shard may now hold
		// more than its cap: the oldest (soonest to expire) go first.
		for i := range t.shards {
			sh := &t.shards[i]
			slices.SortFunc(sh.fifo, func(a, b fifoEntry) int {
				return cmp.Compare(sh.slots[a.slot].expiry, sh.slots[b.slot].expiry)
			})
			for len(sh.slots)-len(sh.free) > t.cap {
				old := sh.fifo[0]
				sh.fifo = sh.fifo[1:]
				sh.drop(old.slot)
				dropped = true
			}
		}
		if dropped && t.markDirty() {
			s.queue(t) // the next group commit deletes them
		}
	}()
	b := tx.Bucket(bucketAttempts)
	if b == nil {
		return nil // a file of an earlier layout, opened read-only by Check
	}
	return b.ForEach(func(k, v []byte) error {
		if i := bytes.IndexByte(k, 0); i < 0 || i == len(k)-1 {
			return corrupt(bucketAttempts, k, errors.New("key is not tenant 0x00 call id"))
		}
		a, err := decodeAttempts(v)
		if err != nil {
			return corrupt(bucketAttempts, k, err)
		}
		h := t.hashKey(k)
		sh := t.shard(h)
		if now >= a.Expiry {
			sh.dels = binary.AppendUvarint(sh.dels, uint64(len(k)))
			sh.dels = append(sh.dels, k...)
			sh.ndels++
			dropped = true
			return nil
		}
		sh.set(sh.insert(h, k, s.attemptSeq.Add(1)), &a)
		return nil
	})
}
