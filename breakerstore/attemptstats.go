package breakerstore

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// bucketStats holds the attempt statistics (fleet.AttemptStats), one
// record per tenant, target and hour: key tenant 0x00 target 0x00 hour
// (int64 big-endian, hours since the Unix epoch), value statsRecordV1 then
// the 16 success counts and the 16 final-failure counts, each uint64
// big-endian (statsRecordSize bytes).
var bucketStats = []byte("attemptstats")

const (
	statsRecordV1   = 1
	statsRecordSize = 1 + 2*policy.StatsAttempts*8
)

// targetStats is one tenant's and target's attempt statistics in memory,
// an entity of the group commit: the hours counted since the last one are
// written, the hours the retention dropped deleted.
type targetStats struct {
	key policy.BreakerKey // the tenant and the attempt's target
	id  uint64            // unique in the store (statsBook.ids), for tallyTable

	mu      sync.Mutex
	v       fleet.AttemptStats
	changed []int64 // hours counted since the last group commit
	dropped []int64 // hours dropped since the last group commit
	full    bool    // a failed commit: rewrite every hour, delete the rest
	dirty   bool
}

// countAttempts counts t in the attempt statistics at now and makes the
// change durable as the sync mode asks (with p, when set). It allocates
// only for a new hour or a new target.
func (s *Store) countAttempts(t policy.AttemptTally, now int64, p *pending) {
	s.countAttemptsN(nil, t, 1, now, p)
}

// targetStats returns the attempt statistics of t's tenant and target,
// made on first use, or nil when the tenant's targets are at their cap.
// The statistics of a target are never dropped, so a caller may keep the
// pointer (a breaker of the same key does: see breaker.stats).
func (s *Store) targetStats(t policy.AttemptTally) *targetStats {
	key := policy.BreakerKey{Tenant: t.Tenant, Target: t.Target}
	if ts, ok := s.attemptStats.get(key); ok {
		return ts
	}
	ts, err := s.attemptStats.getOrCreate(key, func() (*targetStats, error) {
		if !s.statsTargets.take(t.Tenant, s.opts.MaxBreakersPerTenant) {
			return nil, errStatsCap
		}
		return &targetStats{key: policy.BreakerKey{Tenant: strings.Clone(t.Tenant), Target: strings.Clone(t.Target)},
			id: s.statsTargets.ids.Add(1)}, nil
	})
	if err != nil {
		return nil
	}
	return ts
}

// statsOf returns the attempt statistics t counts in when b is the
// breaker of t's tenant and target (the outcome's breaker, most often),
// kept in b: ApplyOutcomes finds the breaker and the statistics of an
// outcome with one lookup, once the breaker has counted one.
// Otherwise (b nil, or keyed otherwise) it returns nil, and
// countAttemptsN looks them up.
func (s *Store) statsOf(b *breaker, t policy.AttemptTally) *targetStats {
	if b == nil || b.key.Tenant != t.Tenant || b.key.Target != t.Target {
		return nil
	}
	if ts := b.stats.Load(); ts != nil {
		return ts
	}
	ts := s.targetStats(t)
	if ts != nil {
		b.stats.Store(ts)
	}
	return ts
}

// countAttemptsN counts n calls that ended alike, t, in ts, the
// statistics of t's tenant and target, looked up when ts is nil.
func (s *Store) countAttemptsN(ts *targetStats, t policy.AttemptTally, n uint64, now int64, p *pending) {
	if t.Target == "" || n == 0 {
		return
	}
	if ts == nil {
		if ts = s.targetStats(t); ts == nil {
			s.statsTargets.refused.Add(n) // beyond the tenant's cap: not counted
			return
		}
	}
	ts.mu.Lock()
	hour, dropped := ts.v.CountN(now, t.Attempt, t.Success, n)
	if !slices.Contains(ts.changed, hour) {
		ts.changed = append(ts.changed, hour)
	}
	ts.dropped = append(ts.dropped, dropped...)
	newlyDirty := !ts.dirty
	ts.dirty = true
	ts.mu.Unlock()
	// The statistics are counters: an error here is a commit's, which
	// requeues them; it is not the decision's.
	_ = s.changed(p, ts, newlyDirty)
}

