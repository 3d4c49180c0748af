package redisstore

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// Admit asks whether the breaker under key lets an attempt through. A
// breaker this replica knows to be CLOSED (forced or not) with no
// cool-down in force, DISABLED, or forced OPEN is answered from the cache,
// with no round trip; every other case is one call of policyd_admit,
// which hands out at most cfg.HalfOpenProbes permits per HALF_OPEN
// generation across all replicas. The cache lags the engine by the event
// stream's delivery: a breaker another replica just opened may admit here
// a few milliseconds longer. A refusal is an Admission with Admitted
// false, not an error. It is safe for concurrent use.
func (s *Store) Admit(key policy.BreakerKey, cfg policy.BreakerConfig) (policy.Admission, error) {
	if err := s.check(); err != nil {
		return policy.Admission{}, err
	}
	if st, ok := s.cachedState(key); ok {
		if a, ok := cachedAdmit(st, s.opts.Clock().UnixMicro()); ok {
			return a, nil
		}
	}
	if err := checkBreakerKey(key); err != nil {
		return policy.Admission{}, err
	}
	cfg = fleet.NormConfig(cfg)
	if !s.health.up() {
		return s.degradedAdmit(key, cfg), nil
	}
	if _, err := s.follow(key.Tenant); err != nil {
		if errors.Is(err, ErrUnavailable) {
			return s.degradedAdmit(key, cfg), nil
		}
		return policy.Admission{}, fmt.Errorf("redisstore: follow tenant %q: %w", key.Tenant, err)
	}
	ctx, cancel := s.call()
	defer cancel()
	_, a, st, err := admitCall(ctx, s.lib, key, &cfg, newPermitID(), s.opts.MaxBreakersPerTenant)
	if errors.Is(err, ErrUnavailable) {
		return s.degradedAdmit(key, cfg), nil
	}
	if err != nil {
		return policy.Admission{}, err
	}
	s.learn(key, st)
	return a, nil
}

// degradedAdmit is Admit while the engine does not answer: the local copy
// of the breaker decides (see degraded).
func (s *Store) degradedAdmit(key policy.BreakerKey, cfg policy.BreakerConfig) policy.Admission {
	st, _ := s.cachedState(key)
	return s.degraded.admit(key, cfg, st, s.opts.Clock().UnixNano())
}

// cachedAdmit answers an Admit from a cached state at now (Unix µs, the
// replica's clock), when the answer does not depend on the engine: ok is
// false when it must ask.
func cachedAdmit(st *state, now int64) (policy.Admission, bool) {
	switch {
	case st.State == policy.BreakerDisabled:
		return policy.Admission{Admitted: true, State: policy.BreakerDisabled, Reason: fleet.ReasonDisabled}, true
	case st.Forced && st.State == policy.BreakerOpen:
		return policy.Admission{State: policy.BreakerOpen, Reason: fleet.ReasonForcedOpen}, true
	case st.State == policy.BreakerClosed && (st.Forced || st.Cooldown <= now):
		return policy.Admission{Admitted: true, State: policy.BreakerClosed, Reason: fleet.ReasonClosed}, true
	}
	return policy.Admission{}, false
}

