package breakerstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// bucketFlow holds the fleet-wide ceilings (leases and rate account) per
// breaker key; see doc.go.
var bucketFlow = []byte("flow")

// flowRecordV2 is the version byte of a flow record: version, the rate
// account's TAT (Unix ns, int64), stray releases (uint64), the adaptive
// ceiling (fleet.AdaptiveLimit: the limit as IEEE 754 bits, the last
// decrease in Unix ns, the outcomes since, the decreases so far, 8 bytes
// each), lease count (uint32), then per lease its 16-byte id and expiry
// (Unix ns, int64), all big-endian. Version 1, written before the adaptive
// ceiling, is the same without its 32 bytes; it is still read (a limit
// that never started) and rewritten as version 2 by the step to schema
// version 3.
const (
	flowRecordV1 = 1
	flowRecordV2 = 2
)

// flowHeaderV1 and flowHeader are the sizes of a flow record of version 1
// and 2 before its leases.
const (
	flowHeaderV1 = 1 + 8 + 8 + 4
	flowHeader   = flowHeaderV1 + 4*8
)

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
// ceiling under key (the adaptive ceiling's current Ceiling when
// lim.Adaptive has one), then asks the breaker; a breaker that refuses gets
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
// an error; under a key that has no ceiling state it is only ignored. With
// an adaptive ceiling (lim.Adaptive.Max set) sig, what the attempt's
// outcome tells it, is applied by fleet.Flow.Release at the store's clock
// in the same locked step as the release, also for a lease no longer
// held; a signal for a key without ceiling state starts it (within the
// per-tenant cap, as AdmitFlow does). Like the leases, the adaptive
// ceiling is a counter: flushed per the sync mode. It is safe for
// concurrent use.
func (s *Store) ReleaseLease(key policy.BreakerKey, id string, lim policy.FlowLimits, sig policy.FlowSignal) (bool, error) {
	return s.releaseLease(key, id, lim, sig)
}

// ReleaseLeases is ReleaseLease of each of rs in order: held[i] and errs[i]
// its answer for rs[i]. From memory, so one after another costs nothing
// more.
func (s *Store) ReleaseLeases(rs []policy.LeaseRelease, held []bool, errs []error) {
	for i := range rs {
		r := &rs[i]
		held[i], errs[i] = s.releaseLease(r.Key, r.ID, r.Limits, r.Signal)
	}
}

func (s *Store) releaseLease(key policy.BreakerKey, id string, lim policy.FlowLimits, sig policy.FlowSignal) (bool, error) {
	if s.closed.Load() {
		return false, ErrClosed
	}
	lp, ok := s.pools.get(key)
	if !ok {
		if err := checkBreakerKey(key); err != nil {
			return false, err
		}
		if lim.Adaptive.Max == 0 || sig == policy.SignalNone {
			return false, nil // counted by the caller, which sees held false
		}
		var err error
		if lp, err = s.pool(key); err != nil {
			return false, err
		}
	}
	now := s.now()
	lp.mu.Lock()
	held, e := lp.v.Release(now, id, &lim, sig)
	return held, s.settlePool(lp, e)
}

// Pool returns the state of the concurrency ceiling under key: its live
// leases, stray releases and the adaptive ceiling's exact value and
// decreases; the zero status when it has none. It is safe for concurrent
// use.
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
	return policy.PoolStatus{InFlight: lp.v.Pool.Live(now), Stray: lp.v.Pool.Stray,
		Adaptive: lp.v.Adaptive.Limit, Decreases: lp.v.Adaptive.Decreases}, nil
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
	if len(lp.v.Pool.Leases) == 0 && lp.v.Pool.Stray == 0 && lp.v.Rate.TAT == 0 && lp.v.Adaptive == (fleet.AdaptiveLimit{}) {
		return 1, tx.Bucket(bucketFlow).Delete(k)
	}
	return 1, tx.Bucket(bucketFlow).Put(k, encodeFlow(&lp.v))
}

