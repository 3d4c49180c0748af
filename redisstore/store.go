package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// Options configures a Store.
type Options struct {
	// Client is the Redis the replicas share: a *redis.Client, a
	// *redis.ClusterClient or a failover client, made with
	// ContextTimeoutEnabled so that Timeout bounds its calls. The Store
	// does not close it.
	Client redis.UniversalClient
	// Timeout bounds every call to Redis (policyd serve's --store-timeout);
	// default 50ms. Open's own calls get twenty times as long. A request's
	// library call made while another is in flight waits for it and goes
	// in the next round trip with the others that came meanwhile, one
	// pipeline (coalesce.go); Timeout bounds it from when it was asked,
	// its wait included, and one not sent by then is not sent.
	Timeout time.Duration
	// DefaultBudget applies to tenants without an explicit budget; zero
	// numeric fields take DefaultTenantBudget's values.
	DefaultBudget policy.TenantBudget
	// Clock, when set, is the time every decision is made at: each call of
	// the library passes it (Unix µs) and the functions use it instead of
	// the server's TIME; the replica judges its cached cool-downs, audit
	// times and attempt expiries by it too. Nil (production) means the
	// server's TIME decides and the replica's own clock (time.Now) judges
	// the cache. Tests set it to move time without sleeping (the contract
	// suite's fake clock); replicas sharing one Redis must then share one
	// clock. Key expiry (PEXPIREAT of attempt records) and audit stream
	// entry ids stay the server's own clock.
	Clock func() time.Time
	// Log receives the feed's errors; default slog.Default().
	Log *slog.Logger
	// FeedBlock is how long one XREAD of a feed blocks when nothing
	// arrives. A tenant followed meanwhile and Close end the read at once
	// (the feed's wake-up stream, feed.go); when Redis does not answer,
	// Close waits up to FeedBlock and a second more (feedGrace) for the
	// feeds to end. Default 100ms.
	FeedBlock time.Duration
	// FlushInterval is how often buffered audit records are written;
	// default 100ms.
	FlushInterval time.Duration
	// MaxAuditBuffer caps the audit records appended and not yet packed
	// by a flush (every FlushInterval); default 100,000.
	MaxAuditBuffer int
	// MaxAuditWaitingBytes caps the packed (and compressed) chunks of
	// audit records a flush could not write, waiting for the next one
	// while the engine does not answer or falls behind; past it the
	// oldest are dropped (AuditDropped counts their records). Default 64
	// MiB: at the 13 bytes a record of policybench's report mix, about 5
	// million records, 50 s of a replica appending 100,000 a second.
	MaxAuditWaitingBytes int
	// AuditRetention is how long audit records are kept (streams are
	// trimmed by entry id at each flush); default 7 days.
	AuditRetention time.Duration
	// AuditMaxRecords caps the records of one tenant's audit stream
	// (trimmed exactly, by records, at each write); default 1,000,000.
	AuditMaxRecords int
	// MaxBreakersPerTenant caps the breakers of one tenant (the empty
	// tenant of target-scoped breakers counts as one); a new one past it
	// is ErrTooManyBreakers. Default 10000, as breakerstore's.
	MaxBreakersPerTenant int
	// MaxRunCalls caps the calls of one run's call table; a new call past
	// it is counted, not kept. Default DefaultMaxRunCalls.
	MaxRunCalls int
	// MaxKeysPerTenant caps the live idempotency records of one tenant; a
	// new one past it is ErrTooManyKeys. Default DefaultMaxKeysPerTenant.
	MaxKeysPerTenant int
	// WaitReplicas, when > 0, makes every admin write (policies, budgets,
	// runs, breaker resets and forces, idempotency claims and completions) wait (WAIT) until that many
	// replicas of its primary have it, for at most WaitTimeout (default
	// 1s): a Sentinel or Cluster failover then cannot lose it. Replication
	// stays asynchronous for everything else.
	WaitReplicas int
	WaitTimeout  time.Duration
	// DownAfter is how many calls to Redis in a row must fail (time out or
	// find no connection) before the Store considers the engine down and
	// decides in degraded mode (see Up); default 3. DownFor is how long it
	// then waits before each probe call; default 1s.
	DownAfter int
	DownFor   time.Duration
	// Heartbeat is how often the replica refreshes its entry in the
	// fleet's replica set, whose count divides probes, tokens and pools in
	// degraded mode; default 1s.
	Heartbeat time.Duration
	// MaxQueuedBatches caps the outcome batches queued while the engine is
	// down; past it the oldest is dropped (and counted, Dropped). Default
	// 10,000.
	MaxQueuedBatches int
	// BatchOutcomes makes ApplyOutcomes hold the outcome updates that need
	// no answer from the engine (breaker results without a probe permit,
	// deposits, attempt tallies) and send them every FlushInterval, merged
	// into one call of policyd_outcomes per tenant, or sooner when a
	// tenant's batch passes a few thousand results, and at Close. A batch
	// with a final disposition of a run or a probe permit (whose refusal
	// is the caller's answer) or a breaker this replica has not seen yet
	// is sent at once, after the tenant's held updates; so is a note of a
	// run's call table sent at once (NoteCall, a Commit's), so that no note
	// overtakes one held before it; a Record or a one-call NextDelay of a
	// breaker (a decision's result) takes that breaker's held results
	// along in its call, in front of its own. The
	// held updates are then on the engine (and on its disk with
	// appendfsync always) within FlushInterval plus one call, not before
	// the answer: a crash of the replica loses at most that
	// interval of counting, and other replicas' reads see them after the
	// flush. Off (policyd serve --sync=always): every batch is sent before
	// ApplyOutcomes returns.
	BatchOutcomes bool
	// RoundTripObserver, when set, takes the duration of every round
	// trip to Redis the engine breaker lets through, a command's or a
	// pipeline's (a coalesced one once), in seconds, from its write to its
	// reply: how near the calls run to Timeout. The feeds' blocking XREADs
	// are left out, since they wait for events by design. policyd serve
	// passes the histogram policyd_store_round_trip_seconds.
	RoundTripObserver RoundTripObserver
}

