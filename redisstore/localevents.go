package redisstore

import "github.com/policyd/policyd/policy"

// A breaker's local copy (degraded mode, degraded.go) that changes state
// while the engine does not answer is this replica's to tell its own
// WatchBreakers subscribers of: a worker whose client answers Admit from
// its WatchBreakers cache (the Go and Python clients) would otherwise go
// on sending first attempts to an upstream the replica now refuses. The
// change goes out as an event whose snapshot is flagged Degraded and
// that carries the subscription's resume token unchanged: it is on no
// stream, so a subscription resumed on another replica, which has copies
// of its own, does not replay it. When the engine answers again, every
// breaker whose copy changed is told again as this replica caches the
// engine's state, unflagged; the stream's entries missed meanwhile
// follow as usual.

// localEventsBuffer bounds the local changes waiting for localEvents.
const localEventsBuffer = 1024

// tell queues snap, a local change, for the replica's subscribers. It
// never blocks (it is called under the degraded mode's lock): a change
// that does not fit is dropped and logged.
func (s *Store) tell(snap policy.BreakerSnapshot) {
	select {
	case s.local <- snap:
	default:
		s.log.Warn("redisstore: local breaker change not told to subscribers: too many waiting",
			"tenant", snap.Key.Tenant, "target", snap.Key.Target, "state", snap.State.String())
	}
}

// localEvents publishes the changes tell queued, in order, to the feed of
// each one's tenant (a tenant's subscriptions and those to every tenant
// are on it; target-scoped breakers are on the feed of tenant ""), until
// the store closes.
func (s *Store) localEvents() {
	defer s.wg.Done()
	for {
		select {
		case <-s.ctx.Done():
			return
		case snap := <-s.local:
			s.mu.RLock()
			f := s.feeds[snap.Key.Tenant]
			s.mu.RUnlock()
			if f != nil {
				f.publish(entry{ev: policy.BreakerEvent{Snapshot: snap}, stream: snap.Key.Tenant, local: true})
			}
		}
	}
}

// toldAgain tells the breakers of keys, whose local copies changed while
// the engine was down, as this replica caches the engine's state (a
// breaker it never had from the engine is CLOSED there).
func (s *Store) toldAgain(keys []policy.BreakerKey) {
	for _, k := range keys {
		snap := policy.BreakerSnapshot{Key: k, State: policy.BreakerClosed}
		if st, ok := s.cachedState(k); ok {
			snap = st.snapshot(k)
		}
		s.tell(snap)
	}
}
