package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/policy"
)

// feed is one tenant's end of the event stream ({T}:events): its
// subscribers. The stream itself is read by the tenant's feedGroup.
type feed struct {
	tenant string
	mu     sync.Mutex
	subs   map[*sub]struct{}
}

// feedGroup reads the event streams of several tenants with one blocking
// XREAD, from the last id seen of each, in order: every entry updates the
// cache and goes to the tenant's subscribers. A read that fails is retried
// from the same ids, so a reconnect misses nothing the streams still hold.
// On a standalone server one group reads every tenant; on a Cluster, where
// one command's keys must share a slot, there is a group per slot in use.
// Either way a replica holds one connection per group, not per tenant.
//
// A tenant followed while the group's read blocks must not wait for that
// read to end (FeedBlock) to be read: the read also waits on the group's
// wake-up stream, this replica's own ({T}:wake:R, T the tenant that made
// the group, so on a Cluster it shares the group's slot), and follow
// adds an entry to it. The read then returns at once and the next one
// takes the new tenant. This is what CLIENT UNBLOCK is for, but that
// needs the read's own connection and its client id (a Cluster client
// routes each read anew) and an ACL user allowed @admin; an entry on a
// stream of the group's needs neither.
type feedGroup struct {
	mu      sync.Mutex
	last    map[string]string // tenant -> the last entry id seen
	feeds   map[string]*feed
	started bool
	wake    string // the group's wake-up stream
}

// follow returns the feed of tenant, starting to read its stream (at its
// current end) the first time: every transition after follow returns is
// seen. A tenant new to the whole fleet is announced on the changes
// stream, so replicas with a subscription to every tenant follow it too.
func (s *Store) follow(tenant string) (*feed, error) {
	return s.followFrom(tenant, "")
}

// followFrom is follow, reading the stream from the entry after id from
// instead of its end when from is set ("0-0": all of it).
func (s *Store) followFrom(tenant, from string) (*feed, error) {
	s.mu.RLock()
	f := s.feeds[tenant]
	s.mu.RUnlock()
	if f != nil {
		return f, nil
	}
	ctx, cancel := s.call()
	defer cancel()
	added, err := s.c.SAdd(ctx, keyTenants, tenant).Result()
	if err != nil {
		return nil, err
	}
	if added == 1 {
		if err := s.c.XAdd(ctx, &redis.XAddArgs{Stream: keyChanges, MaxLen: 10000, Approx: true,
			Values: []any{"kind", changeTenant, "tenant", tenant, "target", ""}}).Err(); err != nil {
			return nil, err
		}
	}
	last := from
	if last == "" {
		last = "0-0"
		msgs, err := s.c.XRevRangeN(ctx, keyEvents(tenant), "+", "-", 1).Result()
		if err != nil {
			return nil, err
		}
		if len(msgs) == 1 {
			last = msgs[0].ID
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f = s.feeds[tenant]; f != nil {
		return f, nil
	}
	f = &feed{tenant: tenant, subs: map[*sub]struct{}{}}
	for sb := range s.allSubs {
		f.subs[sb] = struct{}{}
	}
	s.feeds[tenant] = f
	gk := 0
	if _, ok := s.c.(*redis.ClusterClient); ok {
		gk = slotOf(tenant)
	}
	g := s.groups[gk]
	if g == nil {
		g = &feedGroup{last: map[string]string{}, feeds: map[string]*feed{}, wake: keyWake(tenant, s.id)}
		s.groups[gk] = g
	}
	g.mu.Lock()
	g.last[tenant], g.feeds[tenant] = last, f
	start := !g.started
	g.started = true
	g.mu.Unlock()
	s.wg.Add(1)
	if start {
		go s.root.run(g) // not a request's view: the feed outlives its deadline
	} else {
		go s.root.wakeFeed(g) // in the background: the request does not wait for it
	}
	return f, nil
}

// wakeTTL is how long a group's wake-up stream outlives its last entry:
// a replica that died leaves it behind that long.
const wakeTTL = time.Hour

// wakeFeed ends g's blocking read, if one is in flight, by an entry on
// g's wake-up stream (see feedGroup); the next read starts at once. Not
// answered, the read ends at FeedBlock as before.
func (s *Store) wakeFeed(g *feedGroup) {
	defer s.wg.Done()
	s.wake(g.wake)
}

// wake adds an entry to each of the wake-up streams, in one pipeline
// bounded by Options.Timeout.
func (s *Store) wake(streams ...string) {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.Timeout)
	defer cancel()
	_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, w := range streams {
			p.XAdd(ctx, &redis.XAddArgs{Stream: w, MaxLen: 1, Values: []any{"wake", "1"}})
			p.PExpire(ctx, w, wakeTTL)
		}
		return nil
	})
	if err != nil && s.health.up() {
		s.log.Debug("redisstore: feeds not woken; they read on at FeedBlock", "streams", streams, "err", err)
	}
}

