package redisstore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// Degraded mode. While the engine is down (health), a replica decides
// from what it last knew, and says so on every answer (Degraded):
//
//   - breakers: the cached state, copied once into a fleet.Breaker that
//     this replica alone then drives: an OPEN breaker half-opens when its
//     cool-down ends, failures may open a CLOSED one, and HALF_OPEN hands
//     out at most ceil(N / live replicas) probes of its own;
//   - budgets and pools: the share of the tokens and of the pool's
//     retries the engine set aside for this replica at its last spend
//     (policyd.lua's Shares), spent locally, then BUDGET_EXHAUSTED; a
//     tenant or run this replica never spent from has no share, so its
//     retries are refused. A share is SHARE (a half) of the level left
//     at that spend over the live replicas, and no more than the other
//     replicas' locks leave: the engine never lets one replica spend
//     what another may grant alone (its lock, which covers every share
//     it told that replica of until the replica acknowledges a newer
//     one). The bound: replica i grants alone at most h_i, the hold of
//     the newest reply it has seen, with h_i <= L_i / (2 n_i) (L_i what
//     was left after that spend, n_i the live replicas it counted) and
//     h_i <= l_i, its lock; the engine keeps sum_i l_i <= L, the level
//     (tokens, or the pool's retries left), and grants only from L minus
//     the other replicas' locks. So the fleet's grants from a bucket or
//     a pool, the engine's and every replica's alone together, never
//     pass its level (tokens never below zero, a pool never overspent),
//     whatever the replicas spent after one another's reads. A share of a
//     level read, as
//     before, counted again what others spent after the read
//     (policybench replicas, stop-redis: 401-404 grants of 400;
//     TestDegradedSharesOfStaleLevels: 12 of 9). The price: a replica is
//     refused while what is left is locked by others (at most a half of
//     the level, split among them, of what each saw at its last spend);
//     a replica that stops gives its shares back (Close, once the engine
//     was charged all it granted alone), and the shares of one out of
//     the live set and silent for ten heartbeats (killed, cut off) are
//     forfeited: taken from the level, as it may have spent them;
//   - ceilings (AdmitFlow): a fleet.Flow of this replica's own per key,
//     holding ceil(ceiling / live replicas) leases (of the adaptive
//     limit's ceiling last seen, for an adaptive one) and a rate of
//     rate / live replicas with a burst of ceil(burst / live replicas),
//     then the breaker as above; the leases the engine handed out before
//     are not known here, so the fleet may briefly hold up to the ceiling
//     from before plus the shares; a lease handed out in degraded mode
//     and returned after the engine is back is a stray release there;
//   - outcomes: queued (Options.MaxQueuedBatches), replayed when the
//     engine is back, each batch at most once (its id is in the tenant's
//     applied set);
//   - attempt records: the answers decided here kept by this replica
//     (downAttempts), so the same NextDelay asked again gets the same
//     answer, and written to the engine when it is back.
//
// When the engine comes back the local copies are dropped: the engine's
// state is again the one every answer comes from. What the replica
// granted from its shares (and from a lone call that timed out while the
// engine was up) is not dropped: at each transition it becomes a debt,
// charged to the engine as soon as it answers (policyd_charge, at most
// once per debt id): the tokens from the tenant's bucket, down to zero,
// the retries from the run's pool, up to the pool, and both from the
// replica's locks. Without it, each outage, however short, handed out
// another share of the same last known level, and a flapping engine let
// the replicas overspend a budget many times over (policybench replicas,
// stop-redis: 582 grants of 400).
type degraded struct {
	mu       sync.Mutex
	breakers map[policy.BreakerKey]*fleet.Breaker
	origin   map[policy.BreakerKey]uint64 // each copy's generation when made
	// tell is Store.tell: a copy's change of state, for the replica's
	// subscribers (localevents.go); nil tells no one.
	tell     func(policy.BreakerSnapshot)
	spent    map[string]float64 // tenant -> tokens spent while down
	runSpent map[string]uint64  // run id -> retries spent while down
	// Last known, kept while up.
	tokens  map[string]share                 // tenant -> this replica's share of its bucket
	runs    map[string]share                 // run id -> this replica's share of its pool
	runInfo map[string]policy.Run            // run id -> the run as last read
	flows   map[policy.BreakerKey]*localFlow // key -> this replica's share of its ceilings while down
	limits  map[policy.BreakerKey]float64    // key -> its adaptive limit as the engine last reported it
	live    int                              // live replicas, this one included
	liveIDs string                           // their ids, space-separated
	// runTenant names the tenant of every run spent from while down;
	// debts are the grants of earlier outages not charged yet.
	runTenant map[string]string
	debts     []debt
}

