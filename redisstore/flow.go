package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// The fleet-wide ceilings (fleet.Flow and fleet.AdaptiveLimit) of a
// breaker key live in the key's flow hash and leases set (doc.go), next
// to its breaker under the tenant's hash tag, so one call of
// policyd_admit_flow takes the rate slot and the lease and asks the
// breaker: an Admit under a ceiling is one round trip. Leases and rate
// accounts are counters, as probe permits are: durable as the server's
// AOF makes them, not waited for on replicas (Options.WaitReplicas is for
// admin writes).

// AdmitFlow is Admit for a target with fleet-wide ceilings (lim), in one
// call of policyd_admit_flow: by fleet.Flow's rules it takes a rate slot
// and a lease of the concurrency ceiling under key (the adaptive limit's
// current ceiling when lim.Adaptive.Max is set), then asks the breaker; a
// breaker that refuses gets both back in the same call, so a refused
// attempt holds nothing. A ceiling that is out refuses
// (fleet.ReasonRate with the exact wait, fleet.ReasonFull with
// lim.FullWait or less) without asking the breaker. Times go to the
// library in whole microseconds; the rate's emission interval is rounded
// up, so the fleet never admits more than the rate. While the engine does
// not answer, AdmitFlow decides in degraded mode on this replica's share
// of the ceilings (see degraded). It is safe for concurrent use.
func (s *Store) AdmitFlow(key policy.BreakerKey, cfg policy.BreakerConfig, lim policy.FlowLimits) (policy.Admission, error) {
	if err := s.check(); err != nil {
		return policy.Admission{}, err
	}
	if lim.Ceiling < 0 || lim.Interval < 0 || (lim.Ceiling == 0 && lim.Interval == 0) {
		return policy.Admission{}, invalid("flow", "must set a concurrency or a rate ceiling")
	}
	if err := checkBreakerKey(key); err != nil {
		return policy.Admission{}, err
	}
	cfg = fleet.NormConfig(cfg)
	degraded := func() policy.Admission {
		st, _ := s.cachedState(key)
		return s.degraded.admitFlow(key, cfg, st, lim, s.opts.Clock().UnixNano())
	}
	if !s.health.up() {
		return degraded(), nil
	}
	if _, err := s.follow(key.Tenant); err != nil {
		if errors.Is(err, ErrUnavailable) {
			return degraded(), nil
		}
		return policy.Admission{}, fmt.Errorf("redisstore: follow tenant %q: %w", key.Tenant, err)
	}
	ctx, cancel := s.call()
	defer cancel()
	_, a, st, limit, err := admitFlowCall(ctx, s.lib, key, &cfg, &lim, newPermitID(), newPermitID(), s.opts.MaxBreakersPerTenant)
	if errors.Is(err, ErrUnavailable) {
		return degraded(), nil
	}
	if err != nil {
		return policy.Admission{}, err
	}
	s.learn(key, st)
	s.degraded.sawLimit(key, limit)
	return a, nil
}

// ReleaseLease returns the lease id of the ceiling under key and reports
// whether it was held, in one call of policyd_release_lease that also
// applies sig to the key's adaptive limit when lim.Adaptive.Max is set
// (also for a lease no longer held: the outcome happened either way). A
// lease not held (expired, returned before, never handed out, an id that
// does not parse) is ignored and counted in the pool's PoolStatus.Stray,
// never an error; under a key that has no ceiling state it is only
// ignored. While the engine does not answer, a lease this replica handed
// out in degraded mode is returned to its share; one from the engine is
// not, and frees its slot at its expiry. It is safe for concurrent use.
func (s *Store) ReleaseLease(key policy.BreakerKey, id string, lim policy.FlowLimits, sig policy.FlowSignal) (bool, error) {
	var held [1]bool
	var errs [1]error
	s.ReleaseLeases([]policy.LeaseRelease{{Key: key, ID: id, Limits: lim, Signal: sig}}, held[:], errs[:])
	return held[0], errs[0]
}

