package breakerstore

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"time"

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
// their expiry. Each record is an entity of the group commit (or of a
// request's batch with SyncAlways), written on its own; the table is one
// more, whose write deletes the records dropped.
type attemptTable struct {
	seed   maphash.Seed
	cap    int // per shard
	queued bool
	qmu    sync.Mutex // guards queued
	shards [attemptShards]attemptShard
}

type attemptShard struct {
	mu   sync.Mutex
	m    map[policy.CallKey]*attemptEntry
	fifo []fifoEntry      // insertion order, for eviction at the cap
	dels []policy.CallKey // dropped since the last commit, in order
	_    [32]byte
}

// attemptEntry is one call's record; its shard's mu guards it. An entry
// made by ClaimAttempt for a call never decided has the zero Attempts until
// its answer is recorded; it is not written, evicted or expired while
// claimed.
type attemptEntry struct {
	sh      *attemptShard
	key     policy.CallKey
	v       fleet.Attempts
	seq     uint64 // matches the fifo entry that inserted it
	dirty   bool
	gone    bool          // dropped from the table: nothing to write
	claimed bool          // a request is deciding the call's next attempt
	wake    chan struct{} // closed when the claim ends; made by the first request to wait for it
}

// endClaim ends e's claim and wakes the requests waiting for it; sh.mu is
// held.
func (e *attemptEntry) endClaim() {
	e.claimed = false
	if e.wake != nil {
		close(e.wake)
		e.wake = nil
	}
}

// write implements entity.
func (e *attemptEntry) write(tx *bbolt.Tx, clear bool) (int, error) {
	e.sh.mu.Lock()
	if clear {
		e.dirty = false
	}
	if e.gone {
		e.sh.mu.Unlock()
		return 0, nil
	}
	// The key and the record in one allocation; bbolt keeps both until
	// the transaction ends.
	k := e.key
	kv := make([]byte, 0, len(k.Tenant)+1+len(k.CallID)+attemptsLen(&e.v))
	kv = append(append(append(kv, k.Tenant...), 0), k.CallID...)
	n := len(kv)
	kv = appendAttempts(kv, &e.v)
	e.sh.mu.Unlock()
	// The shard is not held through bbolt's Put, which searches the
	// bucket's tree: a ClaimAttempt of the shard does not wait for the
	// disk's pages. A record dropped meanwhile is among the table's
	// deletions, which its write applies after this Put, in this commit
	// or the next.
	return 1, tx.Bucket(bucketAttempts).Put(kv[:n:n], kv[n:])
}

// redirty implements entity.
func (e *attemptEntry) redirty() bool {
	e.sh.mu.Lock()
	defer e.sh.mu.Unlock()
	if e.dirty || e.gone {
		return false
	}
	e.dirty = true
	return true
}

// drop removes e from its shard, to be deleted from disk; sh.mu is held.
func (sh *attemptShard) drop(e *attemptEntry) {
	delete(sh.m, e.key)
	e.gone = true
	sh.dels = append(sh.dels, e.key)
}

type fifoEntry struct {
	key policy.CallKey
	seq uint64
}

func (t *attemptTable) init(records int) {
	t.seed = maphash.MakeSeed()
	t.cap = max(records/attemptShards, 1)
	for i := range t.shards {
		t.shards[i].m = map[policy.CallKey]*attemptEntry{}
	}
}

