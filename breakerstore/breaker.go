package breakerstore

import (
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/policy"
)

// Reasons of policy.Admission, machine-readable.
const (
	ReasonClosed      = "breaker:closed"       // admitted: CLOSED (or forced CLOSED)
	ReasonOpen        = "breaker:open"         // refused until the cooldown ends
	ReasonProbe       = "breaker:probe"        // admitted as a HALF_OPEN probe; report with the permit id
	ReasonProbesTaken = "breaker:probes_taken" // refused: every probe permit is out
	ReasonDisabled    = "breaker:disabled"     // admitted: the breaker is DISABLED
	ReasonForcedOpen  = "breaker:forced_open"  // refused: forced OPEN until reset
	ReasonPushback    = "cooldown:pushback"    // refused: a fleet-wide Retry-After cool-down is in force
)

// windowSlots is the number of time buckets of the FAILURE_RATE window.
const windowSlots = 10

// defaultBreaker supplies values for zero BreakerConfig fields.
var defaultBreaker = policy.Default().Breaker

type slot struct {
	epoch           int64 // now / slot width
	calls, failures uint32
}

type permit struct {
	id     uint64
	expiry int64 // Unix ns
}

// breaker is one fleet-wide circuit breaker; mu guards every field but key
// and pub. Lock order: a bbolt write transaction, then mu, then Store.subMu;
// never a shard lock while holding mu.
type breaker struct {
	mu            sync.Mutex
	key           policy.BreakerKey
	state         policy.BreakerState
	forced        bool
	deleted       bool // removed from the map; lookups must retry
	dirty         bool
	mode          policy.BreakerMode
	openUntil     int64
	changed       int64
	cooldownUntil int64
	lastActive    int64 // not persisted: reset to the open time on load
	lastFailure   int64 // not persisted: a chain of failures survives a restart whole
	consecutive   int
	halfOpenOK    int
	slotWidth     int64
	slots         [windowSlots]slot
	permits       []permit

	pub atomic.Pointer[policy.BreakerSnapshot] // state as of the last published change
}

// normBreaker fills zero or invalid fields of cfg with the defaults.
func normBreaker(c policy.BreakerConfig) policy.BreakerConfig {
	d := &defaultBreaker
	if c.Mode != policy.BreakerConsecutive && c.Mode != policy.BreakerFailureRate {
		c.Mode = d.Mode
	}
	if c.ConsecutiveFailures <= 0 {
		c.ConsecutiveFailures = d.ConsecutiveFailures
	}
	if !(c.FailureRate > 0 && c.FailureRate <= 1) {
		c.FailureRate = d.FailureRate
	}
	if c.Window <= 0 {
		c.Window = d.Window
	}
	if c.MinCalls <= 0 {
		c.MinCalls = d.MinCalls
	}
	if c.Cooldown <= 0 {
		c.Cooldown = d.Cooldown
	}
	if c.HalfOpenProbes <= 0 {
		c.HalfOpenProbes = d.HalfOpenProbes
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = d.ProbeTimeout
	}
	return c
}

// Admit asks whether the breaker under key lets an attempt through, creating
// a CLOSED breaker on first use (ErrTooManyBreakers past the tenant's cap).
// Zero fields of cfg take policy.Default's values. In HALF_OPEN it hands out
// at most cfg.HalfOpenProbes permits fleet-wide, each expiring after
// cfg.ProbeTimeout. A refusal is a result with Admitted false, not an error.
// A state transition (OPEN to HALF_OPEN) is committed before Admit returns;
// if that commit fails the decision is still served from memory and the
// write retried by the flusher, except with SyncAlways, where the error is
// returned. Admit is safe for concurrent use and allocation-free unless it
// hands out a permit or changes state.
func (s *Store) Admit(key policy.BreakerKey, cfg policy.BreakerConfig) (policy.Admission, error) {
	if s.closed.Load() {
		return policy.Admission{}, ErrClosed
	}
	cfg = normBreaker(cfg)
	now := s.now()
	b, err := s.lockBreaker(key, true, now)
	if err != nil {
		return policy.Admission{}, err
	}
	b.lastActive = now
	b.mode = cfg.Mode
	transitioned := b.advance(s, now)
	res, mutated := b.admit(s, now, &cfg)
	err = s.settle(b, transitioned, mutated, nil)
	if err != nil {
		return policy.Admission{}, err
	}
	return res, nil
}

