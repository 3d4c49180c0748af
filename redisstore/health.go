package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// engineBreaker is the Store's breaker around Redis itself, a value type
// driven by the caller's clock: after Threshold consecutive failed calls
// (a timeout, a refused or broken connection: not a Redis error reply,
// which proves the server answered), each sent after the one before it
// failed, the engine is down for Cooldown; then
// one call goes through as a probe, and its success brings the engine up
// again, its failure keeps it down for another Cooldown. Other calls made
// while down fail at once with ErrUnavailable.
//
// It is not sony/gobreaker: gobreaker reads time.Now itself, so its
// cool-down cannot be driven by Options.Clock in tests, and its
// generations and counts are more than this needs. The zero value is up.
//
// Calls out together when Redis stalls (an fsync with appendfsync always
// took up to 53 ms under policybench's report phase on two cores) fail
// together at their timeout, and count as one failure: counted one by
// one, a single stall seen by three concurrent callers brought the engine
// down, and every replica decided alone for a second, dropping the audit
// records it could not hold. After a failure counted, and until a call
// succeeds, the engine is suspect: one call at a time goes to Redis (the
// next failure counted, or the success that ends it), and the others
// fail at once, so a request whose call timed out does not wait a
// timeout again for its next call while the replica is still counting. A
// stopped Redis fails the call let through each time, so the engine goes
// down within Threshold timeouts; a stall that ends lets the calls
// through again at the first answer.
type engineBreaker struct {
	Threshold int
	Cooldown  time.Duration

	failures  int       // consecutive, while up: the engine is suspect while above 0
	counted   time.Time // when the last failure counted was seen
	down      bool      // the engine is considered down
	downUntil time.Time // while down: no call before then
	probing   bool      // while down or suspect: the one call let through is out
}

// allow reports whether a call may go to Redis at now: every call while
// up, one at a time while suspect, and while down one probe per
// cool-down.
func (b *engineBreaker) allow(now time.Time) bool {
	if !b.down && b.failures == 0 {
		return true
	}
	if b.probing || b.down && now.Before(b.downUntil) {
		return false
	}
	b.probing = true
	return true
}

// done records the result at now of a call sent at start; it reports
// whether the engine's state changed (up to down or down to up). A
// failure of a call sent before the last failure counted was seen is of
// the same stall: it changes nothing.
func (b *engineBreaker) done(start, now time.Time, failed bool) bool {
	if !b.down {
		if !failed {
			b.failures, b.probing = 0, false
			return false
		}
		if b.failures > 0 && start.Before(b.counted) {
			return false
		}
		// Counted: the call let through while suspect is back, if it was
		// that one (a call sent after the last failure counted is).
		b.failures, b.counted, b.probing = b.failures+1, now, false
		if b.failures < max(b.Threshold, 1) {
			return false
		}
		b.down, b.downUntil, b.failures = true, now.Add(b.Cooldown), 0
		return true
	}
	if !b.probing {
		return false // a call let through before the engine went down
	}
	b.probing = false
	if failed {
		b.downUntil = now.Add(b.Cooldown)
		return false
	}
	b.down = false
	return true
}

// readDone records the result of a feed's read (the blocking XREAD of the
// changes or event streams) at now, which goes to Redis while down
// without waiting for the cool-down (guard): its success brings the
// engine up, as a probe's would; its failure while down changes nothing.
// While up it counts as any call. It reports whether the engine's state
// changed.
func (b *engineBreaker) readDone(start, now time.Time, failed bool) bool {
	if !b.down {
		return b.done(start, now, failed)
	}
	if failed {
		return false
	}
	b.down, b.probing, b.failures = false, false, 0
	return true
}

// health guards the Store's Redis client with an engineBreaker, as a
// go-redis hook, so that every call of the Store (and of its feeds) is
// refused at once while the engine is down.
type health struct {
	clock func() time.Time
	// changed is called, outside the lock, after each transition.
	changed func(up bool)

	off atomic.Bool // the Store is closed: calls pass unguarded

	mu sync.Mutex
	b  engineBreaker
}

// threshold is the failures in a row that bring the engine down.
func (h *health) threshold() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.b.Threshold
}

// up reports whether the engine is considered up.
func (h *health) up() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.b.down
}

