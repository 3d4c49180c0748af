package policyclient

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// breakerCache mirrors the fleet's breakers for one tenant from
// WatchBreakers, so an attempt against a CLOSED breaker costs no RPC and one
// against an OPEN breaker fails without leaving the process.
type breakerCache struct {
	tenant string
	// live is true while the stream is connected and its snapshot complete;
	// only then does a missing entry mean CLOSED.
	live atomic.Bool
	mu   sync.RWMutex
	m    map[cacheKey]cachedBreaker
	// changed is closed and replaced on every update (guarded by mu), so
	// waiters can block until the cache moves.
	changed chan struct{}
	// resume is the resume token of the last message applied (guarded by
	// mu), sent when the watch subscribes again so that the stream, on
	// any replica of a store that resumes, goes on after it.
	resume string
}

type cacheKey struct{ tenant, target string }

type cachedBreaker struct {
	state         pb.BreakerState
	forced        bool
	openUntil     time.Time
	cooldownUntil time.Time
}

func newBreakerCache(tenant string) *breakerCache {
	return &breakerCache{tenant: tenant, m: map[cacheKey]cachedBreaker{}, changed: make(chan struct{})}
}

// updated wakes the waiters; the caller holds mu.
func (b *breakerCache) updated() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// next returns a channel closed at the cache's next update.
func (b *breakerCache) next() <-chan struct{} {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.changed
}

// Ready blocks until the client follows policyd's breakers (the
// WatchBreakers snapshot has arrived), or ctx ends. Until then every attempt
// asks Admit. It is never needed for correctness; it lets a worker start
// on the fast path.
func (c *Client) Ready(ctx context.Context) error {
	for {
		ch := c.breakers.next()
		if c.breakers.live.Load() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// lookup returns the breaker of target for the tenant (or the target-scoped
// one) and whether the cache can answer at all.
func (b *breakerCache) lookup(target string) (cachedBreaker, bool) {
	if !b.live.Load() {
		return cachedBreaker{}, false
	}
	b.mu.RLock()
	e, ok := b.m[cacheKey{b.tenant, target}]
	if !ok {
		e, ok = b.m[cacheKey{"", target}]
	}
	b.mu.RUnlock()
	if !ok {
		e.state = pb.BreakerState_BREAKER_STATE_CLOSED
	}
	return e, true
}

// openAt returns a function that reports whether the client last saw
// target's breaker (for the tenant, or the target-scoped one) open at now:
// forced open, or open until after now. Unlike lookup it answers from the
// last states seen while the watch is down too, for the local policy's
// routing along a chain.
func (b *breakerCache) openAt(now time.Time) func(target string) bool {
	return func(target string) bool {
		b.mu.RLock()
		e, ok := b.m[cacheKey{b.tenant, target}]
		if !ok {
			e = b.m[cacheKey{"", target}]
		}
		b.mu.RUnlock()
		return e.state == pb.BreakerState_BREAKER_STATE_OPEN && (e.forced || e.openUntil.After(now))
	}
}

func toCached(br *pb.Breaker) (cacheKey, cachedBreaker) {
	return cacheKey{br.GetKey().GetTenant(), br.GetKey().GetTarget()}, cachedBreaker{
		state:         br.GetState(),
		forced:        br.GetForced(),
		openUntil:     br.GetOpenUntilTime().AsTime(),
		cooldownUntil: br.GetCooldownUntilTime().AsTime(),
	}
}

// Reconnect delays of a broken breaker watch: reconnect n (from 0) waits
// min(maxReconnectDelay, minReconnectDelay x 2^n) scaled into its upper
// half at random (see reconnectDelay).
const (
	minReconnectDelay = 200 * time.Millisecond
	maxReconnectDelay = 5 * time.Second
)

// reconnectDelay is the wait before reconnect n (from 0) of a broken watch:
// nominal = min(maxReconnectDelay, minReconnectDelay x 2^n), and u, a draw
// in [0, 1), places it in [nominal/2, nominal). The jitter matters: one
// daemon restart breaks every worker's stream at the same instant, and
// without it the fleet would come back, and back off, in lockstep.
func reconnectDelay(n int, u float64) time.Duration {
	nominal := maxReconnectDelay
	if n < 5 { // 200ms x 2^5 > 5s
		nominal = min(maxReconnectDelay, minReconnectDelay<<n)
	}
	return nominal/2 + time.Duration(u*float64(nominal/2))
}

// watch keeps the cache in step with policyd until ctx ends, reconnecting
// after reconnectDelay when the stream breaks: policyd draining
// (UNAVAILABLE), the watch cut for falling behind (RESOURCE_EXHAUSTED), or
// policyd gone. It subscribes again with the resume token of the last
// message it applied: replicas of a Redis store resume the stream there,
// on whichever replica the connection reaches, with every change since
// and none twice (resumed); else (no token, a bbolt store, a token the
// store no longer can use) the new stream's snapshot replaces the cache. sleep waits and
// draw returns a number in [0, 1); tests pass fakes.
func (b *breakerCache) watch(ctx context.Context, c *Client, sleep func(context.Context, time.Duration) error, draw func() float64) {
	n := 0
	for ctx.Err() == nil {
		if b.follow(ctx, c) {
			n = 0
		}
		b.mu.Lock()
		b.live.Store(false)
		b.updated()
		b.mu.Unlock()
		if sleep(ctx, reconnectDelay(n, draw())) != nil {
			return
		}
		n++
	}
}

// follow runs one stream; it reports whether the stream got as far as a
// complete snapshot.
func (b *breakerCache) follow(ctx context.Context, c *Client) bool {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	b.mu.RLock()
	resume := b.resume
	b.mu.RUnlock()
	stream, err := c.workers.WatchBreakers(ctx, &pb.WatchBreakersRequest{Tenant: b.tenant, ResumeToken: resume})
	if err != nil {
		return false
	}
	fresh := map[cacheKey]cachedBreaker{}
	complete := false
	for {
		msg, err := stream.Recv()
		if status.Code(err) == codes.InvalidArgument && resume != "" {
			// A token this store does not take: the next stream starts
			// from a snapshot.
			b.mu.Lock()
			b.resume = ""
			b.mu.Unlock()
		}
		if err != nil {
			return complete
		}
		switch {
		case msg.GetSnapshotComplete():
			c.flow.snapshot(msg)
			c.chains.snapshot(msg)
			b.mu.Lock()
			if !msg.GetResumed() {
				b.m = fresh
			}
			b.resume = msg.GetResumeToken()
			b.live.Store(true)
			b.updated()
			b.mu.Unlock()
			complete = true
		case !complete:
			k, v := toCached(msg.GetBreaker())
			fresh[k] = v
		default:
			k, v := toCached(msg.GetBreaker())
			b.mu.Lock()
			was, known := b.m[k]
			b.m[k] = v
			b.resume = msg.GetResumeToken()
			b.updated()
			b.mu.Unlock()
			if !known || was.state != v.state {
				c.emit(Event{Kind: EventBreakerChanged, Target: k.target, Breaker: v.state})
			}
		}
	}
}