// Record reports the outcome of an attempt to the breaker under key, creating
// it on first use, and returns its state afterwards. permitID, when set,
// releases that HALF_OPEN permit (an unknown or expired id is ignored; the
// result still counts). Only policy.ResultTransientFailure counts as a failure.
// Transitions are committed as in Admit; counters are flushed per the sync
// mode. It is safe for concurrent use and allocation-free in the steady state.
func (s *Store) Record(key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, permitID string) (policy.BreakerSnapshot, error) {
	return s.record(key, cfg, r, permitID, nil, s.now())
}

// record is Record at now, the clock's time; with SyncAlways a counter
// change joins p, when set, instead of being committed on its own.
func (s *Store) record(key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, permitID string, p *pending, now int64) (policy.BreakerSnapshot, error) {
	if s.closed.Load() {
		return policy.BreakerSnapshot{}, ErrClosed
	}
	if r < policy.ResultSuccess || r > policy.ResultTerminal {
		return policy.BreakerSnapshot{}, invalid("result", "must be success, transient failure or terminal")
	}
	cfg = normBreaker(cfg)
	b, err := s.lockBreaker(key, true, now)
	if err != nil {
		return policy.BreakerSnapshot{}, err
	}
	b.lastActive = now
	b.mode = cfg.Mode
	transitioned := b.advance(s, now)
	t2, mutated := b.record(s, now, &cfg, r, permitID)
	transitioned = transitioned || t2
	newlyDirty := false
	if mutated || transitioned {
		newlyDirty = b.markDirty()
	}
	snap := b.snapshot(now)
	b.mu.Unlock()
	if transitioned {
		err = s.persistTransition(b, newlyDirty)
	} else if mutated {
		err = s.touchedIn(p, b, newlyDirty)
	}
	if err != nil {
		return policy.BreakerSnapshot{}, err
	}
	return snap, nil
}

// ExtendCooldown sets a fleet-wide pushback cool-down on the breaker under
// key (creating it): until then Admit refuses with "cooldown:pushback". It
// keeps the later of the current and the new end and returns the one in
// force. Subscribers are told when a cool-down starts (not on every
// extension). The cool-down is a counter: it is flushed per the sync mode.
// It is safe for concurrent use.
func (s *Store) ExtendCooldown(key policy.BreakerKey, cfg policy.BreakerConfig, until time.Time) (time.Time, error) {
	return s.extendCooldown(key, cfg, until, nil)
}

// extendCooldown is ExtendCooldown; with SyncAlways the change joins p,
// when set, instead of being committed on its own.
func (s *Store) extendCooldown(key policy.BreakerKey, cfg policy.BreakerConfig, until time.Time, p *pending) (time.Time, error) {
	if s.closed.Load() {
		return time.Time{}, ErrClosed
	}
	cfg = normBreaker(cfg)
	now := s.now()
	b, err := s.lockBreaker(key, true, now)
	if err != nil {
		return time.Time{}, err
	}
	b.lastActive = now
	b.mode = cfg.Mode
	transitioned := b.advance(s, now)
	u := fromTime(until)
	mutated := false
	if u > b.cooldownUntil {
		started := b.cooldownUntil <= now && u > now
		b.cooldownUntil = u
		mutated = true
		if started {
			b.publish(s, now)
		}
	}
	in := toTime(b.cooldownUntil)
	err = s.settle(b, transitioned, mutated, p)
	if err != nil {
		return time.Time{}, err
	}
	return in, nil
}