func encodeFlow(f *fleet.Flow) []byte {
	be := binary.BigEndian
	v := make([]byte, 0, flowHeader+24*len(f.Pool.Leases))
	v = append(v, flowRecordV2)
	v = be.AppendUint64(v, uint64(f.Rate.TAT))
	v = be.AppendUint64(v, f.Pool.Stray)
	v = be.AppendUint64(v, math.Float64bits(f.Adaptive.Limit))
	v = be.AppendUint64(v, uint64(f.Adaptive.LastDecrease))
	v = be.AppendUint64(v, uint64(f.Adaptive.Since))
	v = be.AppendUint64(v, f.Adaptive.Decreases)
	v = be.AppendUint32(v, uint32(len(f.Pool.Leases)))
	for _, l := range f.Pool.Leases {
		v = append(v, l.ID[:]...)
		v = be.AppendUint64(v, uint64(l.Expiry))
	}
	return v
}

// decodeFlow reads a flow record of version 2, or of version 1 (without
// an adaptive ceiling: one that never started).
func decodeFlow(v []byte) (fleet.Flow, error) {
	header := flowHeader
	switch {
	case len(v) > 0 && v[0] == flowRecordV1:
		header = flowHeaderV1
	case len(v) > 0 && v[0] == flowRecordV2:
	default:
		return fleet.Flow{}, fmt.Errorf("flow record of %d bytes, want at least %d of version %d", len(v), flowHeader, flowRecordV2)
	}
	if len(v) < header {
		return fleet.Flow{}, fmt.Errorf("flow record of %d bytes, want at least %d of version %d", len(v), header, v[0])
	}
	be := binary.BigEndian
	var f fleet.Flow
	f.Rate.TAT = int64(be.Uint64(v[1:]))
	f.Pool.Stray = be.Uint64(v[9:])
	if v[0] == flowRecordV2 {
		a := &f.Adaptive
		a.Limit = math.Float64frombits(be.Uint64(v[17:]))
		a.LastDecrease, a.Since = int64(be.Uint64(v[25:])), int64(be.Uint64(v[33:]))
		a.Decreases = be.Uint64(v[41:])
		if math.IsNaN(a.Limit) || math.IsInf(a.Limit, 0) || a.Limit < 0 || a.Since < 0 {
			return fleet.Flow{}, fmt.Errorf("flow record with an adaptive limit of %v after %d outcomes", a.Limit, a.Since)
		}
	}
	n := be.Uint32(v[header-4:])
	if want := uint64(header) + 24*uint64(n); uint64(len(v)) != want {
		return fleet.Flow{}, fmt.Errorf("flow record of %d bytes for %d leases, want %d", len(v), n, want)
	}
	f.Pool.Leases = make([]fleet.Lease, n)
	for i := range f.Pool.Leases {
		o := header + 24*i
		copy(f.Pool.Leases[i].ID[:], v[o:o+16])
		f.Pool.Leases[i].Expiry = int64(be.Uint64(v[o+16:]))
	}
	return f, nil
}

// migrateFlow rewrites every flow record of version 1 as version 2, an
// adaptive ceiling that never started; a record that does not decode is
// left for Open's load to refuse, naming it.
func migrateFlow(tx *bbolt.Tx) error {
	b := tx.Bucket(bucketFlow)
	if b == nil {
		return nil
	}
	var keys, vals [][]byte
	err := b.ForEach(func(k, v []byte) error {
		if len(v) == 0 || v[0] != flowRecordV1 {
			return nil
		}
		f, err := decodeFlow(v)
		if err != nil {
			return nil
		}
		keys, vals = append(keys, bytes.Clone(k)), append(vals, encodeFlow(&f))
		return nil
	})
	for i := range keys {
		if err == nil {
			err = b.Put(keys[i], vals[i])
		}
	}
	return err
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