// DefaultTenantBudget is the budget of tenants without an explicit one when
// Options.DefaultBudget is zero: fleet.DefaultBudget, as in breakerstore.
func DefaultTenantBudget() policy.TenantBudget { return fleet.DefaultBudget() }

// Store is one replica's view of the fleet state in Redis: it forwards
// every state change to the library's functions and keeps a cache of the
// tenant's breaker states, kept current by the tenant's event stream, from
// which it answers Admit on a CLOSED breaker without a round trip. It is
// safe for concurrent use.
//
// A Store is also the view of one request (Begin's): the same replica,
// with a deadline that every engine call made through the view shares
// (bound), so that a decision making several calls (a fallback chain, a
// lease, the batch that follows a one-call step the engine did not
// answer) waits for Redis at most Options.Timeout in all, not once per
// call.
type Store struct {
	*replicaState
	bound time.Time // zero: each call bounded by Options.Timeout on its own
}

// replicaState is the replica a Store and its requests' views share.
type replicaState struct {
	root      *Store // the Store Open returned: what goroutines outliving a request use
	c         redis.UniversalClient
	lib       lib // s.c with the clock of every library call, and the coalescer of concurrent ones
	opts      Options
	defBudget policy.TenantBudget
	log       *slog.Logger
	closed    atomic.Bool

	ctx    context.Context // ends the feeds
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.RWMutex
	cache  map[policy.BreakerKey]*cached
	claims claims           // calls whose attempt this replica is deciding
	feeds  map[string]*feed // by tenant
	// allSubs are the subscriptions to every tenant: each joins the feed
	// of every tenant followed later.
	allSubs map[*sub]struct{}
	groups  map[int]*feedGroup // by hash slot on a Cluster, else one

	audit         auditBuffer
	held          heldOutcomes // outcome batches waiting for the flush (Options.BatchOutcomes)
	trips         roundTrips   // the round trips to Redis, by call (RoundTrips)
	admin         adminCache
	defaultPolicy policy.Policy
	runTenants    sync.Map // run id -> tenant: a run never changes tenant
	runCutoffs    sync.Map // run id -> policy.Run of ID, Tenant and Cutoff, which never change (KnownRun)

	id        string // this replica's id in the replica set
	health    *health
	degraded  *degraded
	charging  charges // the charges of degraded-mode grants in flight, by tenant
	queue     batchQueue
	down      downAttempts                // attempt records decided while the engine was down
	recovered chan struct{}               // signalled when the engine comes back
	local     chan policy.BreakerSnapshot // local changes for the subscribers (localevents.go)
	downs     atomic.Uint64               // the times the engine went down (Downs)
}