// ReleaseLeases is ReleaseLease of each of rs, held[i] and errs[i] its
// answer for rs[i], in one round trip: one call alone (through the
// coalescer, which shares round trips with other requests' calls),
// several in one pipeline (on a Cluster, one per master holding their
// tenants), where a ReportOutcome's leased outcomes made one round trip
// each.
func (s *Store) ReleaseLeases(rs []policy.LeaseRelease, held []bool, errs []error) {
	check := s.check()
	for i := range rs {
		held[i], errs[i] = false, check
		if check == nil {
			errs[i] = checkBreakerKey(rs[i].Key)
		}
	}
	if check != nil {
		return
	}
	// done takes release i's answer (or the engine's silence: degraded).
	done := func(i int, h bool, limit float64, err error) {
		r := &rs[i]
		switch {
		case errors.Is(err, ErrUnavailable):
			held[i] = s.degraded.releaseLease(r.Key, r.ID, r.Limits, r.Signal, s.opts.Clock().UnixNano())
		case err != nil:
			errs[i] = err
		default:
			held[i] = h
			s.degraded.sawLimit(r.Key, limit)
		}
	}
	if !s.health.up() {
		for i := range rs {
			if errs[i] == nil {
				done(i, false, 0, ErrUnavailable)
			}
		}
		return
	}
	ctx, cancel := s.call()
	defer cancel()
	if len(rs) == 1 {
		if r := &rs[0]; errs[0] == nil {
			_, h, limit, err := releaseCall(ctx, s.lib, r.Key, r.ID, &r.Limits.Adaptive, r.Signal)
			done(0, h, limit, err)
		}
		return
	}
	cmds := make([]*redis.Cmd, len(rs))
	_, _ = s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range rs {
			if errs[i] == nil {
				r := &rs[i]
				keys, args := releaseArgs(r.Key, r.ID, &r.Limits.Adaptive, r.Signal)
				cmds[i] = s.lib.on(p).run(ctx, "policyd_release_lease", keys, args...)
			}
		}
		return nil
	}) // each release's error is on its command
	for i, cmd := range cmds {
		if cmd == nil {
			continue
		}
		var h bool
		var limit float64
		v, err := cmd.Slice()
		if err == nil {
			_, h, limit, err = releaseReply(v)
		} else {
			err = libraryErr("policyd_release_lease", err)
		}
		done(i, h, limit, err)
	}
}

// Pool returns the state of the ceilings under key at the engine's time:
// its live leases, stray releases and the adaptive limit's exact value (0
// when it never moved); the zero status when the key has none. It is safe
// for concurrent use.
func (s *Store) Pool(key policy.BreakerKey) (policy.PoolStatus, error) {
	if err := s.check(); err != nil {
		return policy.PoolStatus{}, err
	}
	if err := checkBreakerKey(key); err != nil {
		return policy.PoolStatus{}, err
	}
	ctx, cancel := s.call()
	defer cancel()
	_, ps, err := poolCall(ctx, s.lib, key)
	return ps, err
}

// flowKeys are the keys of policyd_admit_flow: the breaker's three, then
// the flow hash and the leases set, all under the tenant's tag.
func flowKeys(key policy.BreakerKey) []string {
	return []string{keyBreaker(key.Tenant, key.Target), keyEvents(key.Tenant), keyIndex(key.Tenant),
		keyFlow(key.Tenant, key.Target), keyLeases(key.Tenant, key.Target)}
}

