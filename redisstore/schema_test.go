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

// TestOpenMigratesSchema1 opens a Redis of schema version 1, its library
// policyd_v1 loaded (whose function names policyd_v2 has too, so loading
// beside it fails) and an attempt record of that layout (no verdict):
// Open migrates it to version 2, the old library gone, the record read as
// before, and Check agrees.
func TestOpenMigratesSchema1(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	v1 := "#!lua name=policyd_v1\nredis.register_function('policyd_nextdelay', function() return 1 end)\n" +
		"redis.register_function('policyd_read', function() return 1 end)\n"
	if err := c.FunctionLoad(ctx, v1).Err(); err != nil {
		t.Fatalf("FUNCTION LOAD policyd_v1: %v", err)
	}
	c.Set(ctx, "{policyd}:schema", "1", 0)
	expiry := time.Now().Add(time.Hour).UnixMilli()
	c.HSet(ctx, "{=acme}:attempt:c1", "attempt", 2, "expiry", expiry,
		"answer", `{"Retry":false,"Stop":3,"Disposition":3,"Class":"transient:503"}`)
	c.PExpireAt(ctx, "{=acme}:attempt:c1", time.UnixMilli(expiry))

	s, err := redisstore.Open(ctx, redisstore.Options{Client: c, Timeout: time.Second})
	if err != nil {
		t.Fatalf("Open of schema 1 = %v, want it migrated", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if v := c.Get(ctx, "{policyd}:schema").Val(); v != "2" {
		t.Errorf("schema after Open = %q, want \"2\"", v)
	}
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range libs {
		names = append(names, l.Name)
	}
	if strings.Join(names, " ") != "policyd_v2" {
		t.Errorf("libraries after Open: %v, want policyd_v2 alone", names)
	}
	ans, ok := s.LastAnswer(policy.CallKey{Tenant: "acme", CallID: "c1"})
	if !ok || ans.Retry || ans.Stop != policy.StopAttemptsExhausted || ans.Class != "transient:503" {
		t.Errorf("the schema-1 attempt record reads %+v, %v; want its STOP", ans, ok)
	}
	if _, _, err := s.ClaimAttempt(policy.CallKey{Tenant: "acme", CallID: "c1"}, 3); err == nil {
		t.Error("an attempt after the schema-1 record's STOP was not refused")
	}
	// policyd_nextdelay reads the record of that layout too (its answer's
	// JSON says it stopped).
	p := policy.Default()
	st := policy.NextDelayStep{Call: policy.CallKey{Tenant: "acme", CallID: "c1"}, Attempt: 3,
		Key: policy.BreakerKey{Tenant: "acme", Target: "pay"}, Breaker: p.Breaker, Result: policy.ResultTransientFailure,
		Decision: policy.Decision{Retry: true, Delay: time.Second}, Policy: &p,
		Spend: policy.SpendRequest{Tenant: "acme"}, Keep: time.Now().Add(time.Hour)}
	if _, ok, err := s.NextDelayInOneCall(s.Begin(), &st); !ok || err == nil || !strings.Contains(err.Error(), "stopped at attempt 2") {
		t.Errorf("NextDelayInOneCall after the schema-1 record's STOP = %v, %v; want the refusal", ok, err)
	}
	if err := redisstore.Check(ctx, c); err != nil {
		t.Errorf("Check after the migration = %v, want nil", err)
	}
}
