package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
)

// TestBreakersListedInOneCallPerTenant: listing a tenant's breakers (the
// admin API's ListBreakers, the metrics page's breaker gauges, a
// WatchBreakers snapshot) reads its index and then its breakers in one
// call, not one round trip per breaker; every breaker comes back with its
// state. Failed before: 600 breakers took 600 round trips of
// policyd_read.
func TestBreakersListedInOneCallPerTenant(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	s, err := Open(context.Background(), Options{Client: c, Timeout: 10 * time.Second, MaxBreakersPerTenant: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	const n = readManyKeys + 88 // two calls' worth
	var want []string
	for i := range n {
		target := fmt.Sprintf("api-%04d", i)
		st := policy.BreakerClosed
		if i%3 == 0 {
			st = policy.BreakerOpen
		}
		if _, err := s.ForceBreaker(policy.BreakerKey{Tenant: "acme", Target: target}, st); err != nil {
			t.Fatal(err)
		}
		want = append(want, target+" "+strconv.Itoa(int(st)))
	}
	calls := func() map[string]uint64 {
		out := map[string]uint64{}
		for call, v := range s.RoundTrips() {
			out[call] = v
		}
		return out
	}
	before := calls()
	list, err := s.Breakers("acme", policy.BreakerStateUnspecified, policy.BreakerKey{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range list {
		got = append(got, b.Key.Target+" "+strconv.Itoa(int(b.State)))
	}
	if !slices.Equal(got, want) {
		t.Errorf("breakers of acme: %d listed, want %d with their states (first: %v)", len(got), len(want), got[:min(3, len(got))])
	}
	after := calls()
	trips := map[string]uint64{}
	for call, v := range after {
		if d := v - before[call]; d > 0 && call != "xread" && call != "pipeline zadd" && call != "zadd" {
			trips[call] = d
		}
	}
	if fmt.Sprint(trips) != "map[policyd_read_many:2 smembers:1]" {
		t.Errorf("round trips of listing %d breakers: %v, want the index and two policyd_read_many", n, trips)
	}
}