// tallyTable sums the tallies of one outcome batch by the statistics
// they count in (a tenant's and target's), attempt slot and result before
// they are counted, so a batch of n outcomes that ended k ways takes k
// records' locks, not n. It is a small open-addressing table, kept on the
// stack and keyed by the statistics' id, so a tally costs no hashing or
// comparing of names: a tally that finds it full is counted on its own.
// Its 128 slots hold the 96 sums of a batch that ended 96 ways; with 32 a
// worker's batch over 64 targets counted most of its outcomes one by one.
type tallyTable struct {
	used  int
	last  int // the slot the last tally went to: a batch's outcomes of one target often come together
	slots [128]tallySum
}

type tallySum struct {
	ts      *targetStats // where the sum counts; nil: the slot is free
	slot    uint32       // fleet.AttemptSlot of the tallies' attempt
	success bool
	tally   policy.AttemptTally // the first of the sum's tallies
	n       uint64
}

// add adds t, to be counted in ts (not nil), to the table and reports
// whether it fit.
func (tt *tallyTable) add(t policy.AttemptTally, ts *targetStats) bool {
	slot := uint32(fleet.AttemptSlot(t.Attempt))
	if e := &tt.slots[tt.last]; e.ts == ts && e.slot == slot && e.success == t.Success {
		e.n++
		return true
	}
	h := ts.id*0x9e3779b97f4a7c15 ^ uint64(slot)<<1
	if t.Success {
		h ^= 1
	}
	for i := range uint64(len(tt.slots)) {
		at := int((h + i) % uint64(len(tt.slots)))
		e := &tt.slots[at]
		switch {
		case e.ts == nil:
			if tt.used >= 3*len(tt.slots)/4 {
				return false // keep the probes short
			}
			*e = tallySum{ts: ts, slot: slot, success: t.Success, tally: t, n: 1}
			tt.used, tt.last = tt.used+1, at
			return true
		case e.ts == ts && e.slot == slot && e.success == t.Success:
			e.n++
			tt.last = at
			return true
		}
	}
	return false
}

// count counts every sum of the table at now.
func (tt *tallyTable) count(s *Store, now int64, p *pending) {
	if tt.used == 0 {
		return
	}
	for i := range tt.slots {
		if e := &tt.slots[i]; e.ts != nil {
			s.countAttemptsN(e.ts, e.tally, e.n, now, p)
		}
	}
}

// statsBook counts the targets with attempt statistics per tenant, so
// names a client makes up cannot fill memory: a tenant has statistics for
// at most Options.MaxBreakersPerTenant targets, as it has breakers; a
// tally for another is not counted, and counted in refused.
type statsBook struct {
	mu      sync.Mutex
	targets map[string]int // guarded by mu
	refused atomic.Uint64
	ids     atomic.Uint64 // the last targetStats.id given
}

var errStatsCap = errors.New("breakerstore: attempt statistics: the tenant's targets are at their cap")

// take counts a new target of tenant and reports whether it is within max.
func (b *statsBook) take(tenant string, max int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.targets == nil {
		b.targets = map[string]int{}
	}
	if b.targets[tenant] >= max {
		return false
	}
	b.targets[tenant]++
	return true
}

// AttemptStats returns the attempt statistics of the window from since to
// now, one entry per tenant and target with a count in it, sorted by
// tenant and target; an empty tenant or target selects every one. It is
// safe for concurrent use.
func (s *Store) AttemptStats(tenant, target string, since time.Time) ([]policy.TargetStats, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	now := s.now()
	var out []policy.TargetStats
	for _, ts := range s.attemptStats.values() {
		if (tenant != "" && ts.key.Tenant != tenant) || (target != "" && ts.key.Target != target) {
			continue
		}
		ts.mu.Lock()
		succ, fail, start := ts.v.Sum(since.UnixNano(), now)
		ts.mu.Unlock()
		if succ.Total() == 0 && fail.Total() == 0 {
			continue
		}
		out = append(out, policy.TargetStats{Tenant: ts.key.Tenant, Target: ts.key.Target,
			Start: time.Unix(0, start), End: time.Unix(0, now), Successes: succ, Failures: fail})
	}
	slices.SortFunc(out, func(a, b policy.TargetStats) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Target, b.Target))
	})
	return out, nil
}

// statsKey returns the record key of ts's hour.
func statsKey(k policy.BreakerKey, hour int64) []byte {
	key := joinKey(k.Tenant, k.Target)
	key = append(key, 0)
	return binary.BigEndian.AppendUint64(key, uint64(hour))
}

