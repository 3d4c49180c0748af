package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// breakerWatch follows the demo's breaker over WatchBreakers, as an
// operator's dashboard would, and records its transitions and cool-downs.
type breakerWatch struct {
	t0             time.Time
	tenant, target string
	threshold      int
	pr             *printer
	ready, done    chan struct{}

	mu            sync.Mutex
	err           error
	state         pb.BreakerState
	cooldownUntil time.Time
	transitions   []breakerTransition
	cooldowns     []cooldownStart
}

func newBreakerWatch(t0 time.Time, tenant, target string, threshold int, pr *printer) *breakerWatch {
	return &breakerWatch{t0: t0, tenant: tenant, target: target, threshold: threshold, pr: pr,
		ready: make(chan struct{}), done: make(chan struct{}), state: pb.BreakerState_BREAKER_STATE_CLOSED}
}

// wait returns once the snapshot has arrived; when ctx ends first, its
// error names the last failure of the watch.
func (w *breakerWatch) wait(ctx context.Context) error {
	select {
	case <-w.ready:
		return nil
	case <-w.done:
	case <-ctx.Done():
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return fmt.Errorf("no snapshot yet: %w", w.err)
	}
	return ctx.Err()
}

// run follows the breaker until ctx ends. A stream that breaks after its
// first snapshot (policyd draining, the watch cut for falling behind) is
// opened again after a jittered, capped backoff, as the Go client's watch
// does, and the snapshot that follows counts as changes, so a transition
// made while disconnected is still recorded. A stream that breaks before
// its first snapshot is tried again the same way, quietly: wait (bounded
// by its caller) returns its error if no snapshot comes. A replica of a
// Redis store that cannot read Redis at that moment refuses a watch;
// another try, or another replica, serves it.
func (w *breakerWatch) run(ctx context.Context, rps pb.RetryPolicyServiceClient) {
	defer close(w.done)
	followed := false // a snapshot has arrived, on this stream or an earlier one
	for n := 0; ; n++ {
		complete, err := w.follow(ctx, rps, followed)
		if ctx.Err() != nil {
			return
		}
		if complete {
			n = 0
		}
		wait := reconnectDelay(n, rand.Float64())
		if !followed && !complete {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
		} else {
			followed = true
			w.pr.line(time.Since(w.t0), "lost the breaker watch (%v); reconnecting in %s", err, wait.Round(time.Millisecond))
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
	}
}

// reconnectDelay is the wait before reconnect n (from 0):
// min(5s, 200ms x 2^n), placed in its upper half by u in [0, 1), so the
// watches of many processes that one restart broke do not come back in
// lockstep.
func reconnectDelay(n int, u float64) time.Duration {
	nominal := min(5*time.Second, 200*time.Millisecond<<min(n, 5))
	return nominal/2 + time.Duration(u*float64(nominal/2))
}

// follow runs one stream until it breaks and reports whether its snapshot
// completed. Once followed, the snapshot's states count as changes.
func (w *breakerWatch) follow(ctx context.Context, rps pb.RetryPolicyServiceClient, followed bool) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := rps.WatchBreakers(ctx, &pb.WatchBreakersRequest{Tenant: w.tenant}, grpc.WaitForReady(true))
	if err != nil {
		return false, err
	}
	live := followed
	complete := false
	for {
		msg, err := stream.Recv()
		if err != nil {
			return complete, err
		}
		if msg.GetSnapshotComplete() {
			if !complete && !followed {
				close(w.ready)
			}
			complete, live = true, true
			continue
		}
		b := msg.GetBreaker()
		if b.GetKey().GetTenant() == w.tenant && b.GetKey().GetTarget() == w.target {
			w.apply(b, live)
		}
	}
}

func (w *breakerWatch) apply(b *pb.Breaker, live bool) {
	now := time.Now()
	at := now.Sub(w.t0)
	w.mu.Lock()
	defer w.mu.Unlock()
	st := b.GetState()
	cu := time.Time{}
	if b.GetCooldownUntilTime() != nil {
		cu = b.GetCooldownUntilTime().AsTime()
	}
	if !live {
		w.state = st
		if cu.After(now) {
			w.cooldownUntil = cu
			w.cooldowns = append(w.cooldowns, cooldownStart{At: at.Seconds(), Until: cu.Sub(w.t0).Seconds()})
		}
		return
	}
	if st != w.state {
		t := breakerTransition{At: at.Seconds(), From: stateName(w.state), To: stateName(st)}
		switch st {
		case pb.BreakerState_BREAKER_STATE_OPEN:
			until := b.GetOpenUntilTime().AsTime().Sub(w.t0)
			t.OpenUntil = until.Seconds()
			if w.state == pb.BreakerState_BREAKER_STATE_HALF_OPEN {
				w.pr.line(at, "breaker OPEN again: the probe failed; next probe after %.1fs", until.Seconds())
			} else {
				w.pr.line(at, "breaker OPEN after %d transient failures in a row; workers now fail fast until %.1fs",
					w.threshold, until.Seconds())
			}
		case pb.BreakerState_BREAKER_STATE_HALF_OPEN:
			w.pr.line(at, "breaker HALF_OPEN: policyd lets one probe through, fleet-wide")
		case pb.BreakerState_BREAKER_STATE_CLOSED:
			w.pr.line(at, "breaker CLOSED: the probe succeeded")
		default:
			w.pr.line(at, "breaker %s", stateName(st))
		}
		w.transitions = append(w.transitions, t)
		w.state = st
	}
	switch {
	case !cu.After(now) || !cu.After(w.cooldownUntil):
	case w.cooldownUntil.After(now):
		// A cool-down in force was extended (by another 429).
		w.cooldownUntil = cu
		w.cooldowns[len(w.cooldowns)-1].Until = cu.Sub(w.t0).Seconds()
	default:
		w.cooldownUntil = cu
		w.cooldowns = append(w.cooldowns, cooldownStart{At: at.Seconds(), Until: cu.Sub(w.t0).Seconds()})
		w.pr.line(at, "cool-down: a worker got 429 Retry-After; the whole fleet holds its calls until %.1fs", cu.Sub(w.t0).Seconds())
	}
}

func stateName(s pb.BreakerState) string { return strings.TrimPrefix(s.String(), "BREAKER_STATE_") }
