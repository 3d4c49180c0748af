package breakerstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// bucketLeases holds the concurrency leases per breaker key; see doc.go.
var bucketLeases = []byte("leases")

// leasesRecordV1 is the version byte of a leases record: version, stray
// releases (uint64), lease count (uint32), then per lease its 16-byte id
// and expiry (Unix ns, int64), all big-endian.
const leasesRecordV1 = 1

// leasePool holds one concurrency ceiling's leases, whose rules live in
// fleet.Pool; mu guards every field but key. Lock order: a bbolt write
// transaction, then a breaker's mu, then mu; never both at once here.
type leasePool struct {
	mu    sync.Mutex
	key   policy.BreakerKey
	v     fleet.Pool
	dirty bool
}

// AdmitLease is Admit for a target with a concurrency ceiling: it takes a
// lease of the ceiling under key (ceiling leases at most live, each
// expiring after ttl), then asks the breaker; a breaker that refuses gets
// the lease back at once, so a refused attempt holds nothing. A full
// ceiling refuses with fleet.ReasonFull and a RetryAfter of wait or less
// (the earliest lease expiry) without asking the breaker. The Admission of
// an admitted attempt carries the lease in LeaseID and LeaseExpiry and the
// breaker's state, reason and probe permit. Leases are counters: they are
// flushed per the sync mode like probe permits (a crash forgets those
// handed out in the last flush interval). AdmitLease is safe for
// concurrent use.
func (s *Store) AdmitLease(key policy.BreakerKey, cfg policy.BreakerConfig, ceiling int, ttl, wait time.Duration) (policy.Admission, error) {
	if s.closed.Load() {
		return policy.Admission{}, ErrClosed
	}
	if ceiling < 1 {
		return policy.Admission{}, invalid("max_in_flight", "must be >= 1")
	}
	lp, err := s.pool(key)
	if err != nil {
		return policy.Admission{}, err
	}
	now := s.now()
	lp.mu.Lock()
	la, e := lp.v.Acquire(now, ceiling, int64(ttl), int64(wait), s.newPermitID)
	if err := s.settlePool(lp, e); err != nil {
		return policy.Admission{}, err
	}
	if !la.Admitted {
		return la, nil
	}
	a, err := s.Admit(key, cfg)
	if err != nil || !a.Admitted {
		if _, rerr := s.releaseLease(lp, la.LeaseID); rerr != nil && err == nil {
			err = rerr
		}
		return a, err
	}
	a.LeaseID, a.LeaseExpiry = la.LeaseID, la.LeaseExpiry
	return a, nil
}

// ReleaseLease returns the lease id of the ceiling under key and reports
// whether it was held. A lease not held (expired, returned before, never
// handed out) is ignored and counted in the pool's PoolStatus.Stray, never
// an error; under a key that has no ceiling state it is only ignored. It is safe for concurrent use.
func (s *Store) ReleaseLease(key policy.BreakerKey, id string) (bool, error) {
	if s.closed.Load() {
		return false, ErrClosed
	}
	lp, ok := s.pools.get(key)
	if !ok {
		if err := checkBreakerKey(key); err != nil {
			return false, err
		}
		return false, nil // counted by the caller, which sees held false
	}
	return s.releaseLease(lp, id)
}

// releaseLease releases id in lp and makes the change durable per the sync
// mode.
func (s *Store) releaseLease(lp *leasePool, id string) (bool, error) {
	now := s.now()
	lp.mu.Lock()
	held, e := lp.v.Release(now, id)
	return held, s.settlePool(lp, e)
}

// Pool returns the state of the concurrency ceiling under key: its live
// leases and stray releases; the zero status when it has none. It is safe
// for concurrent use.
func (s *Store) Pool(key policy.BreakerKey) (policy.PoolStatus, error) {
	if s.closed.Load() {
		return policy.PoolStatus{}, ErrClosed
	}
	lp, ok := s.pools.get(key)
	if !ok {
		return policy.PoolStatus{}, nil
	}
	now := s.now()
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return policy.PoolStatus{InFlight: lp.v.Live(now), Stray: lp.v.Stray}, nil
}