// write implements entity: the hours counted since the last group commit,
// and the deletion of those dropped (every record of the target rewritten
// after a failed commit).
func (ts *targetStats) write(tx *bbolt.Tx, clear bool) (int, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	b := tx.Bucket(bucketStats)
	n := 0
	if ts.full {
		prefix := append(joinKey(ts.key.Tenant, ts.key.Target), 0)
		var old [][]byte // collected first: a cursor deleting as it goes may skip keys
		c := b.Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			old = append(old, bytes.Clone(k))
		}
		for _, k := range old {
			if err := b.Delete(k); err != nil {
				return n, err
			}
		}
		for i := range ts.v.Hours {
			if err := b.Put(statsKey(ts.key, ts.v.Hours[i].Hour), encodeStats(&ts.v.Hours[i])); err != nil {
				return n, err
			}
			n++
		}
	} else {
		for _, h := range ts.dropped {
			if err := b.Delete(statsKey(ts.key, h)); err != nil {
				return n, err
			}
		}
		for _, h := range ts.changed {
			bk, ok := ts.v.Bucket(h)
			if !ok {
				continue // dropped since
			}
			if err := b.Put(statsKey(ts.key, h), encodeStats(&bk)); err != nil {
				return n, err
			}
			n++
		}
	}
	if clear {
		ts.dirty, ts.full = false, false
		ts.changed, ts.dropped = ts.changed[:0], ts.dropped[:0]
	}
	return n, nil
}

// redirty implements entity: after a failed commit every hour is written
// again, so nothing the commit cleared is lost.
func (ts *targetStats) redirty() bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.full = true
	if ts.dirty {
		return false
	}
	ts.dirty = true
	return true
}

func encodeStats(b *fleet.AttemptHour) []byte {
	v := make([]byte, 0, statsRecordSize)
	v = append(v, statsRecordV1)
	for _, n := range b.Successes {
		v = binary.BigEndian.AppendUint64(v, n)
	}
	for _, n := range b.Failures {
		v = binary.BigEndian.AppendUint64(v, n)
	}
	return v
}

func decodeStats(v []byte) (fleet.AttemptHour, error) {
	var b fleet.AttemptHour
	if len(v) != statsRecordSize || v[0] != statsRecordV1 {
		return b, fmt.Errorf("attempt statistics record of %d bytes, want %d of version %d", len(v), statsRecordSize, statsRecordV1)
	}
	for i := range b.Successes {
		b.Successes[i] = binary.BigEndian.Uint64(v[1+8*i:])
		b.Failures[i] = binary.BigEndian.Uint64(v[1+8*(policy.StatsAttempts+i):])
	}
	return b, nil
}

// loadStats reads the attempt statistics into memory; hours already past
// the retention are dropped, and deleted by the next group commit.
func (s *Store) loadStats(tx *bbolt.Tx, now int64) error {
	b := tx.Bucket(bucketStats)
	if b == nil {
		return nil // a file Open has not brought to this layout yet (Check reads it as it is)
	}
	err := b.ForEach(func(k, v []byte) error {
		if len(k) < 10 || k[len(k)-9] != 0 {
			return corrupt(bucketStats, k, errors.New("key is not tenant 0x00 target 0x00 hour"))
		}
		tenant, target, ok := splitKey(k[:len(k)-9])
		if !ok || target == "" {
			return corrupt(bucketStats, k, errors.New("key is not tenant 0x00 target 0x00 hour"))
		}
		bk, err := decodeStats(v)
		if err != nil {
			return corrupt(bucketStats, k, err)
		}
		bk.Hour = int64(binary.BigEndian.Uint64(k[len(k)-8:]))
		key := policy.BreakerKey{Tenant: tenant, Target: target}
		ts, _ := s.attemptStats.getOrCreate(key, func() (*targetStats, error) {
			s.statsTargets.take(tenant, math.MaxInt) // those on disk count toward the cap
			return &targetStats{key: key}, nil
		})
		ts.v.Add(bk)
		return nil
	})
	if err != nil {
		return err
	}
	for _, ts := range s.attemptStats.values() {
		if dropped := ts.v.Expire(now); len(dropped) > 0 {
			ts.dropped, ts.dirty = dropped, true
			s.queue(ts)
		}
	}
	return nil
}
