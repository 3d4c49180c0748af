package redisstore

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// statsTTL is how long an hour of attempt statistics outlives its last
// count: the retention and an hour, so a bucket is gone once no window
// can reach it.
const statsTTL = policy.StatsRetention + time.Hour

// keyStats is the hash of tenant's attempt statistics of one hour (hours
// since the Unix epoch).
func keyStats(tenant string, hour int64) string {
	return tag(tenant) + ":stats:" + strconv.FormatInt(hour, 10)
}

// statsField is the field of a {T}:stats:HOUR hash counting t: "s" (a
// success) or "f" (a final failure), the attempt slot from 1 (16: 16 or
// more), ":" and the target.
func statsField(t policy.AttemptTally) string { return tallyKeyOf(t).field() }

// tallyKey is what statsField is made of: a batch sums its tallies by it
// without making the field for every outcome.
type tallyKey struct {
	target  string
	slot    int
	success bool
}

// tallyKeyOf is t's tallyKey.
func tallyKeyOf(t policy.AttemptTally) tallyKey {
	return tallyKey{target: t.Target, slot: fleet.AttemptSlot(t.Attempt), success: t.Success}
}

// field is the statsField of the tallies of k.
func (k tallyKey) field() string {
	kind := "f"
	if k.success {
		kind = "s"
	}
	return kind + strconv.Itoa(k.slot+1) + ":" + k.target
}

// parseStatsField reads a statsField; ok is false for a field of another
// form.
func parseStatsField(f string) (success bool, slot int, target string, ok bool) {
	head, target, found := strings.Cut(f, ":")
	if !found || len(head) < 2 || (head[0] != 's' && head[0] != 'f') || target == "" {
		return false, 0, "", false
	}
	n, err := strconv.Atoi(head[1:])
	if err != nil || n < 1 || n > policy.StatsAttempts {
		return false, 0, "", false
	}
	return head[0] == 's', n - 1, target, true
}

// pendingTally is an attempt statistics count of an outcome batch: what
// its field is made of (its field made when the batch is sent), how
// many, and the result or final of the same call that must apply for it
// to count.
type pendingTally struct {
	key   tallyKey
	n     int // calls counted
	cond  int // 1-based result index whose refusal cancels it, 0 for none
	final int // 1-based final index that must change the ledger, 0 for none
}

// CountAttempts counts the end of a call in the attempt statistics at
// Commit, in its pipeline: no round trip of its own.
func (c *changes) CountAttempts(t policy.AttemptTally) {
	if t.Target != "" {
		c.tallies = append(c.tallies, t)
	}
}

// queueTallies adds the HINCRBY and EXPIRE of each tally to p, in the
// hour of now.
func queueTallies(ctx context.Context, p redis.Pipeliner, tallies []policy.AttemptTally, now time.Time) {
	hour := fleet.HourOf(now.UnixNano())
	for _, t := range tallies {
		k := keyStats(t.Tenant, hour)
		p.HIncrBy(ctx, k, statsField(t), 1)
		p.Expire(ctx, k, statsTTL)
	}
}

// AttemptStats returns the attempt statistics of the window from since to
// now, one entry per tenant and target with a count in it, sorted by
// tenant and target; an empty tenant or target selects every one (the
// tenants any replica has used). It reads the window's hour hashes of
// every tenant selected in one pipeline.
func (s *Store) AttemptStats(tenant, target string, since time.Time) ([]policy.TargetStats, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	tenants := []string{tenant}
	if tenant == "" {
		var err error
		if tenants, err = s.tenants(); err != nil {
			return nil, err
		}
	}
	now := s.opts.Clock()
	last := fleet.HourOf(now.UnixNano())
	first := max(fleet.HourOf(since.UnixNano()), last-fleet.StatsHours+1)
	ctx, cancel := s.call()
	defer cancel()
	type read struct {
		tenant string
		hour   int64
		cmd    *redis.MapStringStringCmd
	}
	var reads []read
	_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, t := range tenants {
			for h := first; h <= last; h++ {
				reads = append(reads, read{t, h, p.HGetAll(ctx, keyStats(t, h))})
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redisstore: read attempt statistics: %w", err)
	}
	byKey := map[policy.BreakerKey]*policy.TargetStats{}
	for _, r := range reads {
		for f, v := range r.cmd.Val() {
			success, slot, tg, ok := parseStatsField(f)
			n, err := strconv.ParseUint(v, 10, 64)
			if !ok || err != nil {
				return nil, fmt.Errorf("redisstore: %s field %q is not an attempt count", keyStats(r.tenant, r.hour), f)
			}
			if target != "" && tg != target {
				continue
			}
			k := policy.BreakerKey{Tenant: r.tenant, Target: tg}
			ts := byKey[k]
			if ts == nil {
				ts = &policy.TargetStats{Tenant: r.tenant, Target: tg,
					Start: time.Unix(0, first*int64(time.Hour)), End: now}
				byKey[k] = ts
			}
			if success {
				ts.Successes[slot] += n
			} else {
				ts.Failures[slot] += n
			}
		}
	}
	out := make([]policy.TargetStats, 0, len(byKey))
	for _, ts := range byKey {
		out = append(out, *ts)
	}
	slices.SortFunc(out, func(a, b policy.TargetStats) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Target, b.Target))
	})
	return out, nil
}