// cached is one breaker's last known state.
type cached struct {
	st atomic.Pointer[state]
}

// Open loads the library onto the server (every master of a Cluster),
// checks the schema version and returns a Store.
func Open(ctx context.Context, opts Options) (*Store, error) {
	if opts.Client == nil {
		return nil, errors.New("redisstore: Options.Client is nil")
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 50 * time.Millisecond
	}
	fixed := opts.Clock // nil: the server's TIME decides
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.FeedBlock <= 0 {
		opts.FeedBlock = 100 * time.Millisecond
	}
	if opts.FlushInterval <= 0 {
		opts.FlushInterval = 100 * time.Millisecond
	}
	if opts.MaxAuditBuffer <= 0 {
		opts.MaxAuditBuffer = 100_000
	}
	if opts.MaxAuditWaitingBytes <= 0 {
		opts.MaxAuditWaitingBytes = 64 << 20
	}
	if opts.AuditRetention <= 0 {
		opts.AuditRetention = 7 * 24 * time.Hour
	}
	if opts.AuditMaxRecords <= 0 {
		opts.AuditMaxRecords = 1_000_000
	}
	if opts.MaxBreakersPerTenant <= 0 {
		opts.MaxBreakersPerTenant = 10000
	}
	if opts.MaxRunCalls <= 0 {
		opts.MaxRunCalls = DefaultMaxRunCalls
	}
	if opts.MaxKeysPerTenant <= 0 {
		opts.MaxKeysPerTenant = DefaultMaxKeysPerTenant
	}
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = time.Second
	}
	if opts.DownAfter <= 0 {
		opts.DownAfter = 3
	}
	if opts.DownFor <= 0 {
		opts.DownFor = time.Second
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = time.Second
	}
	if opts.MaxQueuedBatches <= 0 {
		opts.MaxQueuedBatches = 10_000
	}
	if !contextTimeouts(opts.Client) {
		opts.Log.Warn("redisstore: the Redis client ignores context deadlines (ContextTimeoutEnabled is off): Timeout does not bound its calls")
	}
	def := fleet.FillBudget(opts.DefaultBudget, DefaultTenantBudget())
	// Loading the library is no decision: bounded by 20 timeouts, at least
	// 5s (at 50ms the second a busy machine could outlast, the test
	// command running its packages at once).
	ctx, cancel := context.WithTimeout(ctx, max(20*opts.Timeout, 5*time.Second))
	defer cancel()
	if err := loadLibrary(ctx, opts.Client); err != nil {
		return nil, err
	}
	s := &Store{replicaState: &replicaState{c: opts.Client, lib: lib{c: opts.Client, clock: fixed}, opts: opts, defBudget: def, log: opts.Log,
		cache: map[policy.BreakerKey]*cached{}, feeds: map[string]*feed{}, groups: map[int]*feedGroup{}, allSubs: map[*sub]struct{}{}, defaultPolicy: policy.Default(),
		id: newPermitID().String(), degraded: newDegraded(), recovered: make(chan struct{}, 1),
		local: make(chan policy.BreakerSnapshot, localEventsBuffer)}}
	s.root = s
	s.degraded.tell = s.tell
	s.health = &health{clock: opts.Clock, changed: s.engineChanged, b: engineBreaker{Threshold: opts.DownAfter, Cooldown: opts.DownFor}}
	s.queue.max = opts.MaxQueuedBatches
	s.held = newHeldOutcomes()
	s.trips.observe = opts.RoundTripObserver
	opts.Client.AddHook(s.health.hook(&s.trips))
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.lib.q = &coalescer{c: opts.Client, base: s.ctx}
	last, err := s.loadAdmin()
	if err != nil {
		s.cancel()
		return nil, err
	}
	s.wg.Add(5)
	go s.followChanges(last)
	go s.flusher()
	go s.heartbeats()
	go s.replayer()
	go s.localEvents()
	return s, nil
}

