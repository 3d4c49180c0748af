package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// CheckSlots is checkSlots, for the external tests that start a Cluster.
var CheckSlots = checkSlots

// ServerCPU is serverCPU, for the external benchmarks.
var ServerCPU = serverCPU

// LiveReplicas is the count of live replicas the store last read.
func (s *Store) LiveReplicas() int { return s.degraded.replicas() }

// Debts is the number of degraded-mode grants not charged to the engine yet.
func (s *Store) Debts() int {
	s.degraded.mu.Lock()
	defer s.degraded.mu.Unlock()
	n := len(s.degraded.debts)
	for _, t := range s.degraded.spent {
		if t > 0 {
			n++
		}
	}
	return n
}

// FlushHeld sends the held outcome batches, as the flusher does every
// FlushInterval.
func (s *Store) FlushHeld() { s.flushHeld() }

// FlushAudit writes the buffered audit records, as the flusher does every
// FlushInterval.
func (s *Store) FlushAudit() { s.flushAudit(s.ctx, false) }

// breakerFields names a breaker record's first numbers (breakerNumbers).
var breakerFields = [...]string{"state", "forced", "mode", "open_until", "changed", "gen", "cooldown",
	"last_failure", "consecutive", "half_open_ok", "slot_width"}

// field returns the number of the record's field f, a name of
// breakerFields; slot i's epoch, calls and failures are r.n[11+3*i:].
func (r *breakerRecord) field(f string) int64 {
	for i, name := range breakerFields {
		if name == f {
			return r.n[i]
		}
	}
	panic("redisstore: no breaker field " + f)
}

// BreakerField reads field f (of breakerFields) of the breaker record v.
func BreakerField(v []byte, f string) (int64, error) {
	r, err := decodeBreakerRecord(v)
	return r.field(f), err
}

// FeedGrace is feedGrace: how much longer than FeedBlock a feed's read may take.
const FeedGrace = feedGrace

// HoldHeldSending takes the write lock of s's held outcomes, as a flush
// in flight does, until release.
func HoldHeldSending(s *Store) (release func()) {
	s.held.lock()
	return s.held.unlock
}

// OnHeldWait calls f with a request's call context as the request is
// about to wait for a flush in flight (heldOutcomes.rlock).
func OnHeldWait(s *Store, f func(context.Context)) { s.held.waitHook = f }

// BucketLocks reads the locks of the shares of tenant's bucket as Redis
// holds them, by replica id.
func BucketLocks(ctx context.Context, c *redis.Client, tenant string) (map[string]float64, error) {
	r, _, err := readBucket(ctx, c, tenant)
	out := map[string]float64{}
	for _, sh := range r.shares {
		out[sh.replica] = sh.lock
	}
	return out, err
}

// OweAlone records tokens of tenant's bucket as granted by this replica
// alone, as a lone call past its bound does (degraded.spend): owed to the
// engine until charged.
func OweAlone(s *Store, tenant string, tokens float64) {
	s.degraded.mu.Lock()
	defer s.degraded.mu.Unlock()
	s.degraded.spent[tenant] += tokens
}

// Replay sends the queued outcome batches, as the replayer does at each
// recovery and every FlushInterval.
func (s *Store) Replay() { s.replay() }
