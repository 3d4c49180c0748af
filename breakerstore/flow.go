package breakerstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// bucketFlow holds the fleet-wide ceilings (leases and rate account) per
// breaker key; see doc.go.
var bucketFlow = []byte("flow")

// flowRecordV1 is the version byte of a flow record: version, the rate
// account's TAT (Unix ns, int64), stray releases (uint64), lease count
// (uint32), then per lease its 16-byte id and expiry (Unix ns, int64), all
// big-endian.
const flowRecordV1 = 1

// flowHeader is the size of a flow record before its leases.
const flowHeader = 1 + 8 + 8 + 4

// leasePool holds one key's ceilings, whose rules live in fleet.Flow; mu
// guards every field but key. Lock order: a bbolt write transaction, then
// a breaker's mu, then mu; never both at once here.
type leasePool struct {
	mu    sync.Mutex
	key   policy.BreakerKey
	v     fleet.Flow
	dirty bool
}

// AdmitFlow is Admit for a target with fleet-wide ceilings (lim): by
// fleet.Flow's rules it takes a rate slot and a lease of the concurrency
// ceiling under key, then asks the breaker; a breaker that refuses gets
// both back at once, so a refused attempt holds nothing. A ceiling that is
// out refuses (fleet.ReasonRate with the exact wait, fleet.ReasonFull with
// lim.FullWait or less) without asking the breaker. An admitted attempt's
// Admission carries the lease in LeaseID and LeaseExpiry and the breaker's
// state, reason and probe permit. Leases and the rate account are
// counters: they are flushed per the sync mode like probe permits (a crash
// forgets those handed out in the last flush interval). AdmitFlow is safe
// for concurrent use.
func (s *Store) AdmitFlow(key policy.BreakerKey, cfg policy.BreakerConfig, lim policy.FlowLimits) (policy.Admission, error) {
	if s.closed.Load() {
		return policy.Admission{}, ErrClosed
	}
	if lim.Ceiling < 0 || lim.Interval < 0 || (lim.Ceiling == 0 && lim.Interval == 0) {
		return policy.Admission{}, invalid("flow", "must set a concurrency or a rate ceiling")
	}
	lp, err := s.pool(key)
	if err != nil {
		return policy.Admission{}, err
	}
	now := s.now()
	lp.mu.Lock()
	fa, e := lp.v.Admit(now, &lim, s.newPermitID)
	if err := s.settlePool(lp, e); err != nil {
		return policy.Admission{}, err
	}
	if !fa.Admitted {
		return fa, nil
	}
	a, err := s.Admit(key, cfg)
	if err != nil || !a.Admitted {
		lp.mu.Lock()
		if uerr := s.settlePool(lp, lp.v.Undo(s.now(), &lim, &fa)); uerr != nil && err == nil {
			err = uerr
		}
		return a, err
	}
	a.LeaseID, a.LeaseExpiry = fa.LeaseID, fa.LeaseExpiry
	return a, nil
}

// ReleaseLease returns the lease id of the ceiling under key and reports
// whether it was held. A lease not held (expired, returned before, never
// handed out) is ignored and counted in the pool's PoolStatus.Stray, never
// an error; under a key that has no ceiling state it is only ignored. It is safe for concurrent use.
// TODO(adaptive): apply sig to the key's fleet.AdaptiveLimit under lim.Adaptive.
func (s *Store) ReleaseLease(key policy.BreakerKey, id string, lim policy.FlowLimits, sig policy.FlowSignal) (bool, error) {
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
	held, e := lp.v.Pool.Release(now, id)
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
	return policy.PoolStatus{InFlight: lp.v.Pool.Live(now), Stray: lp.v.Pool.Stray}, nil
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
	return s.changed(nil, lp, newlyDirty)
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
	if len(lp.v.Pool.Leases) == 0 && lp.v.Pool.Stray == 0 && lp.v.Rate.TAT == 0 {
		return 1, tx.Bucket(bucketFlow).Delete(k)
	}
	return 1, tx.Bucket(bucketFlow).Put(k, encodeFlow(&lp.v))
}

func encodeFlow(f *fleet.Flow) []byte {
	v := make([]byte, 0, flowHeader+24*len(f.Pool.Leases))
	v = append(v, flowRecordV1)
	v = binary.BigEndian.AppendUint64(v, uint64(f.Rate.TAT))
	v = binary.BigEndian.AppendUint64(v, f.Pool.Stray)
	v = binary.BigEndian.AppendUint32(v, uint32(len(f.Pool.Leases)))
	for _, l := range f.Pool.Leases {
		v = append(v, l.ID[:]...)
		v = binary.BigEndian.AppendUint64(v, uint64(l.Expiry))
	}
	return v
}

func decodeFlow(v []byte) (fleet.Flow, error) {
	if len(v) < flowHeader || v[0] != flowRecordV1 {
		return fleet.Flow{}, fmt.Errorf("flow record of %d bytes, want at least %d of version %d", len(v), flowHeader, flowRecordV1)
	}
	be := binary.BigEndian
	var f fleet.Flow
	f.Rate.TAT = int64(be.Uint64(v[1:]))
	f.Pool.Stray = be.Uint64(v[9:])
	n := be.Uint32(v[17:])
	if want := flowHeader + 24*uint64(n); uint64(len(v)) != want {
		return fleet.Flow{}, fmt.Errorf("flow record of %d bytes for %d leases, want %d", len(v), n, want)
	}
	f.Pool.Leases = make([]fleet.Lease, n)
	for i := range f.Pool.Leases {
		o := flowHeader + 24*i
		copy(f.Pool.Leases[i].ID[:], v[o:o+16])
		f.Pool.Leases[i].Expiry = int64(be.Uint64(v[o+16:]))
	}
	return f, nil
}

// loadFlow reads the flow bucket into memory; leases already expired no
// longer count and are dropped with the next change.
func (s *Store) loadFlow(tx *bbolt.Tx) error {
	b := tx.Bucket(bucketFlow)
	if b == nil {
		return nil // a file Open has not brought to this layout yet (Check reads it as it is)
	}
	return b.ForEach(func(k, v []byte) error {
		tenant, target, ok := splitKey(k)
		if !ok || target == "" {
			return corrupt(bucketFlow, k, errors.New("key is not tenant 0x00 target"))
		}
		f, err := decodeFlow(v)
		if err != nil {
			return corrupt(bucketFlow, k, err)
		}
		key := policy.BreakerKey{Tenant: tenant, Target: target}
		s.pools.put(key, &leasePool{key: key, v: f})
		return nil
	})
}
