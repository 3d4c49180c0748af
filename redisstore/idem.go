package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/policy"
)

// DefaultMaxKeysPerTenant is Options.MaxKeysPerTenant's default, as
// breakerstore's.
const DefaultMaxKeysPerTenant = 100000

// ClaimKey claims ref before an attempt, by fleet.KeyRecord.Claim's rules
// at the server's TIME, in one call of policyd_key_claim; the lease id is
// 64 bits from crypto/rand. A record new to the tenant beyond
// Options.MaxKeysPerTenant live ones is ErrTooManyKeys. Like an admin
// write, the change is on the primary (durable there with appendfsync
// always) and, with Options.WaitReplicas, on that many replicas when it
// returns.
func (s *Store) ClaimKey(ref policy.KeyRef, c policy.KeyClaim) (policy.KeyAnswer, error) {
	if err := s.check(); err != nil {
		return policy.KeyAnswer{}, err
	}
	if err := checkKeyRef(ref); err != nil {
		return policy.KeyAnswer{}, err
	}
	lease := strconv.FormatUint(newLeaseID(), 16)
	dedupes := 0
	if c.Dedupes {
		dedupes = 1
	}
	ctx, cancel := s.adminCtx()
	defer cancel()
	var r []any
	err := s.durably(ctx, keyIdem(ref.Tenant, ref.Key), func(cl redis.Cmdable) (err error) {
		r, err = keyClaimCall(ctx, s.lib.on(cl), ref, lease, c.LeaseUntil.UnixMicro(), c.Expires.UnixMicro(), dedupes, s.opts.MaxKeysPerTenant)
		return err
	})
	if err != nil {
		return policy.KeyAnswer{}, err
	}
	if len(r) != 7 {
		return policy.KeyAnswer{}, errReply
	}
	st, _ := toInt(r[1])
	until, _ := toInt(r[3])
	after, _ := toInt(r[5])
	return policy.KeyAnswer{State: policy.KeyState(st), LeaseID: toString(r[2]), LeaseUntil: fromUS(until),
		ResultRef: toString(r[4]), RetryAfter: time.Duration(after) * time.Microsecond, Reason: toString(r[6])}, nil
}

// CompleteKey records how the attempt holding lease ended
// (fleet.KeyRecord.Complete) in one call of policyd_key_complete, with
// ClaimKey's durability. An unknown or expired key is ErrNotFound; a lease
// not the key's current one is fleet.ErrLease. expires, when later,
// extends the record.
func (s *Store) CompleteKey(ref policy.KeyRef, lease string, o policy.KeyOutcome, result string, expires time.Time) (policy.KeyRecordView, error) {
	if err := s.check(); err != nil {
		return policy.KeyRecordView{}, err
	}
	if err := checkKeyRef(ref); err != nil {
		return policy.KeyRecordView{}, err
	}
	if len(result) > policy.MaxResultRefLen {
		return policy.KeyRecordView{}, invalid("result_ref", "must be at most 1024 bytes")
	}
	var exp int64
	if !expires.IsZero() {
		exp = expires.UnixMicro()
	}
	ctx, cancel := s.adminCtx()
	defer cancel()
	var r []any
	err := s.durably(ctx, keyIdem(ref.Tenant, ref.Key), func(cl redis.Cmdable) (err error) {
		r, err = s.lib.on(cl).fcall(ctx, "policyd_key_complete", []string{keyIdem(ref.Tenant, ref.Key), keyIdemIndex(ref.Tenant)},
			ref.Key, lease, int(o), result, exp)
		return err
	})
	if err != nil {
		return policy.KeyRecordView{}, keyErr(ref, err)
	}
	return keyViewOf(ref, r)
}

// Key returns ref's record at the server's time (policyd_key_read); an
// unknown or expired one is ErrNotFound.
func (s *Store) Key(ref policy.KeyRef) (policy.KeyRecordView, error) {
	if err := s.check(); err != nil {
		return policy.KeyRecordView{}, err
	}
	if err := checkKeyRef(ref); err != nil {
		return policy.KeyRecordView{}, err
	}
	ctx, cancel := s.call()
	defer cancel()
	r, err := s.lib.runROSlice(ctx, "policyd_key_read", []string{keyIdem(ref.Tenant, ref.Key)})
	if err != nil {
		return policy.KeyRecordView{}, keyErr(ref, libraryErr("policyd_key_read", err))
	}
	return keyViewOf(ref, r)
}

// keyClaimCall is policyd_key_claim on c: ref claimed with lease id lease
// until leaseUntil, kept until expires (Unix µs).
func keyClaimCall(ctx context.Context, l lib, ref policy.KeyRef, lease string, leaseUntil, expires int64, dedupes, maxKeys int) ([]any, error) {
	return l.fcall(ctx, "policyd_key_claim", []string{keyIdem(ref.Tenant, ref.Key), keyIdemIndex(ref.Tenant)},
		ref.Key, lease, leaseUntil, expires, dedupes, maxKeys)
}

// keyViewOf reads the library's view of a record (key_view).
func keyViewOf(ref policy.KeyRef, r []any) (policy.KeyRecordView, error) {
	if len(r) != 5 {
		return policy.KeyRecordView{}, errReply
	}
	st, _ := toInt(r[1])
	until, _ := toInt(r[2])
	exp, _ := toInt(r[3])
	return policy.KeyRecordView{Ref: ref, State: policy.KeyState(st), LeaseUntil: fromUS(until),
		Expires: fromUS(exp), ResultRef: toString(r[4])}, nil
}

// keyErr names ref in a not-found error.
func keyErr(ref policy.KeyRef, err error) error {
	if e, ok := err.(interface{ NotFound() bool }); ok && e.NotFound() {
		return fmt.Errorf("%w: idempotency key %q of tenant %q", ErrNotFound, ref.Key, ref.Tenant)
	}
	return err
}

// checkKeyRef checks a key reference's names.
func checkKeyRef(ref policy.KeyRef) error {
	if err := checkName("tenant", ref.Tenant, true); err != nil {
		return err
	}
	return checkName("idempotency_key", ref.Key, false)
}

// newLeaseID draws a lease id: 64 bits from crypto/rand, never 0 (which
// means none in fleet.KeyRecord).
func newLeaseID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:]) | 1
}