// share is what the engine last told this replica it may grant alone
// from a bucket (tokens) or a pool (retries), at version v of its
// replies about it (policyd.lua's Shares).
type share struct {
	hold float64
	v    uint64
}

// debt is what this replica granted from its share while the engine did
// not answer it: tokens of a tenant's bucket (run empty), or retries of a
// run's pool, to be charged to the engine when it answers, once (by id).
type debt struct {
	id      string
	tenant  string
	run     string
	tokens  float64
	retries uint64
}

func newDegraded() *degraded {
	return &degraded{breakers: map[policy.BreakerKey]*fleet.Breaker{}, origin: map[policy.BreakerKey]uint64{}, spent: map[string]float64{},
		runSpent: map[string]uint64{}, tokens: map[string]share{}, runs: map[string]share{}, live: 1,
		runTenant: map[string]string{}, flows: map[policy.BreakerKey]*localFlow{}, limits: map[policy.BreakerKey]float64{}}
}

// reset drops the local copies at a transition of the engine; what was
// spent from the shares becomes debts. It returns the breakers whose copy
// changed state, which the replica's subscribers were told of.
func (d *degraded) reset() (changed []policy.BreakerKey) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, b := range d.breakers {
		if b.Generation != d.origin[k] {
			changed = append(changed, k)
		}
	}
	clear(d.breakers)
	clear(d.origin)
	clear(d.flows)
	d.owe()
	return changed
}

// owe turns what was spent from the shares into debts; d.mu is held.
func (d *degraded) owe() {
	for tenant, t := range d.spent {
		if t > 0 {
			d.debts = append(d.debts, debt{id: newPermitID().String(), tenant: tenant, tokens: t})
		}
	}
	for run, n := range d.runSpent {
		if n > 0 {
			d.debts = append(d.debts, debt{id: newPermitID().String(), tenant: d.runTenant[run], run: run, retries: n})
		}
	}
	clear(d.spent)
	clear(d.runSpent)
}

// pending returns the debts waiting, those of grants made since the last
// transition (lone calls that timed out while the engine was up)
// included. They stay in d.debts until charged: a share counts them.
func (d *degraded) pending() []debt {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.owe()
	return slices.Clone(d.debts)
}

// owes reports whether tenant's bucket or run's pool has grants not
// charged to the engine yet.
func (d *degraded) owes(tenant, run string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.spent[tenant] > 0 || run != "" && d.runSpent[run] > 0 {
		return true
	}
	t, r := d.owed(tenant, run)
	return t > 0 || r > 0
}

// owed is what tenant's bucket and run's pool owe the engine in debts;
// d.mu is held.
func (d *degraded) owed(tenant, run string) (tokens float64, retries uint64) {
	for _, db := range d.debts {
		switch {
		case db.run == "" && db.tenant == tenant:
			tokens += db.tokens
		case db.run != "" && db.run == run:
			retries += db.retries
		}
	}
	return tokens, retries
}

// drop forgets a debt the engine refused to be charged.
func (d *degraded) drop(db *debt) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.debts = slices.DeleteFunc(d.debts, func(o debt) bool { return o.id == db.id })
}

// charged forgets a debt the engine was charged and notes this replica's
// shares after it.
func (d *degraded) charged(db *debt, sh spendShares) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.debts = slices.DeleteFunc(d.debts, func(o debt) bool { return o.id == db.id })
	d.note(db.tenant, db.run, sh)
}

// saw remembers this replica's shares after a spend while up.
func (d *degraded) saw(tenant, run string, sh spendShares) {
	d.mu.Lock()
	d.note(tenant, run, sh)
	d.mu.Unlock()
}

// note keeps sh's shares of tenant's bucket and run's pool where they
// are newer than those known (replies to concurrent calls may arrive out
// of order); d.mu is held.
func (d *degraded) note(tenant, run string, sh spendShares) {
	if old, ok := d.tokens[tenant]; !ok || sh.bucket.v >= old.v {
		d.tokens[tenant] = sh.bucket
	}
	if old, ok := d.runs[run]; run != "" && (!ok || sh.run.v >= old.v) {
		d.runs[run] = sh.run
	}
}