// wakeAll ends the blocking reads of every feed group and of the changes
// stream (Close: the store's context is cancelled, and a read blocked at
// Redis would otherwise hold Close up to FeedBlock).
func (s *Store) wakeAll() {
	s.mu.RLock()
	streams := []string{keyWakeChanges(s.id)}
	for _, g := range s.groups {
		streams = append(streams, g.wake)
	}
	s.mu.RUnlock()
	s.wake(streams...)
}

// readWoken is one blocking read of streams (keys, then ids) and of the
// wake-up stream wake from the entry after *woken, which it moves past
// the entries read there; it returns the other streams' entries.
func (s *Store) readWoken(streams []string, wake string, woken *string) ([]redis.XStream, error) {
	n := len(streams) / 2
	all := make([]string, 0, len(streams)+2)
	all = append(all, streams[:n]...)
	all = append(all, wake)
	all = append(all, streams[n:]...)
	all = append(all, *woken)
	res, err := s.readFeed(all)
	for i, str := range res {
		if str.Stream == wake {
			if k := len(str.Messages); k > 0 {
				*woken = str.Messages[k-1].ID
			}
			res = append(res[:i], res[i+1:]...)
			break
		}
	}
	return res, err
}

// readFeed is one blocking XREAD of a feed (streams: keys, then ids),
// bounded by FeedBlock plus feedGrace. go-redis does not end a read in
// flight when s.ctx is cancelled, so unbounded, a read of a paused Redis
// ran to its socket timeout (FeedBlock + 10 s) and Close waited for it.
func (s *Store) readFeed(streams []string) ([]redis.XStream, error) {
	ctx, cancel := context.WithTimeout(withFeedRead(s.ctx), s.opts.FeedBlock+feedGrace)
	defer cancel()
	return s.c.XRead(ctx, &redis.XReadArgs{Streams: streams, Count: 512, Block: s.opts.FeedBlock}).Result()
}

// run reads g's streams until the store closes. A tenant added while a
// read blocks joins the next one, at most FeedBlock later, from the id
// follow noted: nothing is missed.
func (s *Store) run(g *feedGroup) {
	defer s.wg.Done()
	defer g.closeAll()
	var streams, ids []string
	woken := "0-0" // the last entry of g.wake read
	for s.ctx.Err() == nil {
		// One pass over the map: two would pair keys and ids in two
		// different orders.
		g.mu.Lock()
		n := len(g.last)
		streams, ids = streams[:0], ids[:0]
		for t, id := range g.last {
			streams = append(streams, keyEvents(t))
			ids = append(ids, id)
		}
		g.mu.Unlock()
		streams = append(streams, ids...)
		res, err := s.readWoken(streams, g.wake, &woken)
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case err != nil:
			if s.ctx.Err() != nil {
				return
			}
			if s.health.up() { // while down, the transition was logged
				s.log.Warn("redisstore: event stream read failed; retrying", "streams", n, "err", err)
			}
			s.pause(100 * time.Millisecond)
			continue
		}
		for _, str := range res {
			tenant, ok := tenantOfEvents(str.Stream)
			g.mu.Lock()
			f := g.feeds[tenant]
			g.mu.Unlock()
			if !ok || f == nil {
				continue
			}
			last := ""
			for _, m := range str.Messages {
				last = m.ID
				target, _ := m.Values["target"].(string)
				raw, _ := m.Values["state"].(string)
				st, err := parseEventState(raw)
				if err != nil {
					s.log.Error("redisstore: bad event stream entry", "tenant", tenant, "id", m.ID, "err", err)
					continue
				}
				key := policy.BreakerKey{Tenant: tenant, Target: target}
				s.learn(key, st)
				id, _ := parseStreamID(m.ID)
				f.publish(entry{ev: policy.BreakerEvent{Snapshot: st.snapshot(key)}, stream: tenant, id: id})
			}
			if last != "" {
				g.mu.Lock()
				g.last[tenant] = last
				g.mu.Unlock()
			}
		}
	}
}