// Record reports one attempt's result to the breaker under key (one call of
// policyd_record) and returns its state afterwards, by fleet.Breaker's
// rules: in HALF_OPEN only a live permit of the generation settles a
// probe; a permit that is not live returns the state and fleet.ErrPermit.
// With Options.BatchOutcomes the results of that breaker this replica
// holds for the flush go in front of r in the same call, so the breaker
// counts them in the order reported; when the call fails they are lost
// with it (the engine may have applied them: never sent twice), counted
// in Dropped.
func (s *Store) Record(key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, permitID string) (policy.BreakerSnapshot, error) {
	if err := s.check(); err != nil {
		return policy.BreakerSnapshot{}, err
	}
	if r < policy.ResultSuccess || r > policy.ResultPushback {
		return policy.BreakerSnapshot{}, invalid("result", "must be success, transient failure, terminal or pushback")
	}
	if err := checkBreakerKey(key); err != nil {
		return policy.BreakerSnapshot{}, err
	}
	cfg = fleet.NormConfig(cfg)
	degraded := func() (policy.BreakerSnapshot, error) {
		st, _ := s.cachedState(key)
		return s.degraded.record(key, cfg, st, r, permitID, s.opts.Clock().UnixNano())
	}
	if !s.health.up() {
		return degraded()
	}
	if _, err := s.follow(key.Tenant); err != nil {
		if errors.Is(err, ErrUnavailable) {
			return degraded()
		}
		return policy.BreakerSnapshot{}, fmt.Errorf("redisstore: follow tenant %q: %w", key.Tenant, err)
	}
	ctx, cancel := s.call() // bounded from here: a wait for a flush in flight counts (heldOutcomes.rlock)
	defer cancel()
	results := []result{{r, enginePermit(permitID, s.opts.Clock)}}
	if s.opts.BatchOutcomes {
		// The breaker's results held for the flush go first, in this call:
		// the breaker counts them before this one, as they were reported.
		if !s.held.rlock(ctx) {
			return degraded() // its time went waiting for the flush; the held results left to it
		}
		defer s.held.runlock()
		results = append(s.takeResults(key), results...)
	}
	_, out, err := recordCall(ctx, s.lib, key.Tenant, []recordGroup{{Key: key, Cfg: &cfg, Results: results}}, s.opts.MaxBreakersPerTenant)
	if err != nil && len(results) > 1 {
		// The held results share this call's fate: the engine may have
		// applied them before its answer was lost, so they are not sent
		// again (never twice); counted as a dropped batch.
		s.log.Warn("redisstore: held outcome results sent with a failed record call: dropped", "tenant", key.Tenant,
			"target", key.Target, "results", len(results)-1, "err", err)
		s.queue.dropped.Add(1)
	}
	if errors.Is(err, ErrUnavailable) {
		return degraded()
	}
	if err != nil {
		return policy.BreakerSnapshot{}, err
	}
	s.learn(key, out[0].State)
	snap := out[0].State.snapshot(key)
	if n := len(out[0].Refused); n > 0 && out[0].Refused[n-1] {
		return snap, fleet.ErrPermit
	}
	return snap, nil
}

// ExtendCooldown moves the fleet-wide pushback cool-down of the breaker
// under key to until (to the microsecond) when that is later, and returns
// the end in force. A cool-down that starts is published on the tenant's
// event stream.
func (s *Store) ExtendCooldown(key policy.BreakerKey, cfg policy.BreakerConfig, until time.Time) (time.Time, error) {
	if err := s.check(); err != nil {
		return time.Time{}, err
	}
	if err := checkBreakerKey(key); err != nil {
		return time.Time{}, err
	}
	if _, err := s.follow(key.Tenant); err != nil {
		return time.Time{}, fmt.Errorf("redisstore: follow tenant %q: %w", key.Tenant, err)
	}
	cfg = fleet.NormConfig(cfg)
	ctx, cancel := s.call()
	defer cancel()
	_, in, st, err := cooldownCall(ctx, s.lib, key, &cfg, until, s.opts.MaxBreakersPerTenant)
	if err != nil {
		return time.Time{}, err
	}
	s.learn(key, st)
	return fromUS(in), nil
}