// Breaker returns the state of the breaker under key, or ErrNotFound. It
// reports the stored state: an OPEN breaker past its OpenUntil becomes
// HALF_OPEN at the next Admit or Record. It is safe for concurrent use.
func (s *Store) Breaker(key policy.BreakerKey) (policy.BreakerSnapshot, error) {
	if s.closed.Load() {
		return policy.BreakerSnapshot{}, ErrClosed
	}
	now := s.now()
	b, err := s.lockBreaker(key, false, now)
	if err != nil {
		return policy.BreakerSnapshot{}, err
	}
	snap := b.snapshot(now)
	b.mu.Unlock()
	return snap, nil
}

// Breakers returns up to limit breakers (all when limit <= 0) sorted by key,
// starting after the key after (the zero policy.BreakerKey starts at the beginning). tenant
// "" lists every tenant's; state 0 (policy.BreakerStateUnspecified) matches any state. It
// is safe for concurrent use.
func (s *Store) Breakers(tenant string, state policy.BreakerState, after policy.BreakerKey, limit int) ([]policy.BreakerSnapshot, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	now := s.now()
	var out []policy.BreakerSnapshot
	for _, b := range s.breakers.values() {
		if tenant != "" && b.key.Tenant != tenant {
			continue
		}
		if after != (policy.BreakerKey{}) && !keyLess(after, b.key) {
			continue
		}
		b.mu.Lock()
		if !b.deleted && (state == policy.BreakerStateUnspecified || b.state == state) {
			out = append(out, b.snapshot(now))
		}
		b.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b policy.BreakerSnapshot) int { return keyCompare(a.Key, b.Key) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// ResetBreaker puts the breaker under key back to CLOSED, unforced, with its
// counters, permits and cool-down cleared, and commits that before returning.
// It returns ErrNotFound for an unknown breaker and is safe for concurrent use.
func (s *Store) ResetBreaker(key policy.BreakerKey) (policy.BreakerSnapshot, error) {
	if s.closed.Load() {
		return policy.BreakerSnapshot{}, ErrClosed
	}
	if _, ok := s.breakers.get(key); !ok {
		return policy.BreakerSnapshot{}, fmt.Errorf("%w: breaker %q/%q", ErrNotFound, key.Tenant, key.Target)
	}
	return s.adminBreaker(key, false, func(b *breaker, now int64) {
		b.forced = false
		b.cooldownUntil = 0
		b.toState(s, now, policy.BreakerClosed)
	})
}

// ForceBreaker pins the breaker under key (creating it if absent, subject to
// the tenant's cap) to st — policy.BreakerOpen, policy.BreakerClosed or policy.BreakerDisabled, else
// ErrInvalid — until ResetBreaker. Forced OPEN refuses every call, forced
// CLOSED admits every call and never trips (but counts), DISABLED admits and
// counts nothing. The change is committed before ForceBreaker returns. It is
// safe for concurrent use.
func (s *Store) ForceBreaker(key policy.BreakerKey, st policy.BreakerState) (policy.BreakerSnapshot, error) {
	if s.closed.Load() {
		return policy.BreakerSnapshot{}, ErrClosed
	}
	if st != policy.BreakerOpen && st != policy.BreakerClosed && st != policy.BreakerDisabled {
		return policy.BreakerSnapshot{}, invalid("state", "must be OPEN, CLOSED or DISABLED")
	}
	return s.adminBreaker(key, true, func(b *breaker, now int64) {
		b.forced = true
		b.cooldownUntil = 0
		b.openUntil = 0 // forced OPEN lasts until reset
		cons, slots := b.consecutive, b.slots
		b.toState(s, now, st)
		if st == policy.BreakerClosed {
			b.consecutive, b.slots = cons, slots // forcing CLOSED keeps the counts
		}
	})
}

// adminBreaker applies fn to the breaker under key inside a durable write
// transaction and returns its snapshot. If the commit fails the change stays
// in memory, is retried by the flusher, and the error is returned.
func (s *Store) adminBreaker(key policy.BreakerKey, create bool, fn func(b *breaker, now int64)) (policy.BreakerSnapshot, error) {
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	var snap policy.BreakerSnapshot
	var applied *breaker
	err := s.update("write breaker", func(tx *bbolt.Tx) error {
		now := s.now()
		b, err := s.lockBreaker(key, create, now)
		if err != nil {
			return err
		}
		defer b.mu.Unlock()
		fn(b, now)
		b.dirty = false
		applied = b
		snap = b.snapshot(now)
		return b.put(tx)
	})
	if err != nil {
		if applied != nil && applied.redirty() {
			s.queue(applied)
		}
		return policy.BreakerSnapshot{}, err
	}
	return snap, nil
}

// lockBreaker returns the breaker under key, locked, creating it when create
// is set. Lookups that find a breaker just removed by the idle sweep retry.
func (s *Store) lockBreaker(key policy.BreakerKey, create bool, now int64) (*breaker, error) {
	for {
		b, ok := s.breakers.get(key)
		if !ok {
			if !create {
				return nil, fmt.Errorf("%w: breaker %q/%q", ErrNotFound, key.Tenant, key.Target)
			}
			var err error
			b, err = s.breakers.getOrCreate(key, func() (*breaker, error) { return s.newBreaker(key, now) })
			if err != nil {
				return nil, err
			}
		}
		b.mu.Lock()
		if !b.deleted {
			return b, nil
		}
		b.mu.Unlock()
	}
}

// newBreaker makes a CLOSED breaker for key, enforcing the per-tenant cap.
// It runs under the shard's write lock.
func (s *Store) newBreaker(key policy.BreakerKey, now int64) (*breaker, error) {
	if err := checkBreakerKey(key); err != nil {
		return nil, err
	}
	s.countMu.Lock()
	n := s.perTenant[key.Tenant]
	if n >= s.opts.MaxBreakersPerTenant {
		s.countMu.Unlock()
		return nil, fmt.Errorf("%w: tenant %q has %d breakers (cap %d)", ErrTooManyBreakers, key.Tenant, n, s.opts.MaxBreakersPerTenant)
	}
	if err := s.admitAutoLocked(key.Tenant); err != nil {
		s.countMu.Unlock()
		return nil, err
	}
	key = policy.BreakerKey{Tenant: cloneString(key.Tenant), Target: cloneString(key.Target)}
	s.perTenant[key.Tenant] = n + 1
	s.countMu.Unlock()
	b := &breaker{key: key, state: policy.BreakerClosed, changed: now, lastActive: now}
	snap := b.snapshot(now)
	b.pub.Store(&snap)
	return b, nil
}

// cloneString copies s so a map key does not pin a caller's larger buffer.
func cloneString(s string) string {
	if s == "" {
		return ""
	}
	return string(append([]byte(nil), s...))
}

// persistTransition commits b's state after a transition. A failure is

// settle unlocks b, which the caller changed (mutated) or moved to another
// state (transitioned), and makes the change durable as the durability
// contract asks: a transition at once, counters with the next group commit.
// With SyncAlways and p set, a counter change joins p instead of being
// committed now.
func (s *Store) settle(b *breaker, transitioned, mutated bool, p *pending) error {
	newlyDirty := false
	if mutated || transitioned {
		newlyDirty = b.markDirty()
	}
	b.mu.Unlock()
	switch {
	case transitioned:
		return s.persistTransition(b, newlyDirty)
	case mutated:
		return s.touchedIn(p, b, newlyDirty)
	}
	return nil
}

// logged and left to the flusher; only SyncAlways reports it.
func (s *Store) persistTransition(b *breaker, newlyDirty bool) error {
	err := s.updateTx("write breaker transition", counterPages, func(tx *bbolt.Tx) error {
		_, err := b.write(tx, false)
		return err
	})
	if newlyDirty {
		s.queue(b) // the counters changed too; the flusher clears the mark
	}
	if err != nil {
		s.log.Error("breakerstore: breaker transition not committed; retrying in the next flush",
			"tenant", b.key.Tenant, "target", b.key.Target, "err", err)
		if !newlyDirty && b.redirty() {
			s.queue(b)
		}
		if s.opts.Sync == SyncAlways {
			return err
		}
	}
	return nil
}

// markDirty marks b dirty and reports whether it was clean (the caller must
// queue it). b.mu must be held.
func (b *breaker) markDirty() bool {
	if b.dirty {
		return false
	}
	b.dirty = true
	return true
}

// redirty implements entity.
func (b *breaker) redirty() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dirty || b.deleted {
		return false
	}
	b.dirty = true
	return true
}

// write implements entity.
func (b *breaker) write(tx *bbolt.Tx, clear bool) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.deleted {
		return 0, nil
	}
	if clear {
		b.dirty = false
	}
	return 1, b.put(tx)
}

