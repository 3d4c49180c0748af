package breakerstore

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// bucketIdemKeys holds the idempotency records (fleet.KeyRecord): key
// tenant 0x00 idempotency key, value version byte 1, state (a byte),
// lease id (uint64), lease end and expiry (Unix ns, int64), all
// big-endian, then the result reference (the rest). New in schema version
// 2, before its release.
var bucketIdemKeys = []byte("idemkeys")

// DefaultMaxKeysPerTenant is Options.MaxKeysPerTenant's default.
const DefaultMaxKeysPerTenant = 100000

// ErrTooManyKeys reports a new idempotency record beyond
// Options.MaxKeysPerTenant live records of its tenant.
var ErrTooManyKeys error = &classErr{"breakerstore: too many idempotency keys: over capacity", kindCapacity, policy.ErrCapacity}

const keyRecordVersion = 1

// keyTable holds the idempotency records. Every change is committed (with
// an fsync) before the method that made it returns: admin-grade
// durability, so a restart never forgets a success or hands out a lease
// twice. mu serialises the changes with their commits.
type keyTable struct {
	mu        sync.Mutex
	recs      map[policy.KeyRef]*fleet.KeyRecord
	perTenant map[string]int
}

func (t *keyTable) init() {
	t.recs = map[policy.KeyRef]*fleet.KeyRecord{}
	t.perTenant = map[string]int{}
}

// ClaimKey claims ref before an attempt at the store's clock (the rules
// are fleet.KeyRecord.Claim's) and commits the record before it returns
// when it changed. A new record beyond Options.MaxKeysPerTenant live ones
// of the tenant is ErrTooManyKeys (expired ones are dropped first). It is
// safe for concurrent use.
func (s *Store) ClaimKey(ref policy.KeyRef, c policy.KeyClaim) (policy.KeyAnswer, error) {
	if s.closed.Load() {
		return policy.KeyAnswer{}, ErrClosed
	}
	t := &s.keys
	t.mu.Lock()
	defer t.mu.Unlock()
	now := s.now()
	r, exists := t.recs[ref]
	if !exists || now >= r.Expires {
		if t.perTenant[ref.Tenant] >= s.opts.MaxKeysPerTenant && s.dropExpiredKeys(ref.Tenant, now) == 0 {
			return policy.KeyAnswer{}, fmt.Errorf("%w: %d keys of tenant %q (cap %d)", ErrTooManyKeys,
				t.perTenant[ref.Tenant], ref.Tenant, s.opts.MaxKeysPerTenant)
		}
		// Making room may have dropped ref's own expired record: claim
		// into what the store holds now.
		r, exists = t.recs[ref]
	}
	next := fleet.KeyRecord{}
	if exists {
		next = *r
	}
	lease := randUint64() | 1 // never 0, which means none
	a, changed := next.Claim(exists, now, lease, &c)
	if !changed {
		return a, nil
	}
	if err := s.update("write idempotency key", func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketIdemKeys).Put(joinKey(ref.Tenant, ref.Key), encodeKeyRecord(&next))
	}); err != nil {
		return policy.KeyAnswer{}, err
	}
	if !exists {
		r = new(fleet.KeyRecord)
		t.recs[policy.KeyRef{Tenant: cloneString(ref.Tenant), Key: cloneString(ref.Key)}] = r
		t.perTenant[ref.Tenant]++
	}
	*r = next
	if next.Lease == lease { // the claim took the lease
		a.LeaseID = strconv.FormatUint(next.Lease, 16)
	}
	return a, nil
}

// CompleteKey records how the attempt holding lease (ClaimKey's LeaseID)
// ended and commits it before it returns. An unknown (or expired) key is
// ErrNotFound; a lease not the key's current one is fleet.ErrLease. It is
// safe for concurrent use.
func (s *Store) CompleteKey(ref policy.KeyRef, lease string, o policy.KeyOutcome, result string, expires time.Time) (policy.KeyRecordView, error) {
	if s.closed.Load() {
		return policy.KeyRecordView{}, ErrClosed
	}
	t := &s.keys
	t.mu.Lock()
	defer t.mu.Unlock()
	now := s.now()
	r, ok := t.recs[ref]
	if !ok || now >= r.Expires {
		return policy.KeyRecordView{}, fmt.Errorf("%w: idempotency key %q of tenant %q", ErrNotFound, ref.Key, ref.Tenant)
	}
	id, err := strconv.ParseUint(lease, 16, 64)
	if err != nil {
		return policy.KeyRecordView{}, fleet.ErrLease
	}
	next := *r
	if err := next.Complete(now, id, o, result, expires.UnixNano()); err != nil {
		return policy.KeyRecordView{}, err
	}
	if err := s.update("write idempotency key", func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketIdemKeys).Put(joinKey(ref.Tenant, ref.Key), encodeKeyRecord(&next))
	}); err != nil {
		return policy.KeyRecordView{}, err
	}
	next.Result = cloneString(next.Result)
	*r = next
	return keyView(ref, r), nil
}

