package policyclient

import (
	"context"
	"errors"
	"fmt"
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
	latency         time.Duration
	final           pb.Disposition
	stop            pb.StopReason
}

func (o *outcome) pb() *pb.Outcome {
	m := &pb.Outcome{
		Call: o.call.outcomeRef(), Attempt: uint32(o.attempt), Success: o.success, Failure: o.failure,
		PermitId: o.permit, FinalDisposition: o.final, FinalStopReason: o.stop, AlreadyRecorded: o.alreadyRecorded,
	}
	if o.latency > 0 {
		m.Latency = durationpb.New(o.latency)
	}
	return m
}

// outcomes queues attempt outcomes and sends them to policyd in batches, off
// the worker's path: a full batch or a tick sends; a batch policyd did not
// take is kept and sent again; Close drains what is left.
type outcomes struct {
	c       *Client
	q       chan outcome
	now     chan chan struct{} // flush requests from workers about to report a failure
	size    int
	every   time.Duration
	pending []*pb.Outcome // taken from q, not yet acknowledged; owned by run, then by drain
	// pause and pausedUntil back off sending after a failure; owned like
	// pending.
	pause       time.Duration
	pausedUntil time.Time
}

func newOutcomes(c *Client, cfg Config) *outcomes {
	return &outcomes{c: c, q: make(chan outcome, cfg.QueueSize), now: make(chan chan struct{}), size: cfg.BatchSize, every: cfg.FlushInterval}
}

// add queues o without blocking; an outcome that finds the queue full is
// dropped and counted.
func (o *outcomes) add(out outcome) {
	select {
	case o.q <- out:
	default:
		o.c.stats.dropped.Add(1)
	}
}

// run batches until ctx ends.
func (o *outcomes) run(ctx context.Context) {
	tick := time.NewTicker(o.every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case out := <-o.q:
			o.pending = append(o.pending, out.pb())
			if len(o.pending) >= o.size {
				o.flush(ctx)
			}
		case <-tick.C:
			o.flush(ctx)
		case done := <-o.now:
			o.take()
			o.flush(ctx)
			close(done)
		}
	}
}

// take moves everything queued so far into pending.
func (o *outcomes) take() {
	for {
		select {
		case out := <-o.q:
			o.pending = append(o.pending, out.pb())
		default:
			return
		}
	}
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
// outcome never blocks the others.
func (o *outcomes) flush(ctx context.Context) error {
	if len(o.pending) > 0 && o.c.cfg.Now().Before(o.pausedUntil) {
		return errPaused
	}
	for len(o.pending) > 0 {
		n := min(len(o.pending), o.size)
		err := o.send(ctx, o.pending[:n])
		if err != nil && !permanent(err) {
			if extra := len(o.pending) - cap(o.q); extra > 0 {
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
	_, err := o.c.workers.ReportOutcome(sctx, &pb.ReportOutcomeRequest{Outcomes: batch})
	cancel()
	switch {
	case err == nil:
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
		err := o.flush(ctx)
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
