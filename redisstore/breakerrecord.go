package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// breakerNumbers is how many numbers lead a breaker's record
// ({T}:breaker:TARGET, a string; policyd.lua's BREAKER_FMT): state,
// forced, mode, open_until, changed, gen, cooldown, last_failure,
// consecutive, half_open_ok, slot_width, then each window slot's epoch,
// calls and failures, little-endian 64-bit integers. The breaker's
// permits follow them as text. Only the library reads and writes a
// record; Go reads one to check it (Check) and in tests.
const breakerNumbers = 11 + 3*fleet.WindowSlots

// breakerRecordLen is the length of a record's numbers, policyd.lua's
// BREAKER_LEN.
const breakerRecordLen = 8 * breakerNumbers

// breakerRecord is a breaker's record read back: its numbers in the
// record's order, and its permits' text.
type breakerRecord struct {
	n       [breakerNumbers]int64
	permits string
}

// permitsText is a record's permits: "hexid:expiry", space-separated.
var permitsText = regexp.MustCompile(`^([0-9a-fA-F]+:[0-9]+( [0-9a-fA-F]+:[0-9]+)*)?$`)

// decodeBreakerRecord reads a breaker's record, or says how it is
// damaged.
func decodeBreakerRecord(v []byte) (breakerRecord, error) {
	var r breakerRecord
	if len(v) < breakerRecordLen {
		return r, fmt.Errorf("is %d bytes, a breaker at least %d", len(v), breakerRecordLen)
	}
	for i := range r.n {
		r.n[i] = int64(binary.LittleEndian.Uint64(v[8*i:]))
	}
	r.permits = string(v[breakerRecordLen:])
	if !permitsText.MatchString(r.permits) {
		return r, fmt.Errorf("permits are %q, want hexid:expiry, space-separated", r.permits)
	}
	return r, nil
}

// StoredBreakerState reads the state of the breaker under key as Redis
// holds it, past every replica's cache: from its record, or from a hash
// of the layout before the record. ok is false when Redis holds no
// breaker under key. Fault tests read it to check what survived a
// restart of the engine.
func StoredBreakerState(ctx context.Context, c redis.UniversalClient, key policy.BreakerKey) (st policy.BreakerState, ok bool, err error) {
	name := keyBreaker(key.Tenant, key.Target)
	v, err := c.Get(ctx, name).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return 0, false, nil
	case err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"):
		s, err := c.HGet(ctx, name, "state").Result()
		if err != nil {
			return 0, false, fmt.Errorf("redisstore: read %s: %w", name, err)
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("redisstore: %s: field state is %q, want an integer", name, s)
		}
		return policy.BreakerState(n), true, nil
	case err != nil:
		return 0, false, fmt.Errorf("redisstore: read %s: %w", name, err)
	}
	r, err := decodeBreakerRecord(v)
	if err != nil {
		return 0, false, fmt.Errorf("redisstore: %s %w", name, err)
	}
	return policy.BreakerState(r.n[0]), true, nil
}
