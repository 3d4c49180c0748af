package redisstore

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// roundTrips counts the round trips a replica makes to Redis, by call:
// the function's name for an FCALL or FCALL_RO (policyd_nextdelay), the
// command's for any other command (xread), "pipeline" and its first
// call's for a pipeline.
// Only what was sent counts: a call the engine breaker refused did not
// leave the replica. The names are the library's functions and the
// commands this package sends, a set of a few dozen.
type roundTrips struct {
	m sync.Map // call name -> *atomic.Uint64
}

// add counts one round trip of cmd.
func (t *roundTrips) add(cmd redis.Cmder) { t.count(callName(cmd)) }

// addPipeline counts one round trip of a pipeline of cmds, named for its
// first call ("pipeline policyd_audit").
func (t *roundTrips) addPipeline(cmds []redis.Cmder) {
	name := "pipeline"
	if len(cmds) > 0 {
		name += " " + callName(cmds[0])
	}
	t.count(name)
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