func (t *attemptTable) shard(k policy.CallKey) *attemptShard {
	var h maphash.Hash
	h.SetSeed(t.seed)
	h.WriteString(k.Tenant)
	h.WriteByte(0)
	h.WriteString(k.CallID)
	return &t.shards[h.Sum64()%attemptShards]
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
// call not seen before (its record) and a wait.
func (s *Store) ClaimAttempt(k policy.CallKey, attempt uint32) (ans policy.Answer, replay bool, err error) {
	if s.closed.Load() {
		return policy.Answer{}, false, ErrClosed
	}
	t := &s.attempts
	sh := t.shard(k)
	for {
		now := s.now()
		sh.mu.Lock()
		e, ok := sh.m[k]
		if !ok {
			e = t.insert(sh, k, s.attemptSeq.Add(1))
			e.claimed = true
			sh.mu.Unlock()
			return policy.Answer{}, false, nil
		}
		if e.claimed {
			if e.wake == nil {
				e.wake = make(chan struct{})
			}
			wake := e.wake
			sh.mu.Unlock()
			<-wake
			continue
		}
		replay, err = e.v.Check(now, attempt)
		if replay {
			ans = e.v.Answer
		}
		e.claimed = !replay && err == nil
		sh.mu.Unlock()
		return ans, replay, err
	}
}

// ReleaseAttempt ends the claim ClaimAttempt gave on call k without an
// answer recorded (the decision failed), so a request waiting for it
// decides instead. It is safe for concurrent use.
func (s *Store) ReleaseAttempt(k policy.CallKey) {
	sh := s.attempts.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || !e.claimed {
		return
	}
	e.endClaim()
	if e.v.Attempt == 0 {
		delete(sh.m, k) // never decided, never written: nothing to delete on disk
		e.gone = true
	}
}

// LastAnswer returns the answer policyd gave to the highest attempt of call
// k it decided, while it is remembered. It is safe for concurrent use.
func (s *Store) LastAnswer(k policy.CallKey) (policy.Answer, bool) {
	sh := s.attempts.shard(k)
	now := s.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[k]
	if !ok || e.v.Attempt == 0 || now >= e.v.Expiry {
		return policy.Answer{}, false
	}
	return e.v.Answer, true
}

// insert adds a record of call k, not yet decided, to sh; sh.mu is held.
func (t *attemptTable) insert(sh *attemptShard, k policy.CallKey, seq uint64) *attemptEntry {
	k = cloneCallKey(k)
	e := &attemptEntry{sh: sh, key: k, seq: seq}
	sh.m[k] = e
	sh.fifo = append(sh.fifo, fifoEntry{key: k, seq: seq})
	return e
}

// evict drops the oldest records of sh, claimed ones aside, until it holds
// at most the cap, and reports whether any went; sh.mu is held.
func (t *attemptTable) evict(sh *attemptShard) bool {
	evicted := false
	for n := len(sh.fifo); len(sh.m) > t.cap && n > 0; n-- {
		old := sh.fifo[0]
		sh.fifo = sh.fifo[1:]
		switch oe, ok := sh.m[old.key]; {
		case !ok || oe.seq != old.seq:
			// gone already
		case oe.claimed:
			sh.fifo = append(sh.fifo, old) // being decided: keep it
		default:
			sh.drop(oe)
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
	sh := t.shard(k)
	sh.mu.Lock()
	e, ok := sh.m[k]
	if !ok {
		e = t.insert(sh, k, s.attemptSeq.Add(1))
	}
	evicted := false
	if e.v.Attempt == 0 {
		e.claimed = true // the record being made is not the one to evict
		evicted = t.evict(sh)
	}
	e.endClaim()
	changed := e.v.Decided(attempt, ans, keep) != 0
	newlyDirty := changed && !e.dirty
	if newlyDirty {
		e.dirty = true
	}
	sh.mu.Unlock()
	if evicted && t.markDirty() {
		s.queue(t)
	}
	if !changed {
		return nil
	}
	return s.changed(p, e, newlyDirty)
}

// cloneCallKey copies k's strings into one allocation, so the table does not
// pin a request's buffers.
func cloneCallKey(k policy.CallKey) policy.CallKey {
	j := k.Tenant + "\x00" + k.CallID
	return policy.CallKey{Tenant: j[:len(k.Tenant)], CallID: j[len(k.Tenant)+1:]}
}

// expire drops the records past their expiry at now; the flusher's sweep
// calls it. It reports whether any went.
func (t *attemptTable) expire(now int64) bool {
	dropped := false
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			if now >= e.v.Expiry && !e.claimed {
				sh.drop(e)
				dropped = true
			}
		}
		sh.fifo = slices.DeleteFunc(sh.fifo, func(f fifoEntry) bool {
			e, ok := sh.m[f.key]
			return !ok || e.seq != f.seq
		})
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

// redirty implements entity.
func (t *attemptTable) redirty() bool { return t.markDirty() }

// write implements entity: the deletions of the records dropped. With
// clear, those written leave the lists once tx commits.
func (t *attemptTable) write(tx *bbolt.Tx, clear bool) (int, error) {
	if clear {
		t.qmu.Lock()
		t.queued = false
		t.qmu.Unlock()
	}
	b := tx.Bucket(bucketAttempts)
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, k := range sh.dels {
			if _, back := sh.m[k]; back {
				continue
			}
			if err := b.Delete(joinKey(k.Tenant, k.CallID)); err != nil {
				sh.mu.Unlock()
				return n, err
			}
		}
		nd := len(sh.dels)
		n += nd
		sh.mu.Unlock()
		if clear && nd > 0 {
			tx.OnCommit(func() {
				sh.mu.Lock()
				sh.dels = slices.Delete(sh.dels, 0, nd)
				sh.mu.Unlock()
			})
		}
	}
	return n, nil
}

// attemptsRecordV1 is the version byte of the attempts record:
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
	ans := &a.Answer
	be := binary.BigEndian
	version := byte(attemptsRecordV1)
	if ans.Target != "" {
		version = attemptsRecordV2
	}
	v = append(v, version)
	v = be.AppendUint32(v, a.Attempt)
	v = be.AppendUint64(v, uint64(a.Expiry))
	v = append(v, boolByte(ans.Retry))
	v = be.AppendUint64(v, uint64(ans.Delay))
	v = be.AppendUint64(v, uint64(ans.AttemptTimeout))
	v = append(v, byte(ans.Stop), byte(ans.Disposition), byte(ans.Category))
	v = be.AppendUint16(v, uint16(ans.Checks))
	v = append(v, byte(ans.Breaker))
	v = be.AppendUint64(v, math.Float64bits(ans.TenantTokens))
	v = be.AppendUint64(v, ans.RunRemaining)
	v = be.AppendUint64(v, uint64(fromTime(ans.Deadline)))
	v = be.AppendUint16(v, uint16(len(ans.Class)))
	v = append(v, ans.Class...)
	v = be.AppendUint16(v, uint16(len(ans.Note)))
	v = append(v, ans.Note...)
	if version == attemptsRecordV2 {
		v = be.AppendUint16(v, uint16(len(ans.Target)))
		v = append(v, ans.Target...)
	}
	return v
}

func decodeAttempts(v []byte) (fleet.Attempts, error) {
	var a fleet.Attempts
	if len(v) < attemptsFixedLen+4 || (v[0] != attemptsRecordV1 && v[0] != attemptsRecordV2) {
		return a, fmt.Errorf("attempts record of %d bytes, want at least %d of version %d or %d", len(v), attemptsFixedLen+4,
			attemptsRecordV1, attemptsRecordV2)
	}
	be := binary.BigEndian
	if v[13] > 1 {
		return a, errors.New("attempts record: retry flag is not 0 or 1")
	}
	a.Attempt = be.Uint32(v[1:])
	a.Expiry = int64(be.Uint64(v[5:]))
	ans := &a.Answer
	ans.Retry = v[13] == 1
	ans.Delay = time.Duration(be.Uint64(v[14:]))
	ans.AttemptTimeout = time.Duration(be.Uint64(v[22:]))
	ans.Stop, ans.Disposition, ans.Category = policy.StopReason(v[30]), policy.Disposition(v[31]), policy.Category(v[32])
	ans.Checks = policy.Check(be.Uint16(v[33:]))
	ans.Breaker = policy.BreakerState(v[35])
	ans.TenantTokens = math.Float64frombits(be.Uint64(v[36:]))
	ans.RunRemaining = be.Uint64(v[44:])
	ans.Deadline = toTime(int64(be.Uint64(v[52:])))
	rest := v[attemptsFixedLen:]
	var ok bool
	if ans.Class, rest, ok = lenString(rest); !ok {
		return a, errors.New("attempts record: classification overruns the record")
	}
	if ans.Note, rest, ok = lenString(rest); !ok {
		return a, errors.New("attempts record: pushback note overruns the record")
	}
	if v[0] == attemptsRecordV2 {
		if ans.Target, rest, ok = lenString(rest); !ok {
			return a, errors.New("attempts record: target overruns the record")
		}
	}
	if len(rest) != 0 {
		return a, errors.New("attempts record: bytes follow its last field")
	}
	return a, nil
}

// lenString reads a uint16-length-prefixed string off b.
func lenString(b []byte) (string, []byte, bool) {
	if len(b) < 2 {
		return "", b, false
	}
	n := int(binary.BigEndian.Uint16(b))
	if len(b) < 2+n {
		return "", b, false
	}
	return string(b[2 : 2+n]), b[2+n:], true
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
			slices.SortFunc(sh.fifo, func(a, b fifoEntry) int { return cmp.Compare(sh.m[a.key].v.Expiry, sh.m[b.key].v.Expiry) })
			for len(sh.m) > t.cap {
				old := sh.fifo[0]
				sh.fifo = sh.fifo[1:]
				sh.drop(sh.m[old.key])
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
		tenant, call, ok := splitKey(k)
		if !ok || call == "" {
			return corrupt(bucketAttempts, k, errors.New("key is not tenant 0x00 call id"))
		}
		a, err := decodeAttempts(v)
		if err != nil {
			return corrupt(bucketAttempts, k, err)
		}
		key := policy.CallKey{Tenant: tenant, CallID: call}
		sh := t.shard(key)
		if now >= a.Expiry {
			sh.dels = append(sh.dels, key)
			dropped = true
			return nil
		}
		e := &attemptEntry{sh: sh, key: key, v: a, seq: s.attemptSeq.Add(1)}
		sh.m[key] = e
		sh.fifo = append(sh.fifo, fifoEntry{key: key, seq: e.seq})
		return nil
	})
}
