package redisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// coalescer sends the library calls of concurrent requests together, as a
// group commit does: a call made while fewer than coalescedTrips round
// trips of the coalescer are in flight goes out at once, with the calls of
// the requests this replica already has ready to run (below), alone when
// there are none (no wait is added at low load); the calls made while that
// many are in flight wait, and go out together in the next round trip as
// soon as one of those ends, one pipeline (on a Cluster, go-redis's
// pipeline splits by slot and sends each master its part in parallel).
// Under load a replica then makes a round trip per batch of calls instead
// of one per call: one write and one read on both sides for the whole
// batch. On a Cluster the queue is one for every master: a call waits for
// a round trip in flight also when that one went to another master.
//
// Before it sends, a call that goes out at once yields its processor
// (runtime.Gosched) to the goroutines ready to run, again while a yield
// brought new calls, at most gatherYields times: requests read from the
// same connection, whose handlers are runnable but have not reached their
// call yet, reach it during the yield and go in the same round trip
// instead of each in one of its own. A yield with nothing else to run
// returns at once. Each round trip costs the replica and Redis a write, a
// read and a wake-up of their own; with a core or less a replica (three
// on two cores, policybench replicas-sweep) the yield took the round trips
// per NextDelay from 0.76 to 0.43 at 16 callers and from 0.26 to 0.14 at
// 64, and NextDelay's throughput at 64 callers up by a sixth.
//
// No goroutine of its own: a caller that finds a round trip free leads it;
// when its round trip ends it hands the lead to the first call waiting
// (leader and follower), which takes every call queued so far and sends
// them, then hands on in turn. A caller waits for its reply or
// its own context, whichever comes first, so that each call stays bounded
// by its deadline (Options.Timeout) from when it asked: a call whose
// deadline passes while queued leaves the queue, is never sent, and gets
// ErrUnavailable as a timed-out call does; a pipeline is bounded by the
// earliest deadline of its calls, so none of them waits past its own. Each
// call keeps its own reply or error reply (one NOTFOUND fails no other).
// The round trips go through the client's hooks as any command or
// pipeline: the engine breaker (health.go) guards each round trip and
// counts a failed one once, and the round-trip metric (roundtrips.go)
// counts a coalesced one once, as "pipeline" and its first call.
//
// It is not go-redis's AutoPipeliner (v9.23, EXPERIMENTAL), which batches
// the same way but breaks two of these guarantees: a command queued there
// runs on the pipeliner's own long-lived context, so the caller's deadline
// bounds neither its wait in the queue nor its round trip (only the
// connections' ReadTimeout and WriteTimeout would, which are the whole
// client's, the feeds' blocking reads included, and count per read and
// write, not from when the caller asked), and a command whose caller has
// given up is still sent. It also brings flusher goroutines and thousands
// of lines of its own for a queue this needs a few dozen for.
//
// It is safe for concurrent use.
type coalescer struct {
	c    redis.UniversalClient
	base context.Context // the Store's: a pipeline's context derives from it
	most int             // the most round trips in flight; 0: coalescedTrips

	// yield is runtime.Gosched; tests replace it to make a call ready
	// during the yield of the one going out.
	yield func()

	mu        sync.Mutex
	trips     int       // round trips in flight (or their leaders handing on)
	gathering bool      // a call going out is yielding: calls made now join it
	queue     []*waiter // the calls waiting for the next round trip, in order
}

// gatherYields is the most times a call going out yields for the calls of
// ready requests to join it: each yield that brought new calls is followed
// by another, since a request's handler may make the next one ready (a
// transport read), and the bound keeps a steady stream of them from
// holding the round trip back.
const gatherYields = 4

// coalescedTrips is how many round trips of a coalescer may be in flight
// at once. One would batch the most, but it makes a replica's calls wait
// for each other: at 16 callers over three replicas on two cores a
// round trip took about 0.8 ms, nearly all of it waiting for Redis, then
// the replica, to be scheduled, while the machine had CPU to spare, and
// every call queued behind it waited that long again. With two, the next
// batch goes out while the first is still answered, and under load both
// still carry every call queued meanwhile.
const coalescedTrips = 2

// waiter is one call waiting in a coalescer's queue.
type waiter struct {
	ctx   context.Context
	cmd   redis.Cmder
	wake  chan struct{} // one signal: the waiter leads, or its reply is in
	state waitState     // under the coalescer's mu
}

// waitState is where a waiter's call is.
type waitState int

const (
	waitQueued  waitState = iota // in the queue
	waitLeading                  // first in the queue, told to lead the next round trip
	waitSent                     // taken into a round trip
	waitDropped                  // taken, not sent: its context had ended
)

