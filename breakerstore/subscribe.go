package breakerstore

import (
	"slices"
	"sync"

	"github.com/policyd/policyd/policy"
)

// DefaultSubscriptionBuffer is the number of changes that may queue behind a
// subscriber when Subscribe is given buffer <= 0.
const DefaultSubscriptionBuffer = 64

type subscriber struct {
	tenant string // "" matches every breaker

	mu     sync.Mutex
	ch     chan policy.BreakerEvent
	closed bool
}

// wants reports whether the subscriber follows k: its tenant's breakers and
// the target-scoped ones every tenant shares.
func (sub *subscriber) wants(k policy.BreakerKey) bool {
	return sub.tenant == "" || k.Tenant == sub.tenant || k.Tenant == ""
}

// send delivers ev without blocking, closing the subscriber's channel when
// it is full; it reports whether the subscriber is still live.
func (sub *subscriber) send(ev policy.BreakerEvent) bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sub.closed {
		return false
	}
	select {
	case sub.ch <- ev:
		return true
	default:
		sub.closed = true
		close(sub.ch)
		return false
	}
}

func (sub *subscriber) close() {
	sub.mu.Lock()
	if !sub.closed {
		sub.closed = true
		close(sub.ch)
	}
	sub.mu.Unlock()
}

func (sub *subscriber) isClosed() bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.closed
}

// Subscribe streams the states of tenant's breakers: every breaker when
// tenant is "", else the tenant's and the target-scoped ones it shares. The
// channel first yields one Initial event per breaker (its current state,
// sorted by key), then one event with SnapshotDone set and no snapshot, then
// a change event for every state transition, force and reset, and whenever a
// pushback cool-down starts. The snapshot and the changes are consistent: no
// change made after a breaker's Initial event is lost and no older state
// follows it (the first change may repeat the Initial state).
//
// buffer is the number of changes that may queue behind a slow reader
// (default DefaultSubscriptionBuffer); the snapshot never counts against it.
// A reader that falls further behind is dropped at once: its channel is
// closed, the store forgets it (so what it left queued is freed with the
// reader's last reference), and it subscribes again for a fresh snapshot. cancel ends the subscription and
// closes the channel; it may be called more than once. Store.Close closes
// every channel. Subscribe is safe for concurrent use; on a closed store the
// channel is closed at once.
//
// Subscriptions do not resume: the events carry no position
// (policy.BreakerEvent.Resume is empty), so a WatchBreakers of a daemon on
// this store gets no resume token and a reconnect takes a fresh snapshot.
// One daemon holds the file: there is no other replica to resume on, and
// after the daemon's restart its snapshot is the whole state.
func (s *Store) Subscribe(tenant string, buffer int) (events <-chan policy.BreakerEvent, cancel func()) {
	if buffer <= 0 {
		buffer = DefaultSubscriptionBuffer
	}
	sub := &subscriber{tenant: tenant}
	if s.closed.Load() {
		sub.ch = make(chan policy.BreakerEvent)
		sub.close()
		return sub.ch, func() {}
	}
	s.subs.mu.Lock()
	defer s.subs.mu.Unlock()
	var initial []policy.BreakerSnapshot
	for _, b := range s.breakers.values() {
		if sub.wants(b.key) {
			initial = append(initial, *b.pub.Load())
		}
	}
	slices.SortFunc(initial, func(a, b policy.BreakerSnapshot) int { return keyCompare(a.Key, b.Key) })
	sub.ch = make(chan policy.BreakerEvent, len(initial)+1+buffer)
	for _, snap := range initial {
		sub.ch <- policy.BreakerEvent{Snapshot: snap, Initial: true}
	}
	sub.ch <- policy.BreakerEvent{SnapshotDone: true}
	s.subs.list = append(s.subs.list, sub)
	return sub.ch, func() { s.unsubscribe(sub) }
}

// unsubscribe closes sub's channel and forgets it.
func (s *Store) unsubscribe(sub *subscriber) {
	sub.close()
	s.subs.mu.Lock()
	s.subs.list = slices.DeleteFunc(s.subs.list, func(x *subscriber) bool { return x == sub })
	s.subs.mu.Unlock()
}

// publish records b's state as its latest change and sends it to the
// subscribers that follow b. b.mu must be held, which orders the changes of
// one breaker; Subscribe reads pub under subs.mu, so a change is either in a
// new subscriber's snapshot or delivered after it.
func (b *breaker) publish(s *Store, now int64) {
	snap := b.snapshot(now)
	b.pub.Store(&snap)
	dropped := false
	s.subs.mu.RLock()
	for _, sub := range s.subs.list {
		if sub.wants(snap.Key) && !sub.send(policy.BreakerEvent{Snapshot: snap}) {
			dropped = true
		}
	}
	s.subs.mu.RUnlock()
	if dropped {
		s.subs.mu.Lock()
		s.subs.list = slices.DeleteFunc(s.subs.list, (*subscriber).isClosed)
		s.subs.mu.Unlock()
	}
}

// Subscribers returns the number of live subscriptions: those neither
// cancelled nor dropped for falling behind. It is safe for concurrent use.
func (s *Store) Subscribers() int {
	s.subs.mu.RLock()
	defer s.subs.mu.RUnlock()
	return len(s.subs.list)
}

// closeSubs closes every subscription; used by Store.Close.
func (s *Store) closeSubs() {
	s.subs.mu.Lock()
	defer s.subs.mu.Unlock()
	for _, sub := range s.subs.list {
		sub.close()
	}
	s.subs.list = nil
}
