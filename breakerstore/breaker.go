package breakerstore

import (
	"crypto/rand"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// Reasons of policy.Admission, machine-readable; fleet owns them.
const (
	ReasonClosed      = fleet.ReasonClosed
	ReasonOpen        = fleet.ReasonOpen
	ReasonProbe       = fleet.ReasonProbe
	ReasonProbesTaken = fleet.ReasonProbesTaken
	ReasonDisabled    = fleet.ReasonDisabled
	ReasonForcedOpen  = fleet.ReasonForcedOpen
	ReasonPushback    = fleet.ReasonPushback
)

// breaker holds one fleet-wide circuit breaker's state, whose rules live in
// fleet.Breaker; mu guards every field but key and pub. Lock order: a bbolt
// write transaction, then mu, then Store.subs.mu; never a shard lock while
// holding mu.
type breaker struct {
	mu         sync.Mutex
	key        policy.BreakerKey
	v          fleet.Breaker
	deleted    bool // removed from the map; lookups must retry
	dirty      bool
	lastActive int64 // not persisted: reset to the open time on load

	pub atomic.Pointer[policy.BreakerSnapshot] // state as of the last published change

	// stats is the attempt statistics of the same tenant and target, once
	// an outcome of the breaker was counted in them (Store.statsOf), so
	// ApplyOutcomes looks up one entity per outcome, not two.
	stats atomic.Pointer[targetStats]
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
	cfg = fleet.NormConfig(cfg)
	now := s.now()
	b, err := s.lockBreaker(key, true, now)
	if err != nil {
		return policy.Admission{}, err
	}
	e := b.begin(s, now, &cfg)
	res, e2 := b.v.Admit(now, &cfg, s.newPermitID)
	err = s.settle(b, e|e2, nil)
	if err != nil {
		return policy.Admission{}, err
	}
	return res, nil
}

// Record reports the outcome of an attempt to the breaker under key, creating
// it on first use, and returns its state afterwards, by fleet.Breaker's
// rules: in HALF_OPEN only a result with a live permit of the breaker
// counts, one without a permit changes nothing, and one with a permit that
// is not live returns the state and fleet.ErrPermit. Only
// policy.ResultTransientFailure counts as a failure.
// Transitions are committed as in Admit; counters are flushed per the sync
// mode. It is safe for concurrent use and allocation-free in the steady state.
func (s *Store) Record(key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, permitID string) (policy.BreakerSnapshot, error) {
	var snap policy.BreakerSnapshot
	_, err := s.record(key, cfg, r, permitID, nil, s.now(), &snap)
	return snap, err
}

// record is Record at now, the clock's time, putting the breaker's
// snapshot after it in snap when snap is not nil (ApplyOutcomes needs
// none); with SyncAlways a counter change joins p, when set, instead of
// being committed on its own. It returns the breaker, unlocked, unless it
// failed before finding it.
func (s *Store) record(key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, permitID string, p *pending, now int64, snap *policy.BreakerSnapshot) (*breaker, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if r < policy.ResultSuccess || r > policy.ResultPushback {
		return nil, invalid("result", "must be success, transient failure, terminal or pushback")
	}
	cfg = fleet.NormConfig(cfg)
	b, err := s.lockBreaker(key, true, now)
	if err != nil {
		return nil, err
	}
	e := b.begin(s, now, &cfg)
	e2, refused := b.v.Record(now, &cfg, r, permitID)
	b.published(s, now, e2)
	if snap != nil {
		*snap = b.snapshot(now)
	}
	if err := s.settle(b, e|e2, p); err != nil {
		if snap != nil {
			*snap = policy.BreakerSnapshot{}
		}
		return b, err
	}
	if refused != nil {
		return b, refused
	}
	return b, nil
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
	cfg = fleet.NormConfig(cfg)
	now := s.now()
	b, err := s.lockBreaker(key, true, now)
	if err != nil {
		return time.Time{}, err
	}
	e := b.begin(s, now, &cfg)
	u, e2 := b.v.ExtendCooldown(now, fleet.UnixNano(until))
	b.published(s, now, e2)
	in := fleet.UnixTime(u)
	err = s.settle(b, e|e2, p)
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
		if !b.deleted && (state == policy.BreakerStateUnspecified || b.v.State == state) {
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
	return s.adminBreaker(key, false, func(b *breaker, now int64) fleet.Effect {
		return b.v.Reset(now)
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
	return s.adminBreaker(key, true, func(b *breaker, now int64) fleet.Effect {
		return b.v.Force(now, st)
	})
}

// adminBreaker applies fn to the breaker under key and commits the
// breaker in a transaction of its own before it returns its snapshot. If
// the commit fails the change stays in memory, is retried by the flusher,
// and the error is returned.
func (s *Store) adminBreaker(key policy.BreakerKey, create bool, fn func(b *breaker, now int64) fleet.Effect) (policy.BreakerSnapshot, error) {
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	now := s.now()
	b, err := s.lockBreaker(key, create, now)
	if err != nil {
		return policy.BreakerSnapshot{}, err
	}
	b.published(s, now, fn(b, now))
	snap := b.snapshot(now)
	b.mu.Unlock()
	p := &pending{kind: commitAlone, floor: reservePages, op: "write breaker"}
	p.add(b)
	if err := s.commit(p); err != nil {
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
	s.tenants.mu.Lock()
	n := s.tenants.breakers[key.Tenant]
	if n >= s.opts.MaxBreakersPerTenant {
		s.tenants.mu.Unlock()
		return nil, fmt.Errorf("%w: tenant %q has %d breakers (cap %d)", ErrTooManyBreakers, key.Tenant, n, s.opts.MaxBreakersPerTenant)
	}
	if err := s.admitAutoLocked(key.Tenant); err != nil {
		s.tenants.mu.Unlock()
		return nil, err
	}
	key = policy.BreakerKey{Tenant: strings.Clone(key.Tenant), Target: strings.Clone(key.Target)}
	s.tenants.breakers[key.Tenant] = n + 1
	s.tenants.mu.Unlock()
	b := &breaker{key: key, v: fleet.NewBreaker(now), lastActive: now}
	snap := b.snapshot(now)
	b.pub.Store(&snap)
	return b, nil
}

// settle unlocks b, which the caller changed (mutated) or moved to another
// state (transitioned), and makes the change durable as the durability
// contract asks: a transition at once, counters with the next group commit.
// With SyncAlways and p set, a counter change joins p instead of being
// committed now.
func (s *Store) settle(b *breaker, e fleet.Effect, p *pending) error {
	newlyDirty := false
	if e != 0 {
		newlyDirty = b.markDirty()
	}
	b.mu.Unlock()
	switch {
	case e.Has(fleet.Transitioned):
		if newlyDirty {
			s.queue(b) // the counters changed too; the flusher clears the mark
		}
		tr := &pending{kind: commitAlone, floor: counterPages, op: "write breaker transition"}
		tr.add(b)
		if err := s.commit(tr); err != nil {
			// Left to the flusher; only SyncAlways reports it.
			s.log.Error("breakerstore: breaker transition not committed; retrying in the next flush",
				"tenant", b.key.Tenant, "target", b.key.Target, "err", err)
			if s.opts.Sync == SyncAlways {
				return err
			}
		}
	case e.Has(fleet.Mutated):
		return s.changed(p, b, newlyDirty)
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

// begin prepares b, locked, for a call at now under cfg: it notes the
// activity and the mode, and performs (and publishes) the lazy OPEN to
// HALF_OPEN transition.
func (b *breaker) begin(s *Store, now int64, cfg *policy.BreakerConfig) fleet.Effect {
	b.lastActive = now
	b.v.Mode = cfg.Mode
	e := b.v.Advance(now)
	b.published(s, now, e)
	return e
}

// published tells subscribers of b's state when e is a transition or a new
// cool-down; b.mu must be held.
func (b *breaker) published(s *Store, now int64, e fleet.Effect) {
	if e.Has(fleet.Transitioned) || e.Has(fleet.CooldownStarted) {
		b.publish(s, now)
	}
}

// snapshot copies b's state; b.mu must be held.
func (b *breaker) snapshot(now int64) policy.BreakerSnapshot { return b.v.Snapshot(b.key, now) }

// idle reports whether the sweep may drop b; b.mu must be held.
func (b *breaker) idle(now int64, ttl time.Duration) bool {
	return b.v.Idle(now, b.lastActive, ttl)
}

// newPermitID draws a probe permit id: 128 bits from crypto/rand, which
// does not fail on the systems policyd runs on.
func (s *Store) newPermitID() fleet.PermitID {
	var id fleet.PermitID
	_, _ = rand.Read(id[:])
	return id
}