// shareArgs returns what policyd_spend needs to set this replica's
// shares of tenant's bucket and run's pool. Before its first heartbeat
// answered it knows no live replica: it then forfeits no one's share.
func (d *degraded) shareArgs(replica, tenant, run string, grace time.Duration) shareArgs {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.liveIDs == "" {
		grace = 100 * 365 * 24 * time.Hour
	}
	return shareArgs{replica: replica, bucket: d.tokens[tenant].v, run: d.runs[run].v, live: d.liveIDs, grace: grace}
}

// replicas returns the live replicas last counted, at least 1.
func (d *degraded) replicas() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return max(d.live, 1)
}

// breaker returns the local copy of the breaker under key, made from st
// (nil: never seen, a new CLOSED breaker) on first use. d.mu is held.
func (d *degraded) breaker(key policy.BreakerKey, st *state, now int64) *fleet.Breaker {
	b := d.breakers[key]
	if b != nil {
		return b
	}
	nb := fleet.NewBreaker(now)
	if st != nil {
		nb.State, nb.Forced, nb.Mode, nb.Generation = st.State, st.Forced, st.Mode, st.Generation
		nb.OpenUntil, nb.Changed = st.OpenUntil*1000, st.Changed*1000
		nb.Cooldown.Until, nb.Consecutive = st.Cooldown*1000, st.Consecutive
	}
	d.breakers[key] = &nb
	d.origin[key] = nb.Generation
	return &nb
}

// told tells the replica's subscribers of b, the copy of the breaker under
// key, when its generation is no longer gen (it changed state); d.mu is
// held.
func (d *degraded) told(key policy.BreakerKey, b *fleet.Breaker, gen uint64, now int64) {
	if b.Generation == gen || d.tell == nil {
		return
	}
	snap := b.Snapshot(key, now)
	snap.Degraded = true
	d.tell(snap)
}

// admit is Admit in degraded mode at now (Unix ns).
func (d *degraded) admit(key policy.BreakerKey, cfg policy.BreakerConfig, st *state, now int64) policy.Admission {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.admitLocked(key, cfg, st, now)
}

// admitLocked is admit with d.mu held.
func (d *degraded) admitLocked(key policy.BreakerKey, cfg policy.BreakerConfig, st *state, now int64) policy.Admission {
	b := d.breaker(key, st, now)
	gen := b.Generation
	defer d.told(key, b, gen, now)
	cfg.HalfOpenProbes = probeShare(cfg.HalfOpenProbes, d.live)
	b.Advance(now)
	expiry := now + int64(cfg.ProbeTimeout) // fleet.Breaker.Admit's
	a, _ := b.Admit(now, &cfg, func() fleet.PermitID { return degradedPermitID(expiry) })
	a.Degraded = true
	return a
}

// enginePermit is permit as the engine is to be told it while it answers:
// a probe permit a local copy handed out in degraded mode, on this replica
// or another (its id says so: degradedPermitID), still live at now,
// becomes no permit. The engine never handed it out, so it would refuse
// it (fleet.ErrPermit, FAILED_PRECONDITION for the fleet's own probe); as
// a result without a permit it settles nothing in HALF_OPEN, as a late
// result does, and counts in any other state. An expired one is refused
// as the engine's own expired permits are. clock is read only for such a
// permit: most results carry none.
func enginePermit(permit string, clock func() time.Time) string {
	id, ok := fleet.ParsePermitID(permit)
	if !ok {
		return permit
	}
	if exp, degraded := degradedPermit(id); degraded && exp > clock().UnixNano() {
		return ""
	}
	return permit
}

// probeShare is ceil(n / live): this replica's share of n probes.
func probeShare(n, live int) int {
	live = max(live, 1)
	return max((n+live-1)/live, 1)
}

// record is Record in degraded mode at now (Unix ns).
func (d *degraded) record(key policy.BreakerKey, cfg policy.BreakerConfig, st *state, r policy.Result, permit string, now int64) (policy.BreakerSnapshot, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.breaker(key, st, now)
	gen := b.Generation
	defer d.told(key, b, gen, now)
	cfg.HalfOpenProbes = probeShare(cfg.HalfOpenProbes, d.live)
	b.Advance(now)
	_, err := b.Record(now, &cfg, r, permit)
	if errors.Is(err, fleet.ErrPermit) {
		// A permit the local copy does not hold: handed out by the engine
		// before it stopped answering, or by another replica's local copy,
		// which this replica cannot check. It settles nothing here, and
		// the decision is answered: refused, it was an error
		// (FAILED_PRECONDITION) for a probe that was the fleet's own
		// (policybench replicas, stop-redis: 46 of them).
		err = nil
	}
	snap := b.Snapshot(key, now)
	snap.Degraded = true // a decision made from it says so, whatever else it spends
	return snap, err
}