func (g *feedGroup) closeAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, f := range g.feeds {
		f.closeAll()
	}
}

// entry is one event of a tenant's stream: the change, the tenant whose
// stream it is on, and its entry id there; or, local, a change of this
// replica's degraded mode, on no stream (localevents.go).
type entry struct {
	ev     policy.BreakerEvent
	stream string
	id     streamID
	local  bool
}

// publish sends e to every subscriber; one that falls behind is closed
// and dropped.
func (f *feed) publish(e entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for sb := range f.subs {
		if !sb.send(e) {
			delete(f.subs, sb)
		}
	}
}

func (f *feed) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for sb := range f.subs {
		sb.close()
		delete(f.subs, sb)
	}
}

func (f *feed) add(sb *sub) {
	f.mu.Lock()
	f.subs[sb] = struct{}{}
	f.mu.Unlock()
}

func (f *feed) remove(sb *sub) {
	f.mu.Lock()
	delete(f.subs, sb)
	f.mu.Unlock()
}

// sub is one subscription. Until it goes live, changes wait in pending
// (the current states go first); a subscriber that falls behind (more
// than buffer changes waiting) is closed.
//
// A subscription to one tenant (tenant set) follows two streams, the
// target-scoped breakers' (tenant "") and the tenant's, and knows its
// position in each (pos: the id of the last entry it delivered or that
// its snapshot or replay covered): an entry at or before it is dropped,
// and every event it delivers after the snapshot carries the position as
// a resume token (Resume). A subscription to every tenant has no
// position and no token.
type sub struct {
	mu      sync.Mutex
	ch      chan policy.BreakerEvent
	buffer  int
	pending []entry
	live    bool
	closed  bool

	tenant string
	pos    position
}

// send delivers e or reports false when the subscriber is closed.
func (sb *sub) send(e entry) bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	switch {
	case sb.closed:
		return false
	case !sb.live && len(sb.pending) < sb.buffer:
		sb.pending = append(sb.pending, e)
		return true
	case sb.live:
		ev, ok := sb.next(e)
		if !ok {
			return true
		}
		select {
		case sb.ch <- ev:
			return true
		default:
		}
	}
	sb.closed = true
	if sb.ch != nil {
		close(sb.ch)
	}
	return false
}

// next returns e's event with the position after it, or false when the
// subscription has it already; sb.mu is held.
func (sb *sub) next(e entry) (policy.BreakerEvent, bool) {
	if sb.tenant == "" {
		return e.ev, true
	}
	if e.local {
		e.ev.Resume = sb.pos.token(sb.tenant) // the position it had: a local change moves none
		return e.ev, true
	}
	i := sb.pos.index(e.stream)
	if !sb.pos.ids[i].less(e.id) {
		return policy.BreakerEvent{}, false
	}
	sb.pos.ids[i] = e.id
	e.ev.Resume = sb.pos.token(sb.tenant)
	return e.ev, true
}

// start makes the channel (room for the snapshot, the replay and buffer
// changes: neither counts against the buffer), sends the current states,
// the end-of-snapshot marker (at pos, resumed when replay resumes a
// subscription), the replay and the changes that came meanwhile, past
// pos, and goes live.
func (sb *sub) start(initial []policy.BreakerEvent, pos position, resumed bool, replay []entry) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.ch = make(chan policy.BreakerEvent, len(initial)+1+len(replay)+sb.buffer)
	if sb.closed {
		close(sb.ch)
		return
	}
	sb.pos = pos
	done := policy.BreakerEvent{SnapshotDone: true, Resumed: resumed}
	if sb.tenant != "" {
		done.Resume = pos.token(sb.tenant)
	}
	evs := append(initial, done)
	for _, e := range append(replay, sb.pending...) {
		if ev, ok := sb.next(e); ok {
			evs = append(evs, ev)
		}
	}
	for _, ev := range evs {
		select {
		case sb.ch <- ev:
		default:
			sb.closed = true
			close(sb.ch)
			return
		}
	}
	sb.pending, sb.live = nil, true
}

func (sb *sub) close() {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if !sb.closed {
		sb.closed = true
		if sb.ch != nil {
			close(sb.ch)
		}
	}
}
