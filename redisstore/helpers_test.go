package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
)

// standalone starts a Redis server for t, loads the library and returns a
// client of it.
func standalone(t *testing.T) *redis.Client {
	t.Helper()
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	if err := loadLibrary(context.Background(), c); err != nil {
		t.Fatalf("loadLibrary: %v", err)
	}
	return c
}

// waitServerPast polls the server's TIME until it is past t (Unix µs):
// how a test lets a cool-down of a microsecond end, without sleeping.
func waitServerPast(t *testing.T, c redis.UniversalClient, tus int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		now, err := c.Time(context.Background()).Result()
		if err != nil {
			t.Fatalf("TIME: %v", err)
		}
		if now.UnixMicro() > tus {
			return
		}
	}
	t.Fatalf("the server's clock did not pass %d µs", tus)
}
