package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Check verifies the policyd keys of a Redis without changing them: the
// schema version, that the library policyd_v2 is loaded on every master,
// and the shape of every key under a policyd hash tag (its type; that a
// breaker's or a bucket's record reads back; and for runs, flow hashes
// and attempt statistics that every integer field parses). It returns
// nil, or one error listing every problem found, each naming its key.
func Check(ctx context.Context, c redis.UniversalClient) error {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	v, err := c.Get(ctx, keySchema).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return fmt.Errorf("redisstore: %s is missing: no policyd state here", keySchema)
	case err != nil:
		return fmt.Errorf("redisstore: read %s: %w", keySchema, err)
	case v != schemaVersion:
		return fmt.Errorf("%w: %s is %q, this policyd reads %q", ErrSchema, keySchema, v, schemaVersion)
	}
	err = eachMaster(ctx, c, func(ctx context.Context, n *redis.Client) error {
		libs, err := n.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: libraryName}).Result()
		if err != nil {
			return err
		}
		if len(libs) == 0 {
			add("%s: library %s not loaded (a replica loads it at start)", n.Options().Addr, libraryName)
		}
		iter := n.Scan(ctx, 0, "{*", 1000).Iterator()
		for iter.Next(ctx) {
			checkKey(ctx, n, iter.Val(), add)
		}
		return iter.Err()
	})
	if err != nil {
		return fmt.Errorf("redisstore: check: %w", err)
	}
	if len(problems) > 0 {
		return fmt.Errorf("redisstore: %d problems: %s", len(problems), strings.Join(problems, "; "))
	}
	return nil
}

// eachMaster runs fn on every master of a Cluster, or on the one server.
func eachMaster(ctx context.Context, c redis.UniversalClient, fn func(context.Context, *redis.Client) error) error {
	switch c := c.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	}
	return fmt.Errorf("client %T: want a *redis.Client or *redis.ClusterClient", c)
}

// keyShapes maps the part of a key after its tag to the type it must have
// and the fields that must be integers.
var keyShapes = []struct {
	prefix string
	typ    string
	ints   []string
}{
	{":breaker:", "string", nil}, // a record: recordShapes
	{":breakers", "set", nil},
	{":events", "stream", nil},
	{":wake:", "stream", nil},
	{":bucket", "string", nil}, // a record
	{":runcalls:", "hash", nil},
	{":calls:", "hash", nil},
	{":callids:", "zset", nil},
	{":run:", "hash", []string{"pool", "cutoff", "spent"}},
	{":attempt:", "hash", []string{"attempt", "expiry"}},
	{":idem:", "hash", []string{"state", "lease_until", "expires"}},
	{":idemkeys", "zset", nil},
	{":flow:", "hash", []string{"stray", "tat", "adec", "asince", "adecs"}},
	{":leases:", "zset", nil},
	// The audit trail's meta and chunk ids before its stream, whose
	// name starts theirs.
	{":auditmeta", "hash", []string{"records", "headn", "skip"}},
	{":auditchunks", "zset", nil},
	{":audit", "stream", nil},
	{":schema", "string", nil},
	{":tenants", "set", nil},
	{":policies", "hash", nil},
	{":budgets", "hash", nil},
	{":runs", "hash", nil},
	{":changes", "stream", nil},
	{":replicas", "zset", nil},
	{":applied", "set", nil},
	{":stats:", "hash", nil}, // every field checked by checkStats
}

// recordShapes are the keys of keyShapes the library packs into a string:
// the record must decode, or be a hash of the layout before it whose
// integer fields are legacy (read as it is until its next change).
var recordShapes = map[string]struct {
	decode func([]byte) error
	legacy []string
}{
	":breaker:": {decodes(decodeBreakerRecord), []string{"state", "forced", "mode", "open_until", "changed", "gen", "cooldown", "consecutive"}},
	":bucket":   {decodes(decodeBucketRecord), []string{"last", "granted", "refused", "dry"}},
}

// checkKey checks one key's type and integer fields.
func checkKey(ctx context.Context, n *redis.Client, key string, add func(string, ...any)) {
	end := strings.Index(key, "}")
	if end < 0 || (!strings.HasPrefix(key, "{=") && !strings.HasPrefix(key, "{#") && !strings.HasPrefix(key, "{policyd}")) {
		return // not one of policyd's
	}
	rest := key[end+1:]
	for _, s := range keyShapes {
		if !strings.HasPrefix(rest, s.prefix) {
			continue
		}
		typ, err := n.Type(ctx, key).Result()
		if err != nil {
			add("%s: %v", key, err)
			return
		}
		rec, isRecord := recordShapes[s.prefix]
		switch {
		case isRecord && typ == "hash":
			checkInts(ctx, n, key, rec.legacy, add)
		case typ != s.typ:
			add("%s: is a %s, want a %s", key, typ, s.typ)
		case isRecord:
			checkRecord(ctx, n, key, rec.decode, add)
		case s.prefix == ":stats:":
			checkStats(ctx, n, key, add)
		default:
			checkInts(ctx, n, key, s.ints, add)
		}
		return
	}
	add("%s: not a key of schema %s", key, schemaVersion)
}

// checkInts checks that the fields ints of the hash at key, where
// present, are integers.
func checkInts(ctx context.Context, n *redis.Client, key string, ints []string, add func(string, ...any)) {
	if len(ints) == 0 {
		return
	}
	vals, err := n.HMGet(ctx, key, ints...).Result()
	if err != nil {
		add("%s: %v", key, err)
		return
	}
	for i, v := range vals {
		if v == nil {
			continue // written on first use
		}
		if _, err := strconv.ParseInt(v.(string), 10, 64); err != nil {
			add("%s: field %s is %q, want an integer", key, ints[i], v)
		}
	}
}

// checkRecord checks that the record at key decodes.
func checkRecord(ctx context.Context, n *redis.Client, key string, decode func([]byte) error, add func(string, ...any)) {
	v, err := n.Get(ctx, key).Bytes()
	if err != nil {
		add("%s: %v", key, err)
		return
	}
	if err := decode(v); err != nil {
		add("%s: %v", key, err)
	}
}

// decodes is a record's check of decode: whether it reads back.
func decodes[R any](decode func([]byte) (R, error)) func([]byte) error {
	return func(v []byte) error { _, err := decode(v); return err }
}

// checkStats checks an hour of attempt statistics: every field an attempt
// count's (statsField), every value a count.
func checkStats(ctx context.Context, n *redis.Client, key string, add func(string, ...any)) {
	h, err := n.HGetAll(ctx, key).Result()
	if err != nil {
		add("%s: %v", key, err)
		return
	}
	for f, v := range h {
		if _, _, _, ok := parseStatsField(f); !ok {
			add("%s: field %q is not s or f, an attempt 1..16, ':' and a target", key, f)
		} else if _, err := strconv.ParseUint(v, 10, 64); err != nil {
			add("%s: field %s is %q, want a count", key, f, v)
		}
	}
}