// guarded marks the context of a call the breaker let through. go-redis
// sends the commands that open a new connection (HELLO, CLIENT SETINFO)
// through the client's hooks with the context of the call that needs the
// connection: they are part of that call, not calls of their own. Guarded
// as calls, they were refused while the probe that needed them was out,
// so after a restart of Redis (every connection new) no probe could
// succeed and the engine stayed down.
type guarded struct{}

// feedRead marks the context of a feed's read: the feeds run on their own
// goroutines, no caller waits for them, so while the engine is down they
// go on trying (each after its pause) and the first that Redis answers
// brings the engine up at once. With only the probe, one call per
// DownFor, a replica took up to DownFor after Redis came back to follow
// the changes stream again, and an admin write made through another
// replica reached it that much later.
type feedRead struct{}

// withFeedRead marks ctx as a feed's (see feedRead).
func withFeedRead(ctx context.Context) context.Context {
	return context.WithValue(ctx, feedRead{}, true)
}

// feedGrace is how much longer than its FeedBlock a feed's read may take
// before it counts as failed: a server answers a blocked XREAD at the end
// of its block, later only when it is busy or gone.
const feedGrace = time.Second

// guard runs call when the breaker allows it and records its result; a
// refusal, a timeout or a connection failure is ErrUnavailable wrapping
// the cause. A call made on behalf of a guarded one runs unguarded; a
// feed's read runs while down too (readDone).
func (h *health) guard(ctx context.Context, call func(context.Context) error) error {
	if h.off.Load() || ctx.Value(guarded{}) != nil {
		return call(ctx)
	}
	if err := ctx.Err(); errors.Is(err, context.DeadlineExceeded) {
		// A request's time for the engine ran out before this call (its
		// deadline is shared, Store.bound): not sent, and nothing said of
		// the engine.
		return fmt.Errorf("%w: the request's time for the engine is spent: %w", ErrUnavailable, err)
	}
	read := ctx.Value(feedRead{}) != nil
	h.mu.Lock()
	start := h.clock()
	ok := read || h.b.allow(start)
	h.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: not answering (down after repeated failures, or a call failed and the one let through is out)", ErrUnavailable)
	}
	err := call(context.WithValue(ctx, guarded{}, true))
	failed := engineFailure(ctx, err)
	h.mu.Lock()
	var changed bool
	if read {
		changed = h.b.readDone(start, h.clock(), failed)
	} else {
		changed = h.b.done(start, h.clock(), failed)
	}
	up := !h.b.down
	h.mu.Unlock()
	if changed && h.changed != nil {
		h.changed(up)
	}
	if failed && !errors.Is(err, ErrUnavailable) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// engineFailure reports whether err says the engine did not answer: not
// nil, not redis.Nil, not an error reply, and not a cancellation of the
// caller's own.
func engineFailure(ctx context.Context, err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return false
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return false
	}
	if errors.Is(err, context.Canceled) && ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return false // the caller gave up (the Store closing)
	}
	return true
}

// hook is the go-redis hook that puts every command and pipeline of the
// client through guard. Blocking reads (the feeds' XREAD) count too: a
// server that answers none of them is down.
// Each command or pipeline the guard lets through is counted in trips
// (and timed, when Options.RoundTripObserver is set).
func (h *health) hook(trips *roundTrips) redis.Hook { return healthHook{h, trips} }

type healthHook struct {
	h     *health
	trips *roundTrips
}

func (k healthHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (k healthHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return k.h.guard(ctx, func(ctx context.Context) error {
			start := k.trips.add(cmd)
			err := next(ctx, cmd)
			k.trips.took(start)
			return err
		})
	}
}

// ProcessPipelineHook makes every command of a pipeline that failed
// ErrUnavailable but those Redis answered: an error reply is the
// command's own, and so is a reply on a Cluster from a master that
// answered when another did not (a coalesced round trip, coalesce.go,
// carries the calls of several requests, each to its tenant's master).
// A pipeline the breaker refused was not sent: none of it was answered.
func (k healthHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		sent := false
		err := k.h.guard(ctx, func(ctx context.Context) error {
			sent = true
			start := k.trips.addPipeline(cmds)
			err := next(ctx, cmds)
			k.trips.took(start)
			return err
		})
		if errors.Is(err, ErrUnavailable) {
			for _, c := range cmds {
				var reply redis.Error
				if e := c.Err(); (e == nil && !sent) || (e != nil && !errors.As(e, &reply)) {
					c.SetErr(err)
				}
			}
		}
		return err
	}
}
