package redisstore

import (
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/policy"
)

// feed follows one tenant's event stream ({T}:events) from the id it
// started at, in order: every entry updates the cache and goes to the
// tenant's subscribers. A read that fails is retried from the last id
// seen, so a reconnect misses nothing the stream still holds.
type feed struct {
	tenant string
	mu     sync.Mutex
	subs   map[*sub]struct{}
}

// follow returns the feed of tenant, starting it (at the stream's current
// end) the first time: every transition after follow returns is seen.
func (s *Store) follow(tenant string) (*feed, error) {
	s.mu.RLock()
	f := s.feeds[tenant]
	s.mu.RUnlock()
	if f != nil {
		return f, nil
	}
	ctx, cancel := s.call()
	defer cancel()
	if err := s.c.SAdd(ctx, keyTenants, tenant).Err(); err != nil {
		return nil, err
	}
	last := "0-0"
	msgs, err := s.c.XRevRangeN(ctx, keyEvents(tenant), "+", "-", 1).Result()
	if err != nil {
		return nil, err
	}
	if len(msgs) == 1 {
		last = msgs[0].ID
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f = s.feeds[tenant]; f != nil {
		return f, nil
	}
	f = &feed{tenant: tenant, subs: map[*sub]struct{}{}}
	s.feeds[tenant] = f
	s.wg.Add(1)
	go s.run(f, last)
	return f, nil
}

// run reads f's stream from last until the store closes.
func (s *Store) run(f *feed, last string) {
	defer s.wg.Done()
	defer f.closeAll()
	key := keyEvents(f.tenant)
	backoff := time.NewTimer(0)
	<-backoff.C
	for s.ctx.Err() == nil {
		res, err := s.c.XRead(s.ctx, &redis.XReadArgs{Streams: []string{key, last}, Count: 512, Block: s.opts.FeedBlock}).Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case err != nil:
			if s.ctx.Err() != nil {
				return
			}
			s.log.Warn("redisstore: event stream read failed; retrying", "tenant", f.tenant, "err", err)
			backoff.Reset(100 * time.Millisecond)
			select {
			case <-s.ctx.Done():
				return
			case <-backoff.C:
			}
			continue
		}
		for _, str := range res {
			for _, m := range str.Messages {
				last = m.ID
				target, _ := m.Values["target"].(string)
				raw, _ := m.Values["state"].(string)
				st, err := parseEventState(raw)
				if err != nil {
					s.log.Error("redisstore: bad event stream entry", "tenant", f.tenant, "id", m.ID, "err", err)
					continue
				}
				key := policy.BreakerKey{Tenant: f.tenant, Target: target}
				s.learn(key, st)
				f.publish(policy.BreakerEvent{Snapshot: st.snapshot(key)})
			}
		}
	}
}

// publish sends ev to every subscriber; one that falls behind is closed
// and dropped.
func (f *feed) publish(ev policy.BreakerEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for sb := range f.subs {
		if !sb.send(ev) {
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
type sub struct {
	mu      sync.Mutex
	ch      chan policy.BreakerEvent
	buffer  int
	pending []policy.BreakerEvent
	live    bool
	closed  bool
}

// send delivers ev or reports false when the subscriber is closed.
func (sb *sub) send(ev policy.BreakerEvent) bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	switch {
	case sb.closed:
		return false
	case !sb.live && len(sb.pending) < sb.buffer:
		sb.pending = append(sb.pending, ev)
		return true
	case sb.live:
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

// start makes the channel (room for the snapshot and buffer changes: the
// snapshot never counts against the buffer), sends the current states,
// the end-of-snapshot marker and the changes that came meanwhile, and goes
// live.
func (sb *sub) start(initial []policy.BreakerEvent) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.ch = make(chan policy.BreakerEvent, len(initial)+1+sb.buffer)
	if sb.closed {
		close(sb.ch)
		return
	}
	for _, ev := range append(append(initial, policy.BreakerEvent{SnapshotDone: true}), sb.pending...) {
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
