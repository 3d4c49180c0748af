package server

import (
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// workers is RetryPolicyService as Server registers it: the decisions, and
// breaker watches that cut a client that falls behind.
type workers struct {
	*Decisions
	watch *watcher
}

// WatchBreakers streams the current breaker states, then every change,
// until the client goes away; see watcher.serve.
func (w workers) WatchBreakers(req *pb.WatchBreakersRequest, stream grpc.ServerStreamingServer[pb.WatchBreakersResponse]) error {
	return w.watch.serve(req, stream)
}

// watcher serves breaker watches from the store's subscriptions.
type watcher struct {
	store    Breakers
	policies Policies  // which targets have a ceiling, told with the snapshot
	flow     flowStore // the ceiling of a breaker under one, told on its messages
	// buffer is the number of changes that may queue behind a client that
	// does not read; the snapshot never counts against it.
	buffer int
	log    *slog.Logger
}

// resumer is a Breakers store whose subscriptions to one tenant resume
// from a position (policy.BreakerEvent.Resume) on any replica of the same
// engine, as redisstore's do. A store without it (breakerstore: one
// daemon) gives no tokens, and a watch sent one starts from a snapshot.
type resumer interface {
	SubscribeFrom(tenant, from string, buffer int) (events <-chan policy.BreakerEvent, cancel func(), err error)
}

// errFellBehind ends a watch whose client let more than the buffer of
// changes queue up, or whose subscription the store dropped.
var errFellBehind = status.Error(codes.ResourceExhausted, "breaker watch fell behind; reconnect for a fresh snapshot")

// serve streams the snapshot and the changes of req's tenant. It reads the
// store's subscription at once into a queue of at most w.buffer changes,
// which a second goroutine sends, so a client that stops reading (and so
// blocks Send in grpc-go's flow control) is noticed: when the queue
// overflows the watch ends with RESOURCE_EXHAUSTED, its subscription is
// cancelled and the queue is garbage. The sending goroutine ends with the
// stream. The server's drain ends the stream with UNAVAILABLE
// (Server.drainStream).
func (w *watcher) serve(req *pb.WatchBreakersRequest, stream grpc.ServerStreamingServer[pb.WatchBreakersResponse]) error {
	if err := checkName("tenant", req.GetTenant(), maxTenantLen, false); err != nil {
		return err
	}
	events, cancel, err := w.subscribe(req)
	if err != nil {
		return storeError(stream.Context(), w.log, "breakers", err)
	}
	defer cancel()
	ctx := stream.Context()
	out := make(chan policy.BreakerEvent)
	sent := make(chan error, 1)
	go func() {
		for {
			select {
			case ev := <-out:
				msg := w.message(ev)
				if ev.SnapshotDone {
					w.flowTargets(req.GetTenant(), msg)
				}
				if err := stream.Send(msg); err != nil {
					sent <- err
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	// The queue holds events as values, converted only when sent: a
	// fraction of the memory of the messages with their nested parts.
	var queue []policy.BreakerEvent
	changes := 0 // queued events that are changes, not the snapshot
	for {
		var next chan<- policy.BreakerEvent
		var head policy.BreakerEvent
		if len(queue) > 0 {
			next, head = out, queue[0]
		}
		select {
		case next <- head:
			if isChange(head) {
				changes--
			}
			queue = queue[1:]
		case ev, ok := <-events:
			if !ok {
				return errFellBehind
			}
			if isChange(ev) {
				if changes == w.buffer {
					return errFellBehind
				}
				changes++
			}
			queue = append(queue, ev)
		case err := <-sent:
			return err
		case <-ctx.Done():
			return nil
		}
	}
}

// subscribe subscribes to req's tenant, from its resume token when the
// store resumes. The store's own buffer only has to cover the moments
// serve's goroutine is not scheduled (the queue there is what a slow
// client fills), and it bounds the changes a resumption replays, which
// the queue must hold.
func (w *watcher) subscribe(req *pb.WatchBreakersRequest) (<-chan policy.BreakerEvent, func(), error) {
	if r, ok := w.store.(resumer); ok {
		return r.SubscribeFrom(req.GetTenant(), req.GetResumeToken(), min(w.buffer, resumeReplay))
	}
	events, cancel := w.store.Subscribe(req.GetTenant(), 0)
	return events, cancel, nil
}

// resumeReplay is the most changes a resumed watch replays; past it the
// watch starts from a snapshot instead.
const resumeReplay = 256

// message is the message of ev: a breaker carries its ceiling's state as
// of the moment it is sent.
func (w *watcher) message(ev policy.BreakerEvent) *pb.WatchBreakersResponse {
	if ev.SnapshotDone {
		return &pb.WatchBreakersResponse{SnapshotComplete: true, ResumeToken: ev.Resume, Resumed: ev.Resumed}
	}
	return &pb.WatchBreakersResponse{Breaker: breakerWithPool(w.flow, ev.Snapshot), Snapshot: ev.Initial, ResumeToken: ev.Resume}
}

func isChange(ev policy.BreakerEvent) bool { return !ev.Initial && !ev.SnapshotDone }