// keys are the breakers of tenant ("": every tenant's) this replica has a
// local copy of.
func (d *degraded) keys(tenant string) []policy.BreakerKey {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []policy.BreakerKey
	for k := range d.breakers {
		if tenant == "" || k.Tenant == tenant {
			out = append(out, k)
		}
	}
	return out
}

// snapshot is the local copy of the breaker under key at now (Unix ns),
// as the next decision made from it sees it; false when this replica has
// made none (it then decides from the cached state).
func (d *degraded) snapshot(key policy.BreakerKey, now int64) (policy.BreakerSnapshot, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.breakers[key]
	if b == nil {
		return policy.BreakerSnapshot{}, false
	}
	gen := b.Generation
	b.Advance(now)
	d.told(key, b, gen, now)
	return b.Snapshot(key, now), true
}

// spend is SpendRetry in degraded mode: from this replica's shares of the
// tenant's bucket and the run's pool.
func (d *degraded) spend(tenant string, b *policy.TenantBudget, timeout bool, run string) policy.Spend {
	d.mu.Lock()
	defer d.mu.Unlock()
	cost := b.RetryCost
	if timeout {
		cost = b.TimeoutCost
	}
	sp := policy.Spend{Degraded: true, HasRun: run != ""}
	if run != "" {
		d.runTenant[run] = tenant
	}
	// What earlier outages granted and the engine was not charged yet is
	// not in the levels last seen: it counts against the share.
	owedTokens, owedRetries := d.owed(tenant, run)
	left := d.tokens[tenant].hold - d.spent[tenant] - owedTokens
	sp.TenantTokens = max(left, 0)
	if run != "" {
		share := uint64(d.runs[run].hold)
		used := d.runSpent[run] + owedRetries
		if used >= share {
			sp.Stop, sp.Disposition = policy.StopBudgetExhausted, policy.DispositionDeadLetter
			return sp
		}
		sp.RunRemaining = share - used
	}
	if left < cost {
		if !b.DryRun {
			sp.Stop, sp.Disposition = policy.StopBudgetExhausted, policy.DispositionDeadLetter
			return sp
		}
		sp.DryRunRefused = true
	} else {
		d.spent[tenant] += cost
		sp.TenantTokens = left - cost
	}
	if run != "" {
		d.runSpent[run]++
		sp.RunRemaining--
	}
	sp.Granted = true
	return sp
}

// Up reports whether the engine is considered up: false from
// Options.DownAfter failed calls in a row until a probe succeeds. While
// it is false the Store answers in degraded mode.
func (s *Store) Up() bool { return s.health.up() }

// Downs returns the times this replica found the engine down and went
// into degraded mode since it started: a gauge of Up scraped now and then
// misses an episode of a second, a count of them does not.
func (s *Store) Downs() uint64 { return s.downs.Load() }

// engineChanged logs a transition of the engine and, when it comes back,
// drops the degraded copies and replays the queued batches.
func (s *Store) engineChanged(up bool) {
	s.toldAgain(s.degraded.reset()) // local copies start from the cache at each transition
	if !up {
		s.downs.Add(1)
		s.log.Warn("redisstore: engine down: deciding in degraded mode from this replica's last known state",
			"after_failures", s.health.threshold(), "probe_every", s.opts.DownFor)
		return
	}
	s.log.Info("redisstore: engine up: degraded mode over")
	select {
	case s.recovered <- struct{}{}:
	default:
	}
}

// keyReplicas is the sorted set of replica ids by last heartbeat (Unix ms).
const keyReplicas = "{policyd}:replicas"

// heartbeat refreshes this replica's entry and counts the live ones: those
// seen within three heartbeat intervals.
func (s *Store) heartbeat(ctx context.Context) {
	now := s.opts.Clock().UnixMilli()
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	var ids *redis.StringSliceCmd
	_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, keyReplicas, redis.Z{Score: float64(now), Member: s.id})
		p.ZRemRangeByScore(ctx, keyReplicas, "-inf", strconv.FormatInt(now-3*s.opts.Heartbeat.Milliseconds(), 10))
		ids = p.ZRange(ctx, keyReplicas, 0, -1)
		return nil
	})
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			s.log.Warn("redisstore: heartbeat", "err", err)
		}
		return
	}
	s.degraded.mu.Lock()
	s.degraded.live = max(len(ids.Val()), 1)
	s.degraded.liveIDs = strings.Join(ids.Val(), " ")
	s.degraded.mu.Unlock()
}