// put writes b's record; b.mu must be held.
func (b *breaker) put(tx *bbolt.Tx) error {
	return tx.Bucket(bucketBreakers).Put(joinKey(b.key.Tenant, b.key.Target), b.encode())
}

// advance performs the lazy OPEN to HALF_OPEN transition; b.mu must be held.
func (b *breaker) advance(s *Store, now int64) bool {
	if b.state == policy.BreakerOpen && !b.forced && now >= b.openUntil {
		b.toState(s, now, policy.BreakerHalfOpen)
		return true
	}
	return false
}

// admit decides one Admit; b.mu must be held. mutated reports a change to
// persisted fields (permits).
func (b *breaker) admit(s *Store, now int64, cfg *policy.BreakerConfig) (res policy.Admission, mutated bool) {
	switch {
	case b.state == policy.BreakerDisabled:
		return policy.Admission{Admitted: true, State: policy.BreakerDisabled, Reason: ReasonDisabled}, false
	case b.forced && b.state == policy.BreakerOpen:
		return policy.Admission{State: policy.BreakerOpen, Reason: ReasonForcedOpen}, false
	case b.forced:
		return policy.Admission{Admitted: true, State: b.state, Reason: ReasonClosed}, false
	case b.cooldownUntil > now:
		return policy.Admission{State: b.state, Reason: ReasonPushback, RetryAfter: time.Duration(b.cooldownUntil - now)}, false
	}
	switch b.state {
	case policy.BreakerOpen:
		return policy.Admission{State: policy.BreakerOpen, Reason: ReasonOpen, RetryAfter: time.Duration(b.openUntil - now)}, false
	case policy.BreakerHalfOpen:
		mutated = b.expirePermits(now)
		if len(b.permits) < cfg.HalfOpenProbes {
			id := s.permitSeq.Add(1)
			b.permits = append(b.permits, permit{id: id, expiry: now + int64(cfg.ProbeTimeout)})
			return policy.Admission{Admitted: true, State: policy.BreakerHalfOpen, Reason: ReasonProbe,
				PermitID: strconv.FormatUint(id, 16)}, true
		}
		earliest := b.permits[0].expiry
		for _, p := range b.permits[1:] {
			earliest = min(earliest, p.expiry)
		}
		return policy.Admission{State: policy.BreakerHalfOpen, Reason: ReasonProbesTaken, RetryAfter: time.Duration(earliest - now)}, mutated
	}
	return policy.Admission{Admitted: true, State: policy.BreakerClosed, Reason: ReasonClosed}, false
}