// pool returns the ceiling under key, creating it on first use. A new
// ceiling is made only for a key that has, or may create, a breaker (the
// per-tenant cap), so a tenant past its cap cannot fill memory with them.
func (s *Store) pool(key policy.BreakerKey) (*leasePool, error) {
	if lp, ok := s.pools.get(key); ok {
		return lp, nil
	}
	b, err := s.lockBreaker(key, true, s.now())
	if err != nil {
		return nil, err
	}
	b.mu.Unlock()
	return s.pools.getOrCreate(key, func() (*leasePool, error) {
		return &leasePool{key: b.key}, nil
	})
}

// settlePool unlocks lp, which the caller changed as e says, and makes the
// change durable as the sync mode asks.
func (s *Store) settlePool(lp *leasePool, e fleet.Effect) error {
	newlyDirty := false
	if e != 0 && !lp.dirty {
		lp.dirty, newlyDirty = true, true
	}
	lp.mu.Unlock()
	if e == 0 {
		return nil
	}
	return s.touched(lp, newlyDirty)
}

// redirty implements entity.
func (lp *leasePool) redirty() bool {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if lp.dirty {
		return false
	}
	lp.dirty = true
	return true
}

// write implements entity: the record, or its deletion when the pool holds
// nothing worth keeping.
func (lp *leasePool) write(tx *bbolt.Tx, clear bool) (int, error) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if clear {
		lp.dirty = false
	}
	k := joinKey(lp.key.Tenant, lp.key.Target)
	if len(lp.v.Leases) == 0 && lp.v.Stray == 0 {
		return 1, tx.Bucket(bucketLeases).Delete(k)
	}
	return 1, tx.Bucket(bucketLeases).Put(k, encodePool(&lp.v))
}

func encodePool(p *fleet.Pool) []byte {
	v := make([]byte, 0, 13+24*len(p.Leases))
	v = append(v, leasesRecordV1)
	v = binary.BigEndian.AppendUint64(v, p.Stray)
	v = binary.BigEndian.AppendUint32(v, uint32(len(p.Leases)))
	for _, l := range p.Leases {
		v = append(v, l.ID[:]...)
		v = binary.BigEndian.AppendUint64(v, uint64(l.Expiry))
	}
	return v
}

func decodePool(v []byte) (fleet.Pool, error) {
	if len(v) < 13 || v[0] != leasesRecordV1 {
		return fleet.Pool{}, fmt.Errorf("leases record of %d bytes, want at least 13 of version %d", len(v), leasesRecordV1)
	}
	be := binary.BigEndian
	p := fleet.Pool{Stray: be.Uint64(v[1:])}
	n := be.Uint32(v[9:])
	if uint64(len(v)) != 13+24*uint64(n) {
		return fleet.Pool{}, fmt.Errorf("leases record of %d bytes for %d leases, want %d", len(v), n, 13+24*uint64(n))
	}
	p.Leases = make([]fleet.Lease, n)
	for i := range p.Leases {
		o := 13 + 24*i
		copy(p.Leases[i].ID[:], v[o:o+16])
		p.Leases[i].Expiry = int64(be.Uint64(v[o+16:]))
	}
	return p, nil
}

// loadLeases reads the leases bucket into memory; leases already expired
// no longer count and are dropped with the next change.
func (s *Store) loadLeases(tx *bbolt.Tx) error {
	b := tx.Bucket(bucketLeases)
	if b == nil {
		return nil // a file Open has not brought to this layout yet (Check reads it as it is)
	}
	return b.ForEach(func(k, v []byte) error {
		tenant, target, ok := splitKey(k)
		if !ok || target == "" {
			return corrupt(bucketLeases, k, errors.New("key is not tenant 0x00 target"))
		}
		p, err := decodePool(v)
		if err != nil {
			return corrupt(bucketLeases, k, err)
		}
		key := policy.BreakerKey{Tenant: tenant, Target: target}
		s.pools.put(key, &leasePool{key: key, v: p})
		return nil
	})
}
