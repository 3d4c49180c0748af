package redisstore

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/policy"
)

// Resuming a subscription. A subscription to one tenant follows two event
// streams, {#}:events (the target-scoped breakers) and the tenant's, whose
// entry ids order every transition of the fleet. Its position is the id
// of the last entry it delivered in each; the resume token of an event is
// that position, written out:
//
//	1:<id in the target-scoped stream>:<id in the tenant's stream>:<tenant>
//
// ("0-0" for a stream that had no entry yet). Any replica of the same
// Redis reads the same streams, so a token taken from one resumes on
// another: SubscribeFrom replays the entries after the position and goes
// on live, each entry once. A subscription to every tenant follows every
// stream and has no token.

// streamID is a Redis stream entry id, milliseconds and sequence.
type streamID struct{ ms, seq uint64 }

// parseStreamID reads "ms-seq".
func parseStreamID(s string) (streamID, error) {
	a, b, ok := strings.Cut(s, "-")
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return streamID{}, fmt.Errorf("redisstore: %q is not a stream entry id", s)
	}
	return streamID{ms, seq}, nil
}

func (id streamID) String() string {
	return strconv.FormatUint(id.ms, 10) + "-" + strconv.FormatUint(id.seq, 10)
}

// less reports whether id comes before o.
func (id streamID) less(o streamID) bool {
	return id.ms < o.ms || id.ms == o.ms && id.seq < o.seq
}

// position is a subscription's place in its two streams: ids[0] in the
// target-scoped breakers' stream (tenant ""), ids[1] in the tenant's.
type position struct{ ids [2]streamID }

// index is the slot of stream (a tenant) in a position.
func (position) index(stream string) int {
	if stream == "" {
		return 0
	}
	return 1
}

// token writes p out as the resume token of a subscription to tenant.
func (p position) token(tenant string) string {
	return "1:" + p.ids[0].String() + ":" + p.ids[1].String() + ":" + tenant
}

// parseToken reads a resume token of a subscription to tenant.
func parseToken(tok, tenant string) (position, error) {
	parts := strings.SplitN(tok, ":", 4)
	if len(parts) != 4 || parts[0] != "1" {
		return position{}, invalid("resume_token", "must be a resume_token this store sent")
	}
	if parts[3] != tenant {
		return position{}, invalid("resume_token", "is the token of a watch of another tenant")
	}
	var p position
	for i := range p.ids {
		id, err := parseStreamID(parts[1+i])
		if err != nil {
			return position{}, invalid("resume_token", "must be a resume_token this store sent")
		}
		p.ids[i] = id
	}
	return p, nil
}

// SubscribeFrom is Subscribe, for one tenant, resumable: every event from
// SnapshotDone on carries its position (BreakerEvent.Resume). With from
// set (a Resume of an earlier subscription, on this replica or another),
// no snapshot is sent: SnapshotDone comes first, with Resumed set, then
// every change after that position, in order, none twice, then the live
// changes. When the streams no longer hold every change after from
// (trimmed past it, MAXLEN ~100000, or lost with the data of a Redis that
// came back without it) or more than buffer of them are waiting, it falls
// back to a snapshot, as Subscribe, with Resumed false. A subscription to
// every tenant (tenant empty) has no position: its events carry none and
// from must be empty. A from that is not a token of a subscription to
// tenant is ErrInvalid naming resume_token; Redis not answering is
// ErrUnavailable.
func (s *Store) SubscribeFrom(tenant, from string, buffer int) (<-chan policy.BreakerEvent, func(), error) {
	if buffer <= 0 {
		buffer = DefaultSubscriptionBuffer
	}
	var want position
	if from != "" {
		if tenant == "" {
			return nil, nil, invalid("resume_token", "must be empty for a watch of every tenant, which has no token")
		}
		var err error
		if want, err = parseToken(from, tenant); err != nil {
			return nil, nil, err
		}
	}
	sb := &sub{buffer: buffer, tenant: tenant}
	cancel := func() {
		s.mu.Lock()
		delete(s.allSubs, sb)
		feeds := make([]*feed, 0, len(s.feeds))
		for _, f := range s.feeds {
			feeds = append(feeds, f)
		}
		s.mu.Unlock()
		for _, f := range feeds {
			f.remove(sb)
		}
		sb.close()
	}
	fail := func(err error) (<-chan policy.BreakerEvent, func(), error) {
		cancel()
		return nil, nil, err
	}
	if err := s.check(); err != nil {
		return fail(err)
	}
	tenants := []string{"", tenant}
	if tenant == "" {
		// Registered first, so a tenant followed from now on (one new to
		// the fleet included) has it among its subscribers.
		s.mu.Lock()
		s.allSubs[sb] = struct{}{}
		s.mu.Unlock()
		var err error
		if tenants, err = s.tenants(); err != nil {
			return fail(err)
		}
	}
	for _, t := range tenants {
		f, err := s.follow(t)
		if err != nil {
			return fail(err)
		}
		f.add(sb)
	}
	// The position is read after the subscriber joined the feeds: an entry
	// at or before it is in Redis already (in the replay, or in the
	// snapshot read below), one after it comes through the feed.
	var pos position
	if tenant != "" {
		var replay []entry
		var resumable bool
		var err error
		pos, replay, resumable, err = s.readFrom(tenant, want, from != "", buffer)
		if err != nil {
			return fail(err)
		}
		if resumable {
			sb.start(nil, want, true, replay)
			return sb.ch, cancel, nil
		}
	}
	var initial []policy.BreakerEvent
	for _, t := range tenants {
		snaps, err := s.tenantBreakers(t)
		if err != nil {
			return fail(err)
		}
		for _, sn := range snaps {
			initial = append(initial, policy.BreakerEvent{Snapshot: sn, Initial: true})
		}
	}
	sortEvents(initial)
	sb.start(initial, pos, false, nil)
	return sb.ch, cancel, nil
}