// record applies one outcome; b.mu must be held.
func (b *breaker) record(s *Store, now int64, cfg *policy.BreakerConfig, r policy.Result, permitID string) (transitioned, mutated bool) {
	if permitID != "" && len(b.permits) > 0 {
		if id, err := strconv.ParseUint(permitID, 16, 64); err == nil {
			for i, p := range b.permits {
				if p.id == id {
					b.permits = slices.Delete(b.permits, i, i+1)
					mutated = true
					break
				}
			}
		}
	}
	failure := r == policy.ResultTransientFailure
	switch {
	case b.state == policy.BreakerDisabled, b.state == policy.BreakerOpen:
		return false, mutated // forced or not, an OPEN breaker ignores late results
	case b.forced: // forced CLOSED: counts, never trips
		b.count(now, cfg, failure)
		return false, true
	case b.state == policy.BreakerHalfOpen:
		if failure {
			b.trip(s, now, cfg)
			return true, true
		}
		b.halfOpenOK++
		if b.halfOpenOK >= cfg.HalfOpenProbes {
			b.toState(s, now, policy.BreakerClosed)
			return true, true
		}
		return false, true
	}
	b.count(now, cfg, failure)
	if failure && b.shouldTrip(now, cfg) {
		b.trip(s, now, cfg)
		return true, true
	}
	return false, true
}

