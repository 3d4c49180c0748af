package redisstore

import (
	"encoding/hex"
	"strings"
)

// Global keys, under the hash tag {policyd} (one slot, so an admin write
// and its change entry commit in one MULTI, also on Cluster; no tenant's
// tag is "{policyd}", they start with = or #).
const (
	keySchema   = "{policyd}:schema"
	keyRuns     = "{policyd}:runs"
	keyTenants  = "{policyd}:tenants"
	keyBudgets  = "{policyd}:budgets"
	keyPolicies = "{policyd}:policies"
	keyChanges  = "{policyd}:changes"
)

// keyWakeChanges is replica's wake-up stream of its read of keyChanges
// (feed.go, wakeAll).
func keyWakeChanges(replica string) string { return "{policyd}:wake:" + replica }

// schemaVersion is the layout this package reads and writes; it opens a
// Redis of version 1 too, migrating it forward (loadLibrary).
const schemaVersion = "2"

// schemaV1 is the layout before the attempt record's verdict field
// (policyd_nextdelay): the same keys, read the same way by this version,
// under the library policyd_v1.
const (
	schemaV1  = "1"
	libraryV1 = "policyd_v1"
)

// tag returns the hash tag of tenant's keys: "{=tenant}" when the name
// holds no brace, else "{#" + hex(tenant) + "}" (the empty tenant of
// target-scoped breakers is "{#}"), so a name can never end a tag early
// and two tenants never share one.
func tag(tenant string) string {
	if tenant != "" && !strings.ContainsAny(tenant, "{}") {
		return "{=" + tenant + "}"
	}
	return "{#" + hex.EncodeToString([]byte(tenant)) + "}"
}

// tagged is tag(tenant) + part + name, built in one allocation: a
// NextDelay names six keys.
func tagged(tenant, part, name string) string {
	if tenant != "" && !strings.ContainsAny(tenant, "{}") {
		return "{=" + tenant + "}" + part + name
	}
	return tag(tenant) + part + name
}

// Keys of one tenant, all under its tag.
func keyBreaker(tenant, target string) string { return tagged(tenant, ":breaker:", target) }
func keyEvents(tenant string) string          { return tagged(tenant, ":events", "") }
func keyIndex(tenant string) string           { return tagged(tenant, ":breakers", "") }
func keyBucket(tenant string) string          { return tagged(tenant, ":bucket", "") }
func keyAudit(tenant string) string           { return tagged(tenant, ":audit", "") }
func keyAttempt(tenant, call string) string   { return tagged(tenant, ":attempt:", call) }
func keyRun(tenant, id string) string         { return tagged(tenant, ":run:", id) }
func keyRunCalls(tenant, id string) string    { return tagged(tenant, ":runcalls:", id) }
func keyApplied(tenant string) string         { return tagged(tenant, ":applied", "") }
func keyCallTable(tenant, id string) string   { return tagged(tenant, ":calls:", id) }
func keyCallIDs(tenant, id string) string     { return tagged(tenant, ":callids:", id) }
func keyIdem(tenant, key string) string       { return tagged(tenant, ":idem:", key) }
func keyIdemIndex(tenant string) string       { return tagged(tenant, ":idemkeys", "") }
func keyFlow(tenant, target string) string    { return tagged(tenant, ":flow:", target) }
func keyLeases(tenant, target string) string  { return tagged(tenant, ":leases:", target) }
func keyWake(tenant, replica string) string   { return tagged(tenant, ":wake:", replica) }

// tenantOfEvents returns the tenant whose events stream key is.
func tenantOfEvents(key string) (string, bool) {
	inner, ok := strings.CutSuffix(key, "}:events")
	switch {
	case !ok:
		return "", false
	case strings.HasPrefix(inner, "{="):
		return inner[2:], true
	case strings.HasPrefix(inner, "{#"):
		b, err := hex.DecodeString(inner[2:])
		return string(b), err == nil
	}
	return "", false
}

// slotOf returns the Redis Cluster hash slot of tenant's keys: CRC16
// (XMODEM) of the tag's content, mod 16384.
func slotOf(tenant string) int {
	t := tag(tenant)
	var crc uint16
	for _, c := range []byte(t[1 : len(t)-1]) {
		crc ^= uint16(c) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}