// heartbeats runs heartbeat every Options.Heartbeat until Close.
func (s *Store) heartbeats() {
	defer s.wg.Done()
	s.heartbeat(s.ctx)
	t := time.NewTicker(s.opts.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			s.heartbeat(s.ctx)
		}
	}
}

// queuedBatch is an outcome batch the engine did not take: n is the
// number of updates of the ApplyOutcomes call it came from, which its
// update indexes refer to.
type queuedBatch struct {
	b *outcomeBatch
	n int
}

// batchQueue holds the outcome batches waiting for the engine, oldest
// first, at most max of them; past it the oldest is dropped and counted.
type batchQueue struct {
	mu      sync.Mutex
	max     int
	batches []queuedBatch
	sending int // popped, not yet done
	dropped atomic.Uint64
}

func (q *batchQueue) push(b *outcomeBatch, n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.batches) >= q.max {
		q.batches = q.batches[1:]
		q.dropped.Add(1)
	}
	q.batches = append(q.batches, queuedBatch{b, n})
}

// pushFront puts b, just popped, back at the head of the queue.
func (q *batchQueue) pushFront(b *outcomeBatch, n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.batches = slices.Insert(q.batches, 0, queuedBatch{b, n})
}

// pop returns the oldest batch, or false.
func (q *batchQueue) pop() (queuedBatch, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.batches) == 0 {
		return queuedBatch{}, false
	}
	b := q.batches[0]
	q.batches = q.batches[1:]
	q.sending++
	return b, true
}

// done ends the sending of a popped batch.
func (q *batchQueue) done() {
	q.mu.Lock()
	q.sending--
	q.mu.Unlock()
}

func (q *batchQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.batches) + q.sending
}

// Queued returns the outcome batches waiting for the engine to answer,
// the one being replayed included.
func (s *Store) Queued() int { return s.queue.len() }

// Dropped returns the outcome batches dropped so far because the queue
// was full (Options.MaxQueuedBatches): their results, deposits and
// ledger entries are lost.
func (s *Store) Dropped() uint64 { return s.queue.dropped.Load() }

// queueOutcomes queues batches for replay; while the engine is down their
// results also drive this replica's local copies of the breakers.
func (s *Store) queueOutcomes(n int, batches map[string]*outcomeBatch) {
	down := !s.health.up()
	now := s.opts.Clock().UnixNano()
	for _, b := range batches {
		if down {
			for _, g := range b.groups {
				st, _ := s.cachedState(g.key)
				for _, r := range g.runs {
					for range r.n {
						_, _ = s.degraded.record(g.key, g.cfg, st, r.result, r.permit, now)
					}
				}
			}
		}
		s.queue.push(b, n)
	}
}

// queueOne queues b, a batch of n updates the engine did not take, at the
// back of the queue (queueOutcomes).
func (s *Store) queueOne(n int, b *outcomeBatch) {
	s.queueOutcomes(n, map[string]*outcomeBatch{b.tenant: b})
}

// replayer sends the queued batches once the engine answers again: at
// each recovery, and every FlushInterval for batches queued after a lone
// timeout. A batch the engine applied already (its call timed out but
// ran) is skipped by the library.
func (s *Store) replayer() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.recovered:
		case <-t.C:
		}
		s.replay()
	}
}

// chargeDebts charges the engine the debts of earlier outages that of
// selects (all when nil), oldest first; those it does not answer for wait
// for the next try.
func (s *Store) chargeDebts(of func(*debt) bool) {
	if !s.health.up() {
		return // while down, what is spent stays spent from the shares
	}
	for _, d := range s.degraded.pending() {
		if of != nil && !of(&d) {
			continue
		}
		if !s.health.up() {
			return
		}
		b, _ := s.budgetOf(d.tenant)
		ctx, cancel := s.call()
		_, _, sh, err := chargeCall(ctx, s.lib, &d, &b, s.id)
		cancel()
		switch {
		case errors.Is(err, ErrUnavailable):
			return // charged at the next try, by the same id
		case err != nil:
			s.log.Warn("redisstore: degraded-mode grants not charged: dropped", "tenant", d.tenant, "run", d.run,
				"tokens", d.tokens, "retries", d.retries, "err", err)
			s.degraded.drop(&d)
		default:
			s.degraded.charged(&d, sh)
		}
	}
}