// contextTimeouts reports whether c's calls end at their context's
// deadline.
func contextTimeouts(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return true // unknown to us: assume so
}

// Close sends the outcome batches held for the flush, gives back this
// replica's shares of budgets and pools (releaseShares), ends the feeds and
// closes every subscription's channel, writes the audit records still
// buffered, and leaves the client open.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.flushHeld()         // while s.ctx still bounds its call
	s.writeDownAttempts() // likewise
	s.releaseShares()     // likewise
	s.cancel()
	s.wakeAll() // the feeds' reads end now, not at FeedBlock
	s.wg.Wait()
	s.health.off.Store(true)
	s.mu.Lock()
	for sb := range s.allSubs { // those that joined no feed yet
		sb.close()
	}
	s.mu.Unlock()
	s.flushAudit(context.Background(), true)
	return nil
}

// flusher sends the held outcome batches and writes the buffered audit
// records every FlushInterval until Close, and the held batches also when
// one grows past maxHeldResults.
func (s *Store) flusher() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.held.wake:
			s.flushHeld()
		case <-t.C:
			s.flushHeld()
			s.flushAudit(s.ctx, false)
		}
	}
}

// call returns a context bounded by the store's timeout, or by the
// request's deadline on a request's view.
func (s *Store) call() (context.Context, context.CancelFunc) {
	if !s.bound.IsZero() {
		return context.WithDeadline(s.ctx, s.bound)
	}
	return context.WithTimeout(s.ctx, s.opts.Timeout)
}

// learn merges st, a state of the breaker under key the engine reported,
// into the cache: a later generation replaces the cached one, the same
// generation keeps the later cool-down, an earlier one is stale.
func (s *Store) learn(key policy.BreakerKey, st state) {
	s.mu.RLock()
	e := s.cache[key]
	s.mu.RUnlock()
	if e == nil {
		s.mu.Lock()
		if e = s.cache[key]; e == nil {
			e = &cached{}
			s.cache[key] = e
		}
		s.mu.Unlock()
	}
	for {
		old := e.st.Load()
		next := st
		if old != nil {
			switch {
			case st.Generation < old.Generation:
				return
			case st.Generation == old.Generation && st.Cooldown < old.Cooldown:
				next.Cooldown = old.Cooldown
			}
		}
		if e.st.CompareAndSwap(old, &next) {
			return
		}
	}
}

// cachedState returns the cached state of the breaker under key.
func (s *Store) cachedState(key policy.BreakerKey) (*state, bool) {
	s.mu.RLock()
	e := s.cache[key]
	s.mu.RUnlock()
	if e == nil {
		return nil, false
	}
	st := e.st.Load()
	return st, st != nil
}

// errClosed is returned by every method after Close.
func (s *Store) check() error {
	if s.closed.Load() {
		return ErrClosed
	}
	return nil
}