// Breaker returns the state of the breaker under key at the server's time,
// or ErrNotFound. While the engine does not answer it returns the state
// this replica last knew of it, the one degraded mode decides from, when
// it knows one (else ErrUnavailable): ReportOutcome checks a final
// disposition against it, and refused with UNAVAILABLE the outcomes were
// not queued as degraded mode promises (policybench replicas, stop-redis:
// every ReportOutcome with a dead letter failed while Redis was stopped).
func (s *Store) Breaker(key policy.BreakerKey) (policy.BreakerSnapshot, error) {
	if err := s.check(); err != nil {
		return policy.BreakerSnapshot{}, err
	}
	ctx, cancel := s.call()
	defer cancel()
	st, err := readCall(ctx, s.lib, key)
	if errors.Is(err, ErrUnavailable) {
		if snap, ok := s.lastKnown(key); ok {
			return snap, nil
		}
	}
	if err != nil {
		return policy.BreakerSnapshot{}, err
	}
	return st.snapshot(key), nil
}

// lastKnown is the breaker under key as this replica decides from it
// while the engine does not answer, flagged Degraded: its local copy in
// degraded mode, else its cached state. false when it knows neither.
func (s *Store) lastKnown(key policy.BreakerKey) (policy.BreakerSnapshot, bool) {
	snap, ok := s.degraded.snapshot(key, s.opts.Clock().UnixNano())
	if !ok {
		st, cached := s.cachedState(key)
		if !cached {
			return policy.BreakerSnapshot{}, false
		}
		snap = st.snapshot(key)
	}
	snap.Degraded = true
	return snap, true
}

