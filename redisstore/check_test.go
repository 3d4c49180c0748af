package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
)

func TestCheck(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	if err := redisstore.Check(ctx, c); err == nil || !strings.Contains(err.Error(), "{policyd}:schema is missing") {
		t.Fatalf("Check of an empty Redis = %v, want the schema key missing", err)
	}
	s, err := redisstore.Open(ctx, redisstore.Options{Client: c, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	key := policy.BreakerKey{Tenant: "acme", Target: "pay"}
	if _, err := s.Record(key, policy.BreakerConfig{}, policy.ResultTransientFailure, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenRun(policy.Run{ID: "r1", Tenant: "acme", Pool: 3, Cutoff: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SpendRetry(policy.SpendRequest{Tenant: "acme", RunID: "r1"}); err != nil {
		t.Fatal(err)
	}
	if err := s.NoteCall("r1", "c1", policy.CallNote{Target: "pay", Attempt: 1, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimKey(policy.KeyRef{Tenant: "acme", Key: "k"}, policy.KeyClaim{LeaseUntil: time.Now().Add(time.Minute), Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	lim := policy.FlowLimits{Ceiling: 3, LeaseTTL: time.Minute, FullWait: time.Second, Interval: time.Millisecond, Burst: 2}
	if _, err := s.AdmitFlow(key, policy.BreakerConfig{}, lim); err != nil {
		t.Fatal(err)
	}
	ups := []policy.OutcomeUpdate{{Key: key, Result: policy.ResultSuccess,
		Tally: policy.AttemptTally{Tenant: "acme", Target: "pay", Attempt: 2, Success: true}}}
	if _, err := s.ApplyOutcomes(ups, nil); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := redisstore.Check(ctx, c); err != nil {
		t.Fatalf("Check of a store just written = %v, want nil", err)
	}
	stats, err := c.Keys(ctx, "{=acme}:stats:*").Result()
	if err != nil || len(stats) != 1 {
		t.Fatalf("attempt statistics keys %v, %v; want one hour's", stats, err)
	}

	c.Set(ctx, "{=acme}:breaker:pay", "short", 0)
	c.HSet(ctx, "{=acme}:breaker:old", "state", "0", "gen", "two") // the layout before the record
	c.Set(ctx, "{=acme}:bucket", "x", 0)
	c.Set(ctx, "{=beta}:bucket", string(make([]byte, 40))+"\x05abc", 0)
	c.HSet(ctx, "{=old}:bucket", "tokens", "3.5", "granted", "many") // the layout before the record
	c.Set(ctx, "{=acme}:mystery", "x", 0)
	c.HSet(ctx, stats[0], "s2:pay", "many", "x9:pay", "1")
	c.HSet(ctx, "{=acme}:flow:pay", "tat", "soon")
	c.Del(ctx, "{=acme}:leases:pay")
	c.Set(ctx, "{=acme}:leases:pay", "x", 0)
	err = redisstore.Check(ctx, c)
	for _, want := range []string{
		stats[0] + `: field s2:pay is "many", want a count`,
		stats[0] + `: field "x9:pay" is not s or f`,
		"{=acme}:breaker:pay: is 5 bytes, a breaker at least 328",
		`{=acme}:breaker:old: field gen is "two", want an integer`,
		"{=acme}:bucket: is 1 bytes, a bucket at least 40",
		"{=beta}:bucket: is 44 bytes, a share cut short at byte 41",
		`{=old}:bucket: field granted is "many", want an integer`,
		"{=acme}:mystery: not a key of schema 2",
		`{=acme}:flow:pay: field tat is "soon", want an integer`,
		"{=acme}:leases:pay: is a string, want a zset",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check of damaged keys = %v, want it to say %q", err, want)
		}
	}

	c.Set(ctx, "{policyd}:schema", "9", 0)
	if err := redisstore.Check(ctx, c); err == nil || !strings.Contains(err.Error(), `{policyd}:schema is "9", this policyd reads "2"`) {
		t.Errorf("Check of another schema = %v, want both versions named", err)
	}
	if _, err := redisstore.Open(ctx, redisstore.Options{Client: c}); err == nil || !strings.Contains(err.Error(), `is "9"`) {
		t.Errorf("Open of another schema = %v, want a refusal naming both versions", err)
	}
}

// TestOpenReplacesTheLibraryBefore: a Redis that holds the library of the
// version before (policyd_v1, whose functions have this version's names)
// takes this one at Open, which Redis refuses while the other is loaded
// ("Function policyd_read already exists"); Check then finds this version.
func TestOpenReplacesTheLibraryBefore(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	old := "#!lua name=policyd_v1\nredis.register_function('policyd_read', function() return 1 end)\n"
	if err := c.FunctionLoad(ctx, old).Err(); err != nil {
		t.Fatal(err)
	}
	s, err := redisstore.Open(ctx, redisstore.Options{Client: c, Timeout: time.Second})
	if err != nil {
		t.Fatalf("Open over policyd_v1 = %v, want this version loaded in its place", err)
	}
	s.Close()
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "policyd_v*"}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) != 1 || libs[0].Name != "policyd_v2" {
		t.Errorf("libraries after Open: %+v, want policyd_v2 alone", libs)
	}
	if err := redisstore.Check(ctx, c); err != nil {
		t.Errorf("Check after Open = %v, want nil", err)
	}
}