// readFrom reads, for a subscription to tenant, the current end of both of
// its streams (pos) and, when resume, the entries after want, at most limit
// of them; resumable says they are every change after want.
func (s *Store) readFrom(tenant string, want position, resume bool, limit int) (pos position, replay []entry, resumable bool, err error) {
	ctx, cancel := s.call()
	defer cancel()
	resumable = resume
	for i, stream := range []string{"", tenant} {
		key := keyEvents(stream)
		var rng *redis.XMessageSliceCmd
		var info *redis.XInfoStreamCmd
		// XRANGE first: the stream's highest deleted id only grows, so
		// when it is not past want after the range was read, nothing after
		// want had been trimmed when it was.
		_, perr := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			if resume {
				rng = p.XRangeN(ctx, key, "("+want.ids[i].String(), "+", int64(limit)+1)
			}
			info = p.XInfoStream(ctx, key)
			return nil
		})
		// held: the stream holds every entry after want. Trimming removes
		// the oldest entries (and does not move max-deleted-entry-id,
		// which only XDEL does): when the oldest entry held is after
		// want, entries between them may be gone, unless none was ever
		// removed.
		held := want.ids[i] == streamID{}
		switch err := info.Err(); {
		case err == nil:
			v := info.Val()
			last, err1 := parseStreamID(v.LastGeneratedID)
			deleted, err2 := parseStreamID(v.MaxDeletedEntryID)
			if err := errors.Join(err1, err2); err != nil {
				return position{}, nil, false, err
			}
			pos.ids[i] = last
			w := want.ids[i]
			switch first, err := parseStreamID(v.FirstEntry.ID); {
			case last.less(w) || w.less(deleted):
				held = false // the stream lost entries (a Redis that came back without them), or some after want were deleted
			case v.Length == 0:
				held = !w.less(last)
			case err != nil:
				return position{}, nil, false, err
			default:
				held = !w.less(first) || v.EntriesAdded == v.Length
			}
		case isNoSuchKey(err):
			// No stream: no entry ever, or every one lost.
		case perr != nil:
			return position{}, nil, false, fmt.Errorf("redisstore: read %s: %w", key, perr)
		default:
			return position{}, nil, false, fmt.Errorf("redisstore: read %s: %w", key, err)
		}
		if !resume {
			continue
		}
		if err := rng.Err(); err != nil {
			return position{}, nil, false, fmt.Errorf("redisstore: read %s: %w", key, err)
		}
		msgs := rng.Val()
		if !held || len(msgs) > limit {
			resumable = false
			continue
		}
		for _, m := range msgs {
			e, err := eventEntry(stream, m)
			if err != nil {
				return position{}, nil, false, err
			}
			replay = append(replay, e)
		}
	}
	if len(replay) > limit {
		resumable = false
	}
	return pos, replay, resumable, nil
}

// isNoSuchKey reports whether err is XINFO's reply for a missing stream.
func isNoSuchKey(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.Contains(reply.Error(), "no such key")
}

// eventEntry decodes one entry of tenant's event stream.
func eventEntry(tenant string, m redis.XMessage) (entry, error) {
	id, err := parseStreamID(m.ID)
	if err != nil {
		return entry{}, err
	}
	target, _ := m.Values["target"].(string)
	raw, _ := m.Values["state"].(string)
	st, err := parseEventState(raw)
	if err != nil {
		return entry{}, fmt.Errorf("redisstore: bad event stream entry %s of %q: %w", m.ID, tenant, err)
	}
	key := policy.BreakerKey{Tenant: tenant, Target: target}
	return entry{ev: policy.BreakerEvent{Snapshot: st.snapshot(key)}, stream: tenant, id: id}, nil
}

// sortEvents sorts snapshot events by key.
func sortEvents(evs []policy.BreakerEvent) {
	slices.SortFunc(evs, func(a, b policy.BreakerEvent) int { return keyCompare(a.Snapshot.Key, b.Snapshot.Key) })
}