// charges are the charges of a tenant's debts in flight on this replica
// (chargeOwed): each closed when its charge ends.
type charges struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

// chargeOwed charges the engine what this replica granted alone from
// tenant's bucket or run's pool (in an outage, or by a lone call past its
// bound), as SpendRetry and the one-call NextDelay do before they grant
// from the same tokens again. A request that finds the tenant's charge in
// flight waits for it, within its own time, instead of sending the same
// debts again: a lone timeout under load finds many requests of the
// tenant at once.
func (s *Store) chargeOwed(tenant, run string) {
	c := &s.charging
	c.mu.Lock()
	if wait, ok := c.m[tenant]; ok {
		c.mu.Unlock()
		ctx, cancel := s.call()
		defer cancel()
		select {
		case <-wait:
		case <-ctx.Done():
		}
		return
	}
	if c.m == nil {
		c.m = map[string]chan struct{}{}
	}
	done := make(chan struct{})
	c.m[tenant] = done
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.m, tenant)
		c.mu.Unlock()
		close(done)
	}()
	s.chargeDebts(func(d *debt) bool { return d.tenant == tenant || run != "" && d.run == run })
}

// releaseShares gives back this replica's shares of the buckets and pools
// it spent from (policyd_release_shares, one call per tenant) once the
// engine has been charged every grant it made alone, so a replica that
// stops leaves nothing set aside for it. While the engine does not answer
// or a debt is left they stay set aside, and are forfeited once the
// replica has been out of the heartbeat set for ten heartbeats.
func (s *Store) releaseShares() {
	s.chargeDebts(nil)
	if !s.health.up() || len(s.degraded.pending()) > 0 {
		return
	}
	keys := map[string][]string{} // tenant -> its bucket, then its runs
	d := s.degraded
	d.mu.Lock()
	for t := range d.tokens {
		keys[t] = append(keys[t], keyBucket(t))
	}
	for run := range d.runs {
		if t, ok := s.runTenants.Load(run); ok {
			tenant := t.(string)
			if keys[tenant] == nil {
				keys[tenant] = []string{keyBucket(tenant)}
			}
			keys[tenant] = append(keys[tenant], keyRun(tenant, run))
		}
	}
	d.mu.Unlock()
	for tenant, k := range keys {
		ctx, cancel := s.call()
		err := s.lib.run(ctx, "policyd_release_shares", k, s.id).Err()
		cancel()
		if err != nil {
			s.log.Warn("redisstore: shares not given back: forfeited later", "tenant", tenant, "err", err)
		}
	}
}

// replay charges the debts of earlier outages, then sends queued batches,
// oldest first, until the queue is empty or the engine stops answering.
func (s *Store) replay() {
	s.chargeDebts(nil)
	s.writeDownAttempts()
	// A batch not taken goes back where it came from: its results were
	// counted in degraded mode when it was first queued.
	notTaken := false
	back := func(n int, b *outcomeBatch) {
		notTaken = true
		s.queue.pushFront(b, n)
	}
	for s.health.up() {
		q, ok := s.queue.pop()
		if !ok {
			return
		}
		// A batch the engine does not take goes back to the head of the
		// queue, and the replay ends until the next recovery or tick:
		// going on with the next batch would wait a timeout for each
		// while Redis is stopped, or, while the engine's breaker lets
		// only its one call out, build and refuse every batch of the
		// queue in a loop that holds the replica's P, and would send
		// the queue out of order.
		_, err := s.sendOutcomes(make([]policy.OutcomeUpdate, q.n), map[string]*outcomeBatch{q.b.tenant: q.b}, nil, false, back)
		s.queue.done()
		if notTaken {
			return
		}
		if err != nil {
			s.log.Warn("redisstore: replayed outcome batch refused: dropped", "tenant", q.b.tenant, "err", err)
			s.queue.dropped.Add(1)
		}
	}
}

// sawRun remembers a run as last read.
func (d *degraded) sawRun(r policy.Run) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.runInfo == nil {
		d.runInfo = map[string]policy.Run{}
	}
	d.runInfo[r.ID] = r
}

// run returns the run id as last read.
func (d *degraded) run(id string) (policy.Run, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.runInfo[id]
	return r, ok
}