// usCeil converts a duration to whole microseconds, rounded up.
func usCeil(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// boundsArgs appends b as the library's 5 adaptive arguments.
func boundsArgs(args []any, b *policy.AdaptiveBounds) []any {
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	return append(args, b.Min, b.Max, f(b.Decrease), f(b.Increase), us(b.Hold))
}

// limitsArgs appends lim as the library's 10 flow arguments: the rate's
// interval rounded up to the microsecond.
func limitsArgs(args []any, lim *policy.FlowLimits) []any {
	args = append(args, lim.Ceiling, us(lim.LeaseTTL), us(lim.FullWait), usCeil(lim.Interval), lim.Burst)
	return boundsArgs(args, &lim.Adaptive)
}

// admitFlowCall is policyd_admit_flow on the ceilings and the breaker
// under key, handing out permit as a probe permit and lease as the lease;
// it returns the adaptive limit's exact value after the call too.
func admitFlowCall(ctx context.Context, l lib, key policy.BreakerKey, cfg *policy.BreakerConfig, lim *policy.FlowLimits,
	permit, lease fleet.PermitID, maxBreakers int) (now int64, a policy.Admission, st state, limit float64, err error) {
	args := cfgArgs([]any{key.Target}, cfg)
	args = append(args, permit.String(), maxBreakers, lease.String())
	args = limitsArgs(args, lim)
	r, err := l.fcall(ctx, "policyd_admit_flow", flowKeys(key), args...)
	if err != nil {
		return 0, a, st, 0, err
	}
	if len(r) != 20 {
		return 0, a, st, 0, errReply
	}
	if now, err = toInt(r[0]); err != nil {
		return 0, a, st, 0, err
	}
	ok, _ := toInt(r[1])
	after, _ := toInt(r[4])
	if st, err = parseState(r[6:17]); err != nil {
		return 0, a, st, 0, err
	}
	expiry, _ := toInt(r[18])
	if limit, err = toFloat(r[19]); err != nil {
		return 0, a, st, 0, err
	}
	a = policy.Admission{Admitted: ok == 1, PermitID: toString(r[3]), RetryAfter: time.Duration(after) * time.Microsecond,
		Reason: toString(r[2]), LeaseID: toString(r[17]), LeaseExpiry: fromUS(expiry)}
	if a.Reason != fleet.ReasonRate && a.Reason != fleet.ReasonFull {
		a.State = st.State // the breaker was asked
	}
	return now, a, st, limit, nil
}

// releaseCall is policyd_release_lease of lease id under key with the
// outcome's signal sig on the adaptive bounds b. An id that does not
// parse goes as "", which the library counts as not held.
func releaseCall(ctx context.Context, l lib, key policy.BreakerKey, id string, b *policy.AdaptiveBounds, sig policy.FlowSignal) (now int64, held bool, limit float64, err error) {
	keys, args := releaseArgs(key, id, b, sig)
	r, err := l.fcall(ctx, "policyd_release_lease", keys, args...)
	if err != nil {
		return 0, false, 0, err
	}
	return releaseReply(r)
}

// releaseArgs are the keys and arguments of policyd_release_lease.
func releaseArgs(key policy.BreakerKey, id string, b *policy.AdaptiveBounds, sig policy.FlowSignal) ([]string, []any) {
	canon := ""
	if lid, ok := fleet.ParsePermitID(id); ok {
		canon = lid.String()
	}
	args := boundsArgs([]any{canon}, b)
	return []string{keyFlow(key.Tenant, key.Target), keyLeases(key.Tenant, key.Target)}, append(args, int(sig))
}

// releaseReply reads policyd_release_lease's reply.
func releaseReply(r []any) (now int64, held bool, limit float64, err error) {
	if len(r) != 5 {
		return 0, false, 0, errReply
	}
	if now, err = toInt(r[0]); err != nil {
		return 0, false, 0, err
	}
	h, _ := toInt(r[1])
	if limit, err = toFloat(r[4]); err != nil {
		return 0, false, 0, err
	}
	return now, h == 1, limit, nil
}

// poolCall is policyd_pool: the ceilings under key at the call's time.
func poolCall(ctx context.Context, l lib, key policy.BreakerKey) (int64, policy.PoolStatus, error) {
	v, err := l.runRO(ctx, "policyd_pool", []string{keyFlow(key.Tenant, key.Target), keyLeases(key.Tenant, key.Target)}).Result()
	if err != nil {
		return 0, policy.PoolStatus{}, libraryErr("policyd_pool", err)
	}
	r, ok := v.([]any)
	if !ok || len(r) != 5 {
		return 0, policy.PoolStatus{}, errReply
	}
	now, err := toInt(r[0])
	if err != nil {
		return 0, policy.PoolStatus{}, err
	}
	live, _ := toInt(r[1])
	stray, _ := toInt(r[2])
	limit, err := toFloat(r[3])
	if err != nil {
		return 0, policy.PoolStatus{}, err
	}
	decreases, _ := toInt(r[4]) // the adaptive ceiling's cuts, for the metrics
	return now, policy.PoolStatus{InFlight: int(live), Stray: uint64(stray), Adaptive: limit, Decreases: uint64(decreases)}, nil
}

// localFlow is a key's ceilings as this replica alone keeps them in
// degraded mode.
type localFlow struct {
	v        fleet.Flow
	adaptive fleet.AdaptiveLimit
}

// sawLimit remembers the adaptive limit of key the engine reported.
func (d *degraded) sawLimit(key policy.BreakerKey, limit float64) {
	if limit == 0 {
		return
	}
	d.mu.Lock()
	d.limits[key] = limit
	d.mu.Unlock()
}

// flow returns this replica's copy of key's ceilings, made on first use
// from the adaptive limit last seen. d.mu is held.
func (d *degraded) flow(key policy.BreakerKey) *localFlow {
	f := d.flows[key]
	if f == nil {
		f = &localFlow{adaptive: fleet.AdaptiveLimit{Limit: d.limits[key]}}
		d.flows[key] = f
	}
	return f
}

// share returns lim cut to this replica's share among live: the
// concurrency ceiling ceil(ceiling / live) (of the adaptive limit's
// current ceiling, for an adaptive one), the rate divided by live and
// its burst ceil(burst / live).
func (f *localFlow) share(lim policy.FlowLimits, live int) policy.FlowLimits {
	live = max(live, 1)
	out := lim
	if lim.Adaptive.Max > 0 {
		out.Ceiling, out.Adaptive = f.adaptive.Ceiling(lim.Adaptive), policy.AdaptiveBounds{}
	}
	if out.Ceiling > 0 {
		out.Ceiling = (out.Ceiling + live - 1) / live
	}
	if lim.Interval > 0 {
		out.Interval = lim.Interval * time.Duration(live)
		out.Burst = (max(lim.Burst, 1) + live - 1) / live
	}
	return out
}

// admitFlow is AdmitFlow in degraded mode at now (Unix ns): this
// replica's share of the ceilings, then the breaker as admit asks it,
// giving back what was taken when the breaker refuses.
func (d *degraded) admitFlow(key policy.BreakerKey, cfg policy.BreakerConfig, st *state, lim policy.FlowLimits, now int64) policy.Admission {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.flow(key)
	share := f.share(lim, d.live)
	fa, _ := f.v.Admit(now, &share, newPermitID)
	fa.Degraded = true
	if !fa.Admitted {
		return fa
	}
	a := d.admitLocked(key, cfg, st, now)
	if !a.Admitted {
		f.v.Undo(now, &share, &fa)
		return a
	}
	a.LeaseID, a.LeaseExpiry = fa.LeaseID, fa.LeaseExpiry
	return a
}

// releaseLease is ReleaseLease in degraded mode at now (Unix ns): a lease
// of this replica's share is returned to it and sig applied to its copy
// of the adaptive limit; any other is not held here.
func (d *degraded) releaseLease(key policy.BreakerKey, id string, lim policy.FlowLimits, sig policy.FlowSignal, now int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	f := d.flows[key]
	if f == nil {
		return false
	}
	held, _ := f.v.Pool.Release(now, id)
	if lim.Adaptive.Max > 0 {
		switch sig {
		case policy.SignalSuccess:
			f.adaptive.Succeeded(lim.Adaptive)
		case policy.SignalCongestion:
			f.adaptive.Congested(now, lim.Adaptive)
		}
	}
	return held
}
