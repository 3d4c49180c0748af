package redisstore

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// downAttempts are the attempt records of the NextDelays this replica
// decided while the engine did not answer it (degraded mode), which the
// engine could not be given. They are kept here, so that the same
// NextDelay asked again on this replica (a worker retrying an RPC whose
// answer it lost), during the outage or after it, gets the same answer
// and is granted nothing twice, and a lower attempt, or one after a
// STOP, is refused as ever. Once the engine answers again they are
// written to it (writeDownAttempts, at each recovery and then every
// flush interval until none is left), and every replica replays them.
// An attempt the engine holds already is left as it is: a call that
// timed out but ran there, or another replica deciding the same call
// meanwhile, gave the fleet's first answer, and this replica reads it
// once its own is written (until then its one-call NextDelay replays its
// own without a round trip; CheckAttempt reads both, newest). A replica
// that never saw the record, asked the same call during the outage,
// decides it afresh: it cannot know. For the same reason the
// final-disposition checks (LastAnswer) do not read them.
//
// At most maxDownAttempts are kept; past it the expired ones are
// forgotten, then a new one is not kept (logged and counted): its
// NextDelay asked again is decided afresh, as without this. Its methods
// are safe for concurrent use.
type downAttempts struct {
	mu      sync.Mutex
	m       map[policy.CallKey]fleet.Attempts
	n       atomic.Int64 // len(m), read without the lock on every NextDelay
	dropped atomic.Uint64
}

// maxDownAttempts bounds the attempt records kept while the engine is
// down: a few hundred bytes each (the call's key and its answer), some
// 20 MB at most.
const maxDownAttempts = 1 << 16

// downAttemptsPerTrip is how many records one round trip of
// writeDownAttempts writes.
const downAttemptsPerTrip = 256

// downAttempt is a kept record and its call.
type downAttempt struct {
	k policy.CallKey
	a fleet.Attempts
}

// get returns the record kept of call k, the zero value for none; without
// the lock when none is kept.
func (d *downAttempts) get(k policy.CallKey) fleet.Attempts {
	if d.n.Load() == 0 {
		return fleet.Attempts{}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.m[k]
}

// decided keeps ans as the answer to attempt of call k until expiry (Unix
// ns) at least, never rewinding (fleet.Attempts.Decided); now is the
// replica's clock. It reports false when the record is not kept: the
// bound is reached.
func (d *downAttempts) decided(k policy.CallKey, attempt uint32, ans policy.Answer, expiry, now int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[policy.CallKey]fleet.Attempts{}
	}
	a, ok := d.m[k]
	if !ok && len(d.m) >= maxDownAttempts {
		for ck, r := range d.m {
			if now >= r.Expiry {
				delete(d.m, ck)
			}
		}
		if len(d.m) >= maxDownAttempts {
			d.dropped.Add(1)
			return false
		}
	}
	a.Decided(attempt, ans, expiry)
	d.m[k] = a
	d.n.Store(int64(len(d.m)))
	return true
}

// some returns up to n of the kept records, in no order.
func (d *downAttempts) some(n int) []downAttempt {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]downAttempt, 0, min(n, len(d.m)))
	for k, a := range d.m {
		if len(out) == n {
			break
		}
		out = append(out, downAttempt{k, a})
	}
	return out
}

// written forgets the record of r.k once the engine holds it, unless a
// later attempt was kept since.
func (d *downAttempts) written(r downAttempt) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if a, ok := d.m[r.k]; ok && a.Attempt == r.a.Attempt {
		delete(d.m, r.k)
		d.n.Store(int64(len(d.m)))
	}
}

// len is the number of records kept.
func (d *downAttempts) len() int { return int(d.n.Load()) }

// newest is the record of a call that counts at now (Unix ns): the
// engine's, or the one this replica kept while the engine was down when
// it is of a later attempt, or the engine's is gone or past its expiry.
func newest(engine, kept fleet.Attempts, now int64) fleet.Attempts {
	switch {
	case kept.Attempt == 0 || now >= kept.Expiry:
		return engine
	case engine.Attempt == 0 || now >= engine.Expiry || kept.Attempt > engine.Attempt:
		return kept
	}
	return engine
}

// keepDown keeps the attempt records of a decision the engine could not
// be given (degraded mode), logging the first not kept and every 1,000th
// after it.
func (s *Store) keepDown(k policy.CallKey, attempt uint32, ans policy.Answer, expiry int64) {
	if s.down.decided(k, attempt, ans, expiry, s.opts.Clock().UnixNano()) {
		return
	}
	if n := s.down.dropped.Load(); n%1000 == 1 {
		s.log.Warn("redisstore: attempt record decided in degraded mode not kept: too many kept", "tenant", k.Tenant,
			"call_id", k.CallID, "kept", s.down.len(), "not_kept_so_far", n)
	}
}

// DegradedAttempts returns the attempt records this replica decided while
// the engine did not answer and has not written to it yet.
func (s *Store) DegradedAttempts() int { return s.down.len() }

// DegradedAttemptsNotKept returns the attempt records decided while the
// engine did not answer that this replica could not keep (maxDownAttempts).
func (s *Store) DegradedAttemptsNotKept() uint64 { return s.down.dropped.Load() }

// writeDownAttempts writes the attempt records kept while the engine was
// down (downAttempts) to the engine, downAttemptsPerTrip a round trip,
// until none is left or the engine stops answering; policyd_attempt
// leaves an attempt the engine holds already as it is (its "first"
// argument). A record the engine refuses is dropped, logged.
func (s *Store) writeDownAttempts() {
	for s.health.up() {
		batch := s.down.some(downAttemptsPerTrip)
		if len(batch) == 0 {
			return
		}
		ctx, cancel := s.call()
		cmds, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			l := s.lib.on(p)
			for _, r := range batch {
				l.run(ctx, "policyd_attempt", []string{keyAttempt(r.k.Tenant, r.k.CallID)}, r.a.Attempt,
					packAnswer(&r.a.Answer), r.a.Expiry/1e6+1, 1)
			}
			return nil
		})
		cancel()
		if errors.Is(err, ErrUnavailable) || err != nil && len(cmds) != len(batch) {
			return // written at the next try
		}
		for i, r := range batch {
			if i < len(cmds) && cmds[i].Err() != nil {
				if errors.Is(cmds[i].Err(), ErrUnavailable) {
					return
				}
				s.log.Warn("redisstore: attempt record decided in degraded mode refused by the engine: dropped",
					"tenant", r.k.Tenant, "call_id", r.k.CallID, "err", cmds[i].Err())
			}
			s.down.written(r)
		}
	}
}