// Breakers returns up to limit breakers (all when limit <= 0) sorted by
// key, after the key after; tenant "" lists every tenant's, state 0 any
// state. It reads every breaker of the tenants listed (an admin call).
// While the engine does not answer it lists the breakers this replica
// knows instead (knownBreakers), each as lastKnown has it, flagged
// Degraded: an operator sees during the outage what the replica decides
// from.
func (s *Store) Breakers(tenant string, state policy.BreakerState, after policy.BreakerKey, limit int) ([]policy.BreakerSnapshot, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	out, err := s.engineBreakers(tenant, state, after)
	if errors.Is(err, ErrUnavailable) {
		out, err = s.knownBreakers(tenant, state, after), nil
	}
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b policy.BreakerSnapshot) int { return keyCompare(a.Key, b.Key) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// listed reports whether sn is in a listing of tenant's breakers ("": every
// tenant's) in state (0: any) after the key after.
func listed(sn *policy.BreakerSnapshot, tenant string, state policy.BreakerState, after policy.BreakerKey) bool {
	return (tenant == "" || sn.Key.Tenant == tenant) && (state == policy.BreakerStateUnspecified || sn.State == state) &&
		(after == policy.BreakerKey{} || keyCompare(after, sn.Key) < 0)
}

// engineBreakers is Breakers read from the engine, unsorted.
func (s *Store) engineBreakers(tenant string, state policy.BreakerState, after policy.BreakerKey) ([]policy.BreakerSnapshot, error) {
	tenants := []string{tenant}
	if tenant == "" {
		var err error
		if tenants, err = s.tenants(); err != nil {
			return nil, err
		}
	}
	var out []policy.BreakerSnapshot
	for _, t := range tenants {
		snaps, err := s.tenantBreakers(t)
		if err != nil {
			return nil, err
		}
		for i := range snaps {
			if listed(&snaps[i], tenant, state, after) {
				out = append(out, snaps[i])
			}
		}
	}
	return out, nil
}

// knownBreakers is Breakers from what this replica knows (lastKnown),
// unsorted: the breakers in its cache, those it decided on or saw change
// on their tenant's stream, and those it met first in degraded mode (a
// breaker of the fleet it never met, CLOSED all along, is not listed).
func (s *Store) knownBreakers(tenant string, state policy.BreakerState, after policy.BreakerKey) []policy.BreakerSnapshot {
	keys := map[policy.BreakerKey]struct{}{}
	s.mu.RLock()
	for k := range s.cache {
		if tenant == "" || k.Tenant == tenant {
			keys[k] = struct{}{}
		}
	}
	s.mu.RUnlock()
	for _, k := range s.degraded.keys(tenant) {
		keys[k] = struct{}{}
	}
	var out []policy.BreakerSnapshot
	for k := range keys {
		if sn, ok := s.lastKnown(k); ok && listed(&sn, tenant, state, after) {
			out = append(out, sn)
		}
	}
	return out
}

// tenantBreakers reads the state of every breaker of tenant: the index,
// then the breakers in calls of policyd_read_many of at most
// readManyKeys each (a tenant's keys share its slot), each bounded by the
// store's timeout; a breaker deleted between the two is left out.
func (s *Store) tenantBreakers(tenant string) ([]policy.BreakerSnapshot, error) {
	ctx, cancel := s.call()
	targets, err := s.c.SMembers(ctx, keyIndex(tenant)).Result()
	cancel()
	if err != nil {
		return nil, fmt.Errorf("redisstore: breakers of %q: %w", tenant, err)
	}
	out := make([]policy.BreakerSnapshot, 0, len(targets))
	keys := make([]string, 0, min(len(targets), readManyKeys))
	for from := 0; from < len(targets); from += readManyKeys {
		part := targets[from:min(from+readManyKeys, len(targets))]
		keys = keys[:0]
		for _, target := range part {
			keys = append(keys, keyBreaker(tenant, target))
		}
		states, err := s.readMany(keys)
		if err != nil {
			return nil, fmt.Errorf("redisstore: breakers of %q: %w", tenant, err)
		}
		for i, st := range states {
			if st != nil {
				out = append(out, st.snapshot(policy.BreakerKey{Tenant: tenant, Target: part[i]}))
			}
		}
	}
	return out, nil
}

// readManyKeys bounds the breakers one policyd_read_many call reads, so
// that a tenant of many breakers does not hold Redis up for long.
const readManyKeys = 512

// readMany is policyd_read_many of keys (one tenant's): each breaker's
// state, nil for a key not stored.
func (s *Store) readMany(keys []string) ([]*state, error) {
	ctx, cancel := s.call()
	defer cancel()
	r, err := s.lib.runROSlice(ctx, "policyd_read_many", keys)
	if err != nil {
		return nil, err
	}
	if len(r) != 2 {
		return nil, errReply
	}
	snaps, ok := r[1].([]any)
	if !ok || len(snaps) != len(keys) {
		return nil, errReply
	}
	out := make([]*state, len(keys))
	for i, v := range snaps {
		if a, ok := v.([]any); ok && len(a) == 0 {
			continue
		}
		st, err := parseState(v)
		if err != nil {
			return nil, err
		}
		out[i] = &st
	}
	return out, nil
}

// ResetBreaker puts the breaker under key back to CLOSED, unforced, with
// its counters, permits and cool-down cleared; ErrNotFound for a breaker
// never stored. It and ForceBreaker send the outcomes held for the flush
// (Options.BatchOutcomes) first, so the write comes after them.
func (s *Store) ResetBreaker(key policy.BreakerKey) (policy.BreakerSnapshot, error) {
	return s.adminBreaker(key, "reset", 0)
}

// ForceBreaker pins the breaker under key (creating it) to st: OPEN, CLOSED
// or DISABLED, until ResetBreaker.
func (s *Store) ForceBreaker(key policy.BreakerKey, st policy.BreakerState) (policy.BreakerSnapshot, error) {
	if st != policy.BreakerOpen && st != policy.BreakerClosed && st != policy.BreakerDisabled {
		return policy.BreakerSnapshot{}, invalid("state", "must be OPEN, CLOSED or DISABLED")
	}
	return s.adminBreaker(key, "force", st)
}

func (s *Store) adminBreaker(key policy.BreakerKey, op string, st policy.BreakerState) (policy.BreakerSnapshot, error) {
	if err := s.check(); err != nil {
		return policy.BreakerSnapshot{}, err
	}
	if err := checkBreakerKey(key); err != nil {
		return policy.BreakerSnapshot{}, err
	}
	if _, err := s.follow(key.Tenant); err != nil {
		return policy.BreakerSnapshot{}, fmt.Errorf("redisstore: follow tenant %q: %w", key.Tenant, err)
	}
	if s.opts.BatchOutcomes {
		// The outcomes this replica reported before the write go first: a
		// reset is not undone by failures held from before it.
		s.flushHeld()
	}
	ctx, cancel := s.adminCtx()
	defer cancel()
	var got state
	err := s.durably(ctx, keyBreaker(key.Tenant, key.Target), func(c redis.Cmdable) error {
		var err error
		_, got, err = adminCall(ctx, s.lib.on(c), key, op, st, s.opts.MaxBreakersPerTenant)
		return err
	})
	if got.Generation > 0 {
		s.learn(key, got) // applied on the primary, replicated or not
	}
	if err != nil {
		return policy.BreakerSnapshot{}, err
	}
	return got.snapshot(key), nil
}

// DefaultSubscriptionBuffer is the number of changes that may queue behind
// a subscriber when Subscribe is given buffer <= 0.
const DefaultSubscriptionBuffer = 64

// Subscribe streams the current states of tenant's breakers and of the
// target-scoped ones every tenant shares (every known tenant's when tenant
// is empty), sorted by key, then SnapshotDone, then every transition and
// new cool-down made by any replica, in order per breaker. buffer
// (default DefaultSubscriptionBuffer) is the number of changes that may
// queue behind a slow reader; the snapshot never counts against it. The
// channel is closed when the reader falls further behind, when Redis
// cannot be read at subscription, or when cancel is called. A
// subscription to every tenant also follows the tenants that appear after
// it, on any replica, from their first transition.
func (s *Store) Subscribe(tenant string, buffer int) (<-chan policy.BreakerEvent, func()) {
	ch, cancel, err := s.SubscribeFrom(tenant, "", buffer)
	if err != nil {
		s.log.Error("redisstore: subscription failed", "tenant", tenant, "err", err)
		closed := make(chan policy.BreakerEvent)
		close(closed)
		return closed, func() {}
	}
	return ch, cancel
}

// tenants returns the tenants any replica has used.
func (s *Store) tenants() ([]string, error) {
	ctx, cancel := s.call()
	defer cancel()
	t, err := s.c.SMembers(ctx, keyTenants).Result()
	if err != nil {
		return nil, fmt.Errorf("redisstore: read %s: %w", keyTenants, err)
	}
	slices.Sort(t)
	return t, nil
}

func keyCompare(a, b policy.BreakerKey) int {
	if c := cmp.Compare(a.Tenant, b.Tenant); c != 0 {
		return c
	}
	return cmp.Compare(a.Target, b.Target)
}

// checkName validates a tenant, target or id by fleet.CheckName's rule;
// empty reports whether "" is allowed.
func checkName(field, v string, empty bool) error { return fieldErr(fleet.CheckName(field, v, empty)) }

// checkBreakerKey validates a breaker key by fleet.CheckBreakerKey's rule.
func checkBreakerKey(k policy.BreakerKey) error { return fieldErr(fleet.CheckBreakerKey(k)) }

// fieldErr is fe as this package's ErrInvalid, nil for none.
func fieldErr(fe *policy.FieldError) error {
	if fe == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalid, fe)
}

// KnownBreaker returns the breaker under key as this replica's cache has
// it, with no round trip: its state, generation, last change and
// cool-down end as the engine last reported them to this replica or its
// event stream delivered them (a few milliseconds behind another
// replica's transition; a cool-down extended without a transition may
// show its earlier end). false when the cache does not have it.
func (s *Store) KnownBreaker(key policy.BreakerKey) (policy.BreakerSnapshot, bool) {
	if s.check() != nil {
		return policy.BreakerSnapshot{}, false
	}
	st, ok := s.cachedState(key)
	if !ok {
		return policy.BreakerSnapshot{}, false
	}
	return st.snapshot(key), true
}