// count adds one call to the consecutive count and the sliding window.
// Failures further apart than the window are not "in a row": a quiet
// upstream that fails once an hour never trips the breaker.
func (b *breaker) count(now int64, cfg *policy.BreakerConfig, failure bool) {
	if failure {
		if b.lastFailure != 0 && now-b.lastFailure > int64(cfg.Window) {
			b.consecutive = 0
		}
		b.consecutive++
		b.lastFailure = now
	} else {
		b.consecutive = 0
	}
	width := max(int64(cfg.Window)/windowSlots, 1)
	if width != b.slotWidth {
		b.slotWidth = width
		b.slots = [windowSlots]slot{}
	}
	epoch := now / width
	sl := &b.slots[epoch%windowSlots]
	if sl.epoch != epoch {
		*sl = slot{epoch: epoch}
	}
	sl.calls++
	if failure {
		sl.failures++
	}
}

// window sums the slots inside the sliding window ending at now.
func (b *breaker) window(now int64) (calls, failures uint64) {
	if b.slotWidth == 0 {
		return 0, 0
	}
	cur := now / b.slotWidth
	for _, sl := range b.slots {
		if sl.epoch > cur-windowSlots && sl.epoch <= cur {
			calls += uint64(sl.calls)
			failures += uint64(sl.failures)
		}
	}
	return calls, failures
}

// shouldTrip applies the mode's rule after a failure.
func (b *breaker) shouldTrip(now int64, cfg *policy.BreakerConfig) bool {
	if cfg.Mode == policy.BreakerFailureRate {
		calls, failures := b.window(now)
		return calls >= uint64(cfg.MinCalls) && float64(failures) >= cfg.FailureRate*float64(calls)
	}
	return b.consecutive >= cfg.ConsecutiveFailures
}

// trip opens the breaker for cfg.Cooldown.
func (b *breaker) trip(s *Store, now int64, cfg *policy.BreakerConfig) {
	b.openUntil = now + int64(cfg.Cooldown)
	b.toState(s, now, policy.BreakerOpen)
}

// toState changes state, clears what the new state starts afresh, and
// publishes the change; b.mu must be held.
func (b *breaker) toState(s *Store, now int64, st policy.BreakerState) {
	b.state = st
	b.changed = now
	b.permits = b.permits[:0]
	b.halfOpenOK = 0
	b.consecutive = 0
	b.slots = [windowSlots]slot{}
	if st != policy.BreakerOpen {
		b.openUntil = 0
	}
	b.publish(s, now)
}

// expirePermits frees the slots of permits past their expiry.
func (b *breaker) expirePermits(now int64) bool {
	n := len(b.permits)
	b.permits = slices.DeleteFunc(b.permits, func(p permit) bool { return p.expiry <= now })
	return len(b.permits) != n
}

// snapshot copies b's state; b.mu must be held.
func (b *breaker) snapshot(now int64) policy.BreakerSnapshot {
	calls, failures := b.window(now)
	inflight := 0
	for _, p := range b.permits {
		if p.expiry > now {
			inflight++
		}
	}
	return policy.BreakerSnapshot{
		Key:                 b.key,
		State:               b.state,
		Forced:              b.forced,
		OpenUntil:           toTime(b.openUntil),
		ConsecutiveFailures: b.consecutive,
		WindowCalls:         calls,
		WindowFailures:      failures,
		ProbesInFlight:      inflight,
		Changed:             toTime(b.changed),
		CooldownUntil:       toTime(b.cooldownUntil),
		Mode:                b.mode,
	}
}

// idle reports whether the sweep may drop b; b.mu must be held.
func (b *breaker) idle(now int64, ttl time.Duration) bool {
	return b.state == policy.BreakerClosed && !b.forced && len(b.permits) == 0 &&
		b.cooldownUntil <= now && now-b.lastActive >= int64(ttl)
}