// do sends cmd, alone or with the calls of other callers, and returns nil
// once cmd holds its reply (or the error of its round trip, as the hooks
// set it); a non-nil error means cmd was not answered for this caller and
// must not be read: ErrUnavailable wrapping the deadline that passed, or
// the context's cancellation.
func (q *coalescer) do(ctx context.Context, cmd redis.Cmder) error {
	if err := ctx.Err(); err != nil {
		return callEnded(err)
	}
	q.mu.Lock()
	if q.trips < q.maxTrips() && !q.gathering {
		q.trips++
		if q.gather() {
			return q.lead(&waiter{ctx: ctx, cmd: cmd, state: waitLeading})
		}
		_ = q.c.Process(ctx, cmd) // the hooks set cmd's error
		q.handOn()
		return nil
	}
	w := &waiter{ctx: ctx, cmd: cmd, wake: make(chan struct{}, 1)}
	q.queue = append(q.queue, w)
	q.mu.Unlock()
	select {
	case <-w.wake:
	case <-ctx.Done():
		q.mu.Lock()
		switch w.state {
		case waitQueued:
			q.remove(w)
			q.mu.Unlock()
			return callEnded(ctx.Err())
		case waitLeading:
			// Told to lead as its context ended (out of the queue
			// already): the lead goes on to the next call waiting.
			q.mu.Unlock()
			q.handOn()
			return callEnded(ctx.Err())
		}
		q.mu.Unlock()
		select {
		case <-w.wake: // sent, and its reply came in as the context ended
			return nil
		default:
			return callEnded(ctx.Err()) // in flight: the round trip goes on without this caller
		}
	}
	q.mu.Lock()
	lead := w.state == waitLeading
	q.mu.Unlock()
	if lead {
		return q.lead(w)
	}
	return nil // sent: its reply is in
}

// gather yields for the calls of ready requests to queue behind the one
// going out (q.mu held on entry, released on return; the round trip
// counted already) and reports whether any did: that call then leads them.
func (q *coalescer) gather() bool {
	q.gathering = true
	for range gatherYields {
		n := len(q.queue)
		q.mu.Unlock()
		if q.yield != nil {
			q.yield()
		} else {
			runtime.Gosched()
		}
		q.mu.Lock()
		if len(q.queue) == n {
			break
		}
	}
	q.gathering = false
	queued := len(q.queue) > 0
	q.mu.Unlock()
	return queued
}

// lead is do for w, told to lead (and out of the queue already): it sends
// itself and every call queued, wakes each with its reply, and hands on.
func (q *coalescer) lead(w *waiter) error {
	q.mu.Lock()
	send := make([]*waiter, 0, 1+len(q.queue))
	var deadline time.Time
	take := func(b *waiter) {
		if b.ctx.Err() != nil {
			b.state = waitDropped // its caller returns on its own context
			return
		}
		b.state = waitSent
		send = append(send, b)
		if d, ok := b.ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
			deadline = d
		}
	}
	take(w)
	for _, b := range q.queue {
		take(b)
	}
	clear(q.queue)
	q.queue = q.queue[:0]
	q.mu.Unlock()
	switch len(send) {
	case 0:
	case 1:
		_ = q.c.Process(send[0].ctx, send[0].cmd)
	default:
		ctx, cancel := q.base, context.CancelFunc(func() {})
		if !deadline.IsZero() {
			ctx, cancel = context.WithDeadline(q.base, deadline)
		}
		p := q.c.Pipeline()
		for _, b := range send {
			_ = p.Process(ctx, b.cmd)
		}
		_, _ = p.Exec(ctx) // each call's error is on its command
		cancel()
	}
	q.handOn()
	for _, b := range send {
		if b != w {
			b.wake <- struct{}{}
		}
	}
	if w.state == waitDropped { // written by this goroutine, above
		return callEnded(w.ctx.Err())
	}
	return nil
}

// handOn ends a round trip: the first call waiting leads the next one,
// taken out of the queue at once so that another round trip ending
// meanwhile hands its place to the next call (or gives it up), or the
// place is free again.
func (q *coalescer) handOn() {
	q.mu.Lock()
	if len(q.queue) == 0 {
		q.trips--
		q.mu.Unlock()
		return
	}
	next := q.queue[0]
	q.queue[0] = nil
	q.queue = q.queue[1:]
	next.state = waitLeading
	q.mu.Unlock()
	next.wake <- struct{}{}
}

// remove takes w out of the queue; q.mu is held.
func (q *coalescer) remove(w *waiter) {
	if i := slices.Index(q.queue, w); i >= 0 {
		q.queue = slices.Delete(q.queue, i, i+1)
	}
}

// maxTrips is the most round trips q has in flight at once.
func (q *coalescer) maxTrips() int {
	if q.most > 0 {
		return q.most
	}
	return coalescedTrips
}

// queued is the number of calls waiting for the next round trip.
func (q *coalescer) queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

// callEnded is the error of a call whose context ended before its reply:
// ErrUnavailable for a deadline, as the engine breaker's guard makes of a
// call that timed out; the cancellation itself otherwise (the caller gave
// up, not the engine).
func callEnded(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// fcallCmd is the command FCALL (FCALL_RO when ro) of function fn on keys
// with the clock argument now and args, as go-redis's FCall builds it
// (the arguments copied once, into the command's own slice).
func fcallCmd(ctx context.Context, ro bool, fn string, keys []string, now string, args []any) *redis.Cmd {
	name := "fcall"
	if ro {
		name = "fcall_ro"
	}
	a := make([]any, 0, 4+len(keys)+len(args))
	a = append(a, name, fn, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, now)
	cmd := redis.NewCmd(ctx, append(a, args...)...)
	if len(keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	return cmd
}
