package policyclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// outcome is one attempt's result as the worker queues it; the batcher
// turns it into a message, off the worker's path.
type outcome struct {
	call            *callInfo
	attempt         int
	success         bool
	alreadyRecorded bool
	failure         *pb.Failure
	permit          string
	lease           string
	latency         time.Duration
	final           pb.Disposition
	stop            pb.StopReason
	deduplicated    bool   // the idempotency ledger answered the call
	target          string // the attempt's target when not the primary
	// cancelled is when the caller ended the call (its context ended)
	// before the deadline policyd knows: the deadline of its own the final
	// outcome tells.
	cancelled time.Time
}

func (o *outcome) pb() *pb.Outcome {
	m := &pb.Outcome{
		Call: o.call.outcomeRef(o.final, o.cancelled), Attempt: uint32(o.attempt), Success: o.success, Failure: o.failure,
		PermitId: o.permit, LeaseId: o.lease, FinalDisposition: o.final, FinalStopReason: o.stop, AlreadyRecorded: o.alreadyRecorded,
		AttemptTarget: o.target,
	}
	if o.latency > 0 {
		m.Latency = durationpb.New(o.latency)
	}
	if o.deduplicated {
		m.Deduplicated, m.Call.IdempotencyKey = true, o.call.key
	}
	return m
}

// outcomes queues attempt outcomes and sends them to policyd in batches, off
// the worker's path: a full batch or a tick sends; a batch policyd did not
// take is kept and sent again; Close drains what is left.
//
// The queue is a list of batch-sized chunks under a mutex rather than a
// channel: a channel send wakes the batcher for every outcome, which cost a
// worker more than the rest of a successful call; here a worker wakes it
// once per full batch, and chunks are reused, never grown and copied.
type outcomes struct {
	c      *Client
	mu     sync.Mutex
	cur    []outcome          // the chunk being filled
	filled [][]outcome        // full chunks, oldest first
	free   [][]outcome        // emptied chunks, for reuse
	queued int                // outcomes in cur and filled, at most limit
	wake   chan struct{}      // a chunk filled (one signal at a time)
	now    chan chan struct{} // flush requests from workers about to report a failure
	limit  int
	size   int
	every  time.Duration
	// pending are taken from the queue, not yet acknowledged; owned by run,
	// then by drain.
	pending []*pb.Outcome
	// pause and pausedUntil back off sending after a failure; owned like
	// pending.
	pause       time.Duration
	pausedUntil time.Time
}

func newOutcomes(c *Client, cfg Config) *outcomes {
	return &outcomes{c: c, wake: make(chan struct{}, 1), now: make(chan chan struct{}),
		limit: cfg.QueueSize, size: cfg.BatchSize, every: cfg.FlushInterval}
}

// add queues o without blocking; an outcome that finds the queue full is
// dropped and counted.
func (o *outcomes) add(out outcome) {
	o.mu.Lock()
	if o.queued >= o.limit {
		o.mu.Unlock()
		o.c.stats.dropped.Add(1)
		return
	}
	if o.cur == nil {
		if n := len(o.free); n > 0 {
			o.cur, o.free = o.free[n-1], o.free[:n-1]
		} else {
			o.cur = make([]outcome, 0, o.size)
		}
	}
	o.cur = append(o.cur, out)
	o.queued++
	full := len(o.cur) == o.size
	if full {
		o.filled = append(o.filled, o.cur)
		o.cur = nil
	}
	o.mu.Unlock()
	if full {
		select {
		case o.wake <- struct{}{}:
		default: // already signalled
		}
	}
}

// kick asks the batcher to send what is queued soon, without waiting: an
// outcome that returns a concurrency lease should not sit out a tick.
func (o *outcomes) kick() {
	select {
	case o.wake <- struct{}{}:
	default: // already signalled
	}
}

// run batches until ctx ends. A batch in flight when ctx ends is let
// finish, bounded by its own timeout, and no other is sent after it:
// cancelled, it would fail here after policyd had applied it, and drain
// would send it again (its successes counted twice, its leases released
// twice).
func (o *outcomes) run(ctx context.Context) {
	tick := time.NewTicker(o.every)
	defer tick.Stop()
	send := context.WithoutCancel(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-o.wake:
		case <-tick.C:
		case done := <-o.now:
			o.take()
			o.flush(send, ctx.Done())
			close(done)
			continue
		}
		o.take()
		o.flush(send, ctx.Done())
	}
}

