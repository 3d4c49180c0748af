package policyclient

import (
	"context"
	"fmt"
	"time"

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
		Call: o.call.pb(), Attempt: uint32(o.attempt), Success: o.success, Failure: o.failure,
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

// flush sends pending in batches; what policyd does not take stays pending,
// up to the queue's size (the oldest beyond that are dropped and counted).
func (o *outcomes) flush(ctx context.Context) error {
	for len(o.pending) > 0 {
		n := min(len(o.pending), o.size)
		sctx, cancel := context.WithTimeout(ctx, 4*o.c.cfg.DecisionTimeout)
		_, err := o.c.workers.ReportOutcome(sctx, &pb.ReportOutcomeRequest{Outcomes: o.pending[:n]})
		cancel()
		if err != nil {
			if extra := len(o.pending) - cap(o.q); extra > 0 {
				o.pending = o.pending[extra:]
				o.c.stats.dropped.Add(uint64(extra))
			}
			return err
		}
		o.c.stats.sent.Add(uint64(n))
		o.c.stats.batches.Add(1)
		o.pending = o.pending[n:]
	}
	o.pending = nil
	return nil
}

// drain sends everything still queued, after run has returned. Outcomes
// policyd could not take before ctx ends are counted as dropped.
func (o *outcomes) drain(ctx context.Context) error {
	o.take()
	for len(o.pending) > 0 {
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
		if sleep(ctx, 50*time.Millisecond) != nil {
			continue
		}
	}
	return nil
}
