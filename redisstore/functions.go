package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// library is the Redis Functions library every state change runs in; its
// name carries its version, so two versions can be told apart on a
// server and a replica of one never runs the other's code.
//
//go:embed policyd.lua
var library string

// libraryName is the name the library registers under.
const libraryName = "policyd_v2"

// loadLibrary checks the schema version (refusing another before touching
// anything), loads the library onto every master (FUNCTION LOAD REPLACE)
// and writes the version on a Redis without one. A Redis of schema
// version 1 is migrated forward: its keys read the same under version 2
// (the attempt record only gains the verdict field), so the migration
// deletes the library policyd_v1 (its functions have the names of this
// one's, and a replica of version 1 left running then fails its calls
// instead of writing attempt records this one misreads), loads this
// library and writes version 2.
func loadLibrary(ctx context.Context, c redis.UniversalClient) error {
	v, err := c.Get(ctx, keySchema).Result()
	switch {
	case errors.Is(err, redis.Nil):
	case err != nil:
		return fmt.Errorf("redisstore: read %s: %w", keySchema, err)
	case v != schemaVersion && v != schemaV1:
		return fmt.Errorf("%w: %s is %q, this policyd reads %q", ErrSchema, keySchema, v, schemaVersion)
	}
	older := v == schemaV1 || errors.Is(err, redis.Nil) // policyd_v1 may be loaded (FLUSHALL keeps functions)
	err = eachMaster(ctx, c, func(ctx context.Context, n *redis.Client) error {
		if older {
			if err := n.FunctionDelete(ctx, libraryV1).Err(); err != nil && !strings.Contains(err.Error(), "not found") {
				return fmt.Errorf("redisstore: FUNCTION DELETE %s on %s: %w", libraryV1, n.Options().Addr, err)
			}
		}
		if err := n.FunctionLoadReplace(ctx, library).Err(); err != nil {
			return fmt.Errorf("redisstore: FUNCTION LOAD %s on %s: %w", libraryName, n.Options().Addr, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if v == schemaV1 {
		if err := c.Set(ctx, keySchema, schemaVersion, 0).Err(); err != nil {
			return fmt.Errorf("redisstore: write %s: %w", keySchema, err)
		}
		return nil
	}
	if err := c.SetNX(ctx, keySchema, schemaVersion, 0).Err(); err != nil {
		return fmt.Errorf("redisstore: write %s: %w", keySchema, err)
	}
	return nil
}

// us converts a duration to whole microseconds, at least 1 for a positive
// one: the library's unit.
func us(d time.Duration) int64 {
	if d > 0 && d < time.Microsecond {
		return 1
	}
	return int64(d / time.Microsecond)
}

// fromUS converts Unix microseconds to a time, zero for 0.
func fromUS(t int64) time.Time {
	if t == 0 {
		return time.Time{}
	}
	return time.UnixMicro(t)
}

// cfgArgs appends cfg (normalized) as the library's 8 breaker arguments;
// the client writes the failure rate in its shortest exact decimal form.
func cfgArgs(args []any, cfg *policy.BreakerConfig) []any {
	return append(args, int(cfg.Mode), cfg.ConsecutiveFailures, cfg.FailureRate,
		us(cfg.Window), cfg.MinCalls, us(cfg.Cooldown), cfg.HalfOpenProbes, us(cfg.ProbeTimeout))
}

// budgetArgs appends b as the library's 6 budget arguments; the client
// writes the numbers in their shortest exact decimal form.
func budgetArgs(args []any, b *policy.TenantBudget) []any {
	dry := 0
	if b.DryRun {
		dry = 1
	}
	return append(args, b.Capacity, b.DepositRatio, b.MinPerSecond, b.RetryCost, b.TimeoutCost, dry)
}

// state is a breaker as the library reports it (times in Unix µs).
type state struct {
	State          policy.BreakerState
	Forced         bool
	Mode           policy.BreakerMode
	OpenUntil      int64
	Changed        int64
	Generation     uint64
	Cooldown       int64
	Consecutive    int
	WindowCalls    uint64
	WindowFailures uint64
	Permits        int
}

// parseState reads the library's 11-number breaker snapshot.
func parseState(v any) (state, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 11 {
		return state{}, fmt.Errorf("redisstore: breaker snapshot %v: want 11 numbers", v)
	}
	var n [11]int64
	for i, x := range a {
		var err error
		if n[i], err = toInt(x); err != nil {
			return state{}, fmt.Errorf("redisstore: breaker snapshot field %d: %w", i, err)
		}
	}
	return state{
		State: policy.BreakerState(n[0]), Forced: n[1] == 1, Mode: policy.BreakerMode(n[2]),
		OpenUntil: n[3], Changed: n[4], Generation: uint64(n[5]), Cooldown: n[6],
		Consecutive: int(n[7]), WindowCalls: uint64(n[8]), WindowFailures: uint64(n[9]), Permits: int(n[10]),
	}, nil
}

// parseEventState reads a snapshot as the events stream carries it: the 11
// numbers separated by spaces.
func parseEventState(s string) (state, error) {
	f := strings.Fields(s)
	a := make([]any, len(f))
	for i := range f {
		a[i] = f[i]
	}
	return parseState(a)
}

// snapshot converts st to the API's snapshot of the breaker under key.
func (st state) snapshot(key policy.BreakerKey) policy.BreakerSnapshot {
	return policy.BreakerSnapshot{
		Key: key, State: st.State, Forced: st.Forced, OpenUntil: fromUS(st.OpenUntil),
		ConsecutiveFailures: st.Consecutive, WindowCalls: st.WindowCalls, WindowFailures: st.WindowFailures,
		ProbesInFlight: st.Permits, Changed: fromUS(st.Changed), CooldownUntil: fromUS(st.Cooldown),
		Mode: st.Mode, Generation: st.Generation,
	}
}

func toInt(x any) (int64, error) {
	switch v := x.(type) {
	case int64:
		return v, nil
	case string:
		return strconv.ParseInt(v, 10, 64)
	}
	return 0, fmt.Errorf("%v (%T) is not an integer", x, x)
}

func toFloat(x any) (float64, error) {
	switch v := x.(type) {
	case int64:
		return float64(v), nil
	case string:
		return strconv.ParseFloat(v, 64)
	}
	return 0, fmt.Errorf("%v (%T) is not a number", x, x)
}

func toString(x any) string {
	s, _ := x.(string)
	return s
}

// lib calls the library's functions on c. Every call goes through run or
// runRO, which put the clock argument first: "" for the server's TIME (a
// nil clock: production), else clock's time in Unix µs (Options.Clock), so
// every function of one engine decides at one clock and none can forget
// it; the library takes the argument off in its register (policyd.lua).
// The Store's lib has a coalescer (coalesce.go), through which fcall and
// runROSlice send their calls, so that concurrent requests share round
// trips; a lib on a pipeline or a transaction (on) has none.
type lib struct {
	c     redis.Cmdable
	clock func() time.Time // nil: the server's TIME
	q     *coalescer       // nil: each call is its own round trip
}

// on returns l calling on c (a pipeline, a transaction), with l's clock.
func (l lib) on(c redis.Cmdable) lib { return lib{c: c, clock: l.clock} }

// run calls function fn on keys with args, after the clock argument.
func (l lib) run(ctx context.Context, fn string, keys []string, args ...any) *redis.Cmd {
	return l.c.FCall(ctx, fn, keys, l.withClock(args)...)
}

// runRO is run for a read-only function (FCALL_RO).
func (l lib) runRO(ctx context.Context, fn string, keys []string, args ...any) *redis.Cmd {
	return l.c.FCallRO(ctx, fn, keys, l.withClock(args)...)
}

// withClock returns args after the clock argument.
func (l lib) withClock(args []any) []any {
	return append([]any{l.now()}, args...)
}

// now is the clock argument: the replica's clock, Unix µs, or "" for the
// server's.
func (l lib) now() string {
	if l.clock == nil {
		return ""
	}
	return strconv.FormatInt(l.clock().UnixMicro(), 10)
}

// fcall runs function fn of the library on keys with args and returns its
// reply as an array; an error reply NOTFOUND becomes ErrNotFound.
func (l lib) fcall(ctx context.Context, fn string, keys []string, args ...any) ([]any, error) {
	v, err := l.send(ctx, false, fn, keys, args)
	if err != nil {
		return nil, libraryErr(fn, err)
	}
	a, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("redisstore: %s: reply %v is not an array", fn, v)
	}
	return a, nil
}

// runROSlice is runRO(ctx, fn, keys, args...).Slice(): the reply of the
// read-only function fn as an array, an error reply as it came.
func (l lib) runROSlice(ctx context.Context, fn string, keys []string, args ...any) ([]any, error) {
	v, err := l.send(ctx, true, fn, keys, args)
	if err != nil {
		return nil, err
	}
	a, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("redis: unexpected type=%T for Slice", v)
	}
	return a, nil
}

// send calls fn (FCALL_RO when ro) and returns its reply, through l's
// coalescer when it has one.
func (l lib) send(ctx context.Context, ro bool, fn string, keys []string, args []any) (any, error) {
	if l.q == nil {
		if ro {
			return l.runRO(ctx, fn, keys, args...).Result()
		}
		return l.run(ctx, fn, keys, args...).Result()
	}
	cmd := fcallCmd(ctx, ro, fn, keys, l.now(), args)
	if err := l.q.do(ctx, cmd); err != nil {
		return nil, err
	}
	return cmd.Result()
}

// libraryErr classifies an error reply of function fn: NOTFOUND is
// ErrNotFound, CAPACITY ErrTooManyBreakers, KEYS_CAPACITY ErrTooManyKeys,
// with the library's words; LEASE is fleet.ErrLease.
func libraryErr(fn string, err error) error {
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "NOTFOUND"):
		return fmt.Errorf("%w: %s", ErrNotFound, strings.TrimPrefix(msg, "NOTFOUND "))
	case strings.HasPrefix(msg, "CAPACITY"):
		return fmt.Errorf("%w: %s", ErrTooManyBreakers, strings.TrimPrefix(msg, "CAPACITY "))
	case strings.HasPrefix(msg, "KEYS_CAPACITY"):
		return fmt.Errorf("%w: %s", ErrTooManyKeys, strings.TrimPrefix(msg, "KEYS_CAPACITY "))
	case strings.HasPrefix(msg, "LEASE"):
		return fleet.ErrLease
	}
	return fmt.Errorf("redisstore: %s: %w", fn, err)
}

// errReply is a reply of the library that does not have the shape its
// function returns: a library of another version, or a bug.
var errReply = errors.New("redisstore: malformed reply from the library")