// take moves everything queued so far into pending.
func (o *outcomes) take() {
	o.mu.Lock()
	chunks := o.filled
	if len(o.cur) > 0 {
		chunks = append(chunks, o.cur)
		o.cur = nil
	}
	o.filled, o.queued = nil, 0
	o.mu.Unlock()
	for _, chunk := range chunks {
		for i := range chunk {
			o.pending = append(o.pending, chunk[i].pb())
		}
		clear(chunk) // pending holds what the messages need
	}
	o.mu.Lock()
	for _, chunk := range chunks {
		if len(o.free) < 4 { // enough for the bursts between two takes
			o.free = append(o.free, chunk[:0])
		}
	}
	o.mu.Unlock()
}

// flushNow asks the batcher to send what is queued and waits until it has,
// or ctx ends. A worker calls it before reporting a failure, so the
// successes that came before the failure reach the breaker before it does
// (a consecutive-failure breaker must not count failures "in a row" that
// had successes between them).
func (o *outcomes) flushNow(ctx context.Context) {
	done := make(chan struct{})
	select {
	case o.now <- done:
	case <-ctx.Done():
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// flush sends pending in batches. A batch policyd cannot take now
// (unreachable, slow, shedding) stays pending, up to the queue's size (the
// oldest beyond that are dropped and counted), and sending pauses with
// capped exponential backoff, so a fleet cut off from policyd does not
// storm it with reports. A batch policyd refuses for good (a bad outcome)
// is split until the refused outcomes are found and dropped, so one bad
// outcome never blocks the others. Once quit is closed no further batch is
// sent (what is left stays pending for drain).
func (o *outcomes) flush(ctx context.Context, quit <-chan struct{}) error {
	if len(o.pending) > 0 && o.c.cfg.Now().Before(o.pausedUntil) {
		return errPaused
	}
	for len(o.pending) > 0 {
		select {
		case <-quit:
			return nil
		default:
		}
		n := min(len(o.pending), o.size)
		err := o.send(ctx, o.pending[:n])
		if err != nil && !permanent(err) {
			if extra := len(o.pending) - o.limit; extra > 0 {
				o.pending = o.pending[extra:]
				o.c.stats.dropped.Add(uint64(extra))
			}
			o.pause = min(max(2*o.pause, 100*time.Millisecond), 5*time.Second)
			o.pausedUntil = o.c.cfg.Now().Add(o.pause)
			return err
		}
		o.pending = o.pending[n:]
	}
	o.pending = nil
	o.pause = 0
	return nil
}

// errPaused is flush's answer while sending is backed off.
var errPaused = errors.New("policyclient: reporting paused after a failure")

// send reports batch; when policyd refuses it for good, it bisects the batch
// and drops (and counts) only the outcomes refused on their own. It returns
// an error only for a failure that may pass (the batch stays pending).
func (o *outcomes) send(ctx context.Context, batch []*pb.Outcome) error {
	sctx, cancel := context.WithTimeout(ctx, 4*o.c.cfg.DecisionTimeout)
	resp, err := o.c.workers.ReportOutcome(sctx, &pb.ReportOutcomeRequest{Outcomes: batch})
	cancel()
	switch {
	case err == nil:
		o.c.flow.reported(batch, resp)
		o.c.chains.reported(batch, resp)
		o.c.stats.sent.Add(uint64(len(batch)))
		o.c.stats.batches.Add(1)
		return nil
	case !permanent(err):
		return err
	case len(batch) == 1:
		o.c.stats.dropped.Add(1)
		o.c.cfg.Logger.Error("policyd refused an outcome; dropped", "call_id", batch[0].GetCall().GetCallId(), "err", err)
		return nil
	}
	half := len(batch) / 2
	if err := o.send(ctx, batch[:half]); err != nil {
		return err
	}
	return o.send(ctx, batch[half:])
}

// permanent reports whether policyd refused a report for good: sending the
// same outcomes again cannot succeed.
func permanent(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.PermissionDenied, codes.FailedPrecondition, codes.Unauthenticated:
		return true
	}
	return false
}

// drain sends everything still queued, after run has returned. Outcomes
// policyd could not take before ctx ends are counted as dropped.
func (o *outcomes) drain(ctx context.Context) error {
	o.take()
	for len(o.pending) > 0 {
		o.pausedUntil = time.Time{} // closing: try now
		err := o.flush(ctx, nil)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			lost := len(o.pending)
			o.c.stats.dropped.Add(uint64(lost))
			o.pending = nil
			return fmt.Errorf("policyclient: %d outcomes not reported: %w", lost, err)
		}
		if Sleep(ctx, 50*time.Millisecond) != nil {
			continue
		}
	}
	return nil
}
