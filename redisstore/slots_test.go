package redisstore

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// checkSlots compares slotOf with the slots a Cluster node computes
// (CLUSTER KEYSLOT) for tenants of every tag form.
func checkSlots(t *testing.T, addr string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	for _, tenant := range []string{"acme", "", "a{b}c", "tenant-42", "ünïcode", "x"} {
		want, err := c.ClusterKeySlot(context.Background(), keyEvents(tenant)).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		if got := slotOf(tenant); got != int(want) {
			t.Errorf("slotOf(%q) = %d, CLUSTER KEYSLOT says %d", tenant, got, want)
		}
	}
}

func TestTenantOfEvents(t *testing.T) {
	for _, tenant := range []string{"acme", "", "a{b}c", "with:colon}:events"} {
		got, ok := tenantOfEvents(keyEvents(tenant))
		if !ok || got != tenant {
			t.Errorf("tenantOfEvents(%q) = %q, %v; want %q", keyEvents(tenant), got, ok, tenant)
		}
	}
}
