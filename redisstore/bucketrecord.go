package redisstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/redis/go-redis/v9"
)

// bucketRecordLen is the length of a bucket record's numbers
// ({T}:bucket, a string; policyd.lua's BUCKET_FMT): tokens (a double),
// last (µs), granted, refused and dry, little-endian. The replicas'
// shares follow (shareRecordLen each, and the id). Only the library
// writes a record; Go reads one for Budget, to check it (Check) and in
// tests.
const bucketRecordLen = 40

// shareRecordLen is the length of a share's record without its id
// (policyd.lua's SHARE_FMT): the id's length (a byte), then after the id
// hold and lock (doubles), version and last call (µs).
const shareRecordLen = 33

// bucketRecord is a tenant's bucket read back.
type bucketRecord struct {
	tokens                float64
	last                  int64
	granted, refused, dry uint64
	shares                []bucketShare
}

// bucketShare is one replica's share of a bucket.
type bucketShare struct {
	replica    string
	hold, lock float64
	v          uint64
	at         int64
}

// decodeBucketRecord reads a bucket's record, or says how it is damaged.
func decodeBucketRecord(v []byte) (bucketRecord, error) {
	var r bucketRecord
	if len(v) < bucketRecordLen {
		return r, fmt.Errorf("is %d bytes, a bucket at least %d", len(v), bucketRecordLen)
	}
	le := binary.LittleEndian
	r.tokens = math.Float64frombits(le.Uint64(v))
	r.last = int64(le.Uint64(v[8:]))
	r.granted, r.refused, r.dry = le.Uint64(v[16:]), le.Uint64(v[24:]), le.Uint64(v[32:])
	for pos := bucketRecordLen; pos < len(v); {
		n := int(v[pos])
		if len(v)-pos < shareRecordLen+n {
			return r, fmt.Errorf("is %d bytes, a share cut short at byte %d", len(v), pos+1)
		}
		p := v[pos+1+n:]
		r.shares = append(r.shares, bucketShare{replica: string(v[pos+1 : pos+1+n]),
			hold: math.Float64frombits(le.Uint64(p)), lock: math.Float64frombits(le.Uint64(p[8:])),
			v: le.Uint64(p[16:]), at: int64(le.Uint64(p[24:]))})
		pos += shareRecordLen + n
	}
	return r, nil
}

// readBucket reads tenant's bucket as Redis holds it: from its record, or
// from a hash of the layout before the record. ok is false when Redis
// holds no bucket of tenant.
func readBucket(ctx context.Context, c redis.Cmdable, tenant string) (r bucketRecord, ok bool, err error) {
	name := keyBucket(tenant)
	v, err := c.Get(ctx, name).Bytes()
	switch {
	case errors.Is(err, redis.Nil):
		return r, false, nil
	case err != nil && strings.HasPrefix(err.Error(), "WRONGTYPE"):
		h, err := c.HGetAll(ctx, name).Result()
		if err != nil {
			return r, false, fmt.Errorf("redisstore: read %s: %w", name, err)
		}
		num := func(f string) float64 { x, _ := toFloat(h[f]); return x }
		r.tokens, r.last = num("tokens"), int64(num("last"))
		r.granted, r.refused, r.dry = uint64(num("granted")), uint64(num("refused")), uint64(num("dry"))
		return r, len(h) > 0, nil
	case err != nil:
		return r, false, fmt.Errorf("redisstore: read %s: %w", name, err)
	}
	if r, err = decodeBucketRecord(v); err != nil {
		return r, false, fmt.Errorf("redisstore: %s %w", name, err)
	}
	return r, true, nil
}
