package redisstore

import (
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// roundTrips counts the round trips a replica makes to Redis, by call:
// the function's name for an FCALL or FCALL_RO (policyd_nextdelay), the
// command's for any other command (xread), "pipeline" and its first
// call's for a pipeline.
// Only what was sent counts: a call the engine breaker refused did not
// leave the replica. The names are the library's functions and the
// commands this package sends, a set of a few dozen.
//
// When observe is set, it also times them: add and addPipeline return the
// moment the round trip starts, and took observes its duration, in
// seconds (Options.RoundTripObserver). A blocking read (the feeds' XREAD
// BLOCK, which waits for events by design) is counted, not timed.
type roundTrips struct {
	m       sync.Map // call name -> *atomic.Uint64
	observe RoundTripObserver
}

// RoundTripObserver takes the duration of each round trip to Redis, in
// seconds; a prometheus.Histogram is one.
type RoundTripObserver interface{ Observe(seconds float64) }

// add counts one round trip of cmd and returns when it starts (zero: not
// timed).
func (t *roundTrips) add(cmd redis.Cmder) time.Time {
	name := callName(cmd)
	t.count(name)
	if t.observe == nil || name == "xread" && blocks(cmd) {
		return time.Time{}
	}
	return time.Now()
}

// addPipeline counts one round trip of a pipeline of cmds, named for its
// first call ("pipeline policyd_audit"), and returns when it starts (zero:
// not timed).
func (t *roundTrips) addPipeline(cmds []redis.Cmder) time.Time {
	name := "pipeline"
	if len(cmds) > 0 {
		name += " " + callName(cmds[0])
	}
	t.count(name)
	if t.observe == nil {
		return time.Time{}
	}
	return time.Now()
}

// took observes the round trip that started at start (add's or
// addPipeline's), unless it was not timed.
func (t *roundTrips) took(start time.Time) {
	if !start.IsZero() {
		t.observe.Observe(time.Since(start).Seconds())
	}
}

// blocks reports whether cmd (an XREAD) blocks until events come.
func blocks(cmd redis.Cmder) bool {
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.EqualFold(s, "block") {
			return true
		}
	}
	return false
}

// callName is the function an FCALL or FCALL_RO calls, else the command.
func callName(cmd redis.Cmder) string {
	name := cmd.Name()
	if name == "fcall" || name == "fcall_ro" {
		if args := cmd.Args(); len(args) > 1 {
			if fn, ok := args[1].(string); ok {
				return fn
			}
		}
	}
	return name
}

func (t *roundTrips) count(name string) {
	if c, ok := t.m.Load(name); ok {
		c.(*atomic.Uint64).Add(1)
		return
	}
	c, _ := t.m.LoadOrStore(strings.Clone(name), new(atomic.Uint64))
	c.(*atomic.Uint64).Add(1)
}

// RoundTrips returns the round trips this replica made to Redis since it
// opened, by call (see policyd_store_round_trips_total).
func (s *Store) RoundTrips() map[string]uint64 {
	out := map[string]uint64{}
	s.trips.m.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	return out
}