// Key returns ref's record; an unknown or expired one is ErrNotFound. It is
// safe for concurrent use.
func (s *Store) Key(ref policy.KeyRef) (policy.KeyRecordView, error) {
	if s.closed.Load() {
		return policy.KeyRecordView{}, ErrClosed
	}
	t := &s.keys
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.recs[ref]
	if !ok || s.now() >= r.Expires {
		return policy.KeyRecordView{}, fmt.Errorf("%w: idempotency key %q of tenant %q", ErrNotFound, ref.Key, ref.Tenant)
	}
	return keyView(ref, r), nil
}

func keyView(ref policy.KeyRef, r *fleet.KeyRecord) policy.KeyRecordView {
	v := policy.KeyRecordView{Ref: ref, State: r.State, Expires: time.Unix(0, r.Expires), ResultRef: r.Result}
	if r.LeaseUntil != 0 {
		v.LeaseUntil = time.Unix(0, r.LeaseUntil)
	}
	return v
}

// dropExpiredKeys deletes tenant's expired records from memory and disk
// and returns how many; t.mu is held.
func (s *Store) dropExpiredKeys(tenant string, now int64) int {
	t := &s.keys
	var gone []policy.KeyRef
	for ref, r := range t.recs {
		if ref.Tenant == tenant && now >= r.Expires {
			gone = append(gone, ref)
		}
	}
	if len(gone) == 0 {
		return 0
	}
	err := s.updateFreeing("delete idempotency keys", func(tx *bbolt.Tx) error {
		for _, ref := range gone {
			if err := tx.Bucket(bucketIdemKeys).Delete(joinKey(ref.Tenant, ref.Key)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0
	}
	for _, ref := range gone {
		delete(t.recs, ref)
	}
	t.perTenant[tenant] -= len(gone)
	return len(gone)
}

func encodeKeyRecord(r *fleet.KeyRecord) []byte {
	v := make([]byte, 0, 26+len(r.Result))
	v = append(v, keyRecordVersion, byte(r.State))
	v = binary.BigEndian.AppendUint64(v, r.Lease)
	v = binary.BigEndian.AppendUint64(v, uint64(r.LeaseUntil))
	v = binary.BigEndian.AppendUint64(v, uint64(r.Expires))
	return append(v, r.Result...)
}

func decodeKeyRecord(v []byte) (fleet.KeyRecord, error) {
	if len(v) < 26 || v[0] != keyRecordVersion || v[1] == 0 || v[1] > byte(policy.KeyUnknown) {
		return fleet.KeyRecord{}, errors.New("want an idempotency record of version 1, at least 26 bytes, a known state")
	}
	return fleet.KeyRecord{State: policy.KeyState(v[1]), Lease: binary.BigEndian.Uint64(v[2:]),
		LeaseUntil: int64(binary.BigEndian.Uint64(v[10:])), Expires: int64(binary.BigEndian.Uint64(v[18:])),
		Result: string(v[26:])}, nil
}

// loadKeys reads the idemkeys bucket into memory, expired records too (a
// claim treats them as none; the per-tenant cap drops them).
func (s *Store) loadKeys(tx *bbolt.Tx) error {
	b := tx.Bucket(bucketIdemKeys)
	if b == nil {
		return nil // a file Open has not upgraded yet (Check reads it as it is)
	}
	return b.ForEach(func(k, v []byte) error {
		tenant, key, ok := splitKey(k)
		if !ok {
			return corrupt(bucketIdemKeys, k, errors.New("want key tenant 0x00 idempotency key"))
		}
		r, err := decodeKeyRecord(v)
		if err != nil {
			return corrupt(bucketIdemKeys, k, err)
		}
		s.keys.recs[policy.KeyRef{Tenant: tenant, Key: key}] = &r
		s.keys.perTenant[tenant]++
		return nil
	})
}

func cloneString(s string) string { return string(append([]byte(nil), s...)) }

// sweepKeys removes the expired idempotency records from memory and
// returns them for deletion from disk. It runs inside the flush
// transaction, so it only tries the table's lock: ClaimKey holds it while
// it waits for a write transaction, and a busy table is swept next time.
func (s *Store) sweepKeys(now int64) []delKey {
	t := &s.keys
	if !t.mu.TryLock() {
		return nil
	}
	defer t.mu.Unlock()
	var dels []delKey
	for ref, r := range t.recs {
		if now >= r.Expires {
			delete(t.recs, ref)
			t.perTenant[ref.Tenant]--
			dels = append(dels, delKey{bucket: bucketIdemKeys, key: policy.BreakerKey{Tenant: ref.Tenant, Target: ref.Key}})
		}
	}
	return dels
}

// randUint64 returns a random number from crypto/rand, for lease ids.
func randUint64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}
