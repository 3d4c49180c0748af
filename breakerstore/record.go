package breakerstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/policy"
)

// breakerRecordV1 is the version byte of the breaker record:
//
//	off  size  field
//	0    1     version (1)
//	1    1     policy.BreakerState
//	2    1     forced (0/1)
//	3    1     policy.BreakerMode
//	4    8     open-until, Unix ns, int64 big-endian (0: none)
//	12   8     last state change, Unix ns
//	20   8     pushback cool-down end, Unix ns (0: none)
//	28   4     consecutive transient failures, uint32
//	32   4     HALF_OPEN successes, uint32
//	36   8     window slot width, ns
//	44   160   10 slots x (epoch int64, calls uint32, failures uint32)
//	204  2     permit count n, uint16
//	206  16n   permits x (id uint64, expiry Unix ns int64)
const breakerRecordV1 = 1

const breakerFixedLen = 206

// encode returns b's record; b.mu must be held.
func (b *breaker) encode() []byte {
	buf := make([]byte, 0, breakerFixedLen+16*len(b.permits))
	buf = append(buf, breakerRecordV1, byte(b.state), boolByte(b.forced), byte(b.mode))
	buf = binary.BigEndian.AppendUint64(buf, uint64(b.openUntil))
	buf = binary.BigEndian.AppendUint64(buf, uint64(b.changed))
	buf = binary.BigEndian.AppendUint64(buf, uint64(b.cooldownUntil))
	buf = binary.BigEndian.AppendUint32(buf, uint32(b.consecutive))
	buf = binary.BigEndian.AppendUint32(buf, uint32(b.halfOpenOK))
	buf = binary.BigEndian.AppendUint64(buf, uint64(b.slotWidth))
	for _, sl := range b.slots {
		buf = binary.BigEndian.AppendUint64(buf, uint64(sl.epoch))
		buf = binary.BigEndian.AppendUint32(buf, sl.calls)
		buf = binary.BigEndian.AppendUint32(buf, sl.failures)
	}
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(b.permits)))
	for _, p := range b.permits {
		buf = binary.BigEndian.AppendUint64(buf, p.id)
		buf = binary.BigEndian.AppendUint64(buf, uint64(p.expiry))
	}
	return buf
}

// decodeBreaker parses a record written by encode into b.
func decodeBreaker(b *breaker, v []byte) error {
	if len(v) < breakerFixedLen {
		return fmt.Errorf("breaker record is %d bytes, want at least %d", len(v), breakerFixedLen)
	}
	if v[0] != breakerRecordV1 {
		return fmt.Errorf("breaker record version %d, want %d", v[0], breakerRecordV1)
	}
	b.state = policy.BreakerState(v[1])
	if b.state < policy.BreakerClosed || b.state > policy.BreakerDisabled {
		return fmt.Errorf("breaker state %d out of range", v[1])
	}
	if v[2] > 1 {
		return fmt.Errorf("breaker forced flag %d is not 0 or 1", v[2])
	}
	b.forced = v[2] == 1
	b.mode = policy.BreakerMode(v[3])
	be := binary.BigEndian
	b.openUntil = int64(be.Uint64(v[4:]))
	b.changed = int64(be.Uint64(v[12:]))
	b.cooldownUntil = int64(be.Uint64(v[20:]))
	b.consecutive = int(be.Uint32(v[28:]))
	b.halfOpenOK = int(be.Uint32(v[32:]))
	b.slotWidth = int64(be.Uint64(v[36:]))
	off := 44
	for i := range b.slots {
		b.slots[i] = slot{epoch: int64(be.Uint64(v[off:])), calls: be.Uint32(v[off+8:]), failures: be.Uint32(v[off+12:])}
		off += 16
	}
	n := int(be.Uint16(v[off:]))
	off += 2
	if len(v) != off+16*n {
		return fmt.Errorf("breaker record is %d bytes, want %d for %d permits", len(v), off+16*n, n)
	}
	b.permits = make([]permit, n)
	for i := range b.permits {
		b.permits[i] = permit{id: be.Uint64(v[off:]), expiry: int64(be.Uint64(v[off+8:]))}
		off += 16
	}
	return nil
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// loadBreakers reads the breakers bucket into memory.
func (s *Store) loadBreakers(tx *bbolt.Tx, now int64) error {
	return tx.Bucket(bucketBreakers).ForEach(func(k, v []byte) error {
		tenant, target, ok := splitKey(k)
		if !ok || target == "" {
			return corrupt(bucketBreakers, k, errors.New("key is not tenant 0x00 target"))
		}
		b := &breaker{key: policy.BreakerKey{Tenant: tenant, Target: target}, lastActive: now}
		if err := decodeBreaker(b, v); err != nil {
			return corrupt(bucketBreakers, k, err)
		}
		snap := b.snapshot(now)
		b.pub.Store(&snap)
		s.breakers.put(b.key, b)
		s.perTenant[tenant]++
		return nil
	})
}

// delKey is a record the sweep removed from memory and must remove from disk.
type delKey struct {
	bucket []byte
	key    policy.BreakerKey // Tenant only for token buckets
}

// sweep removes idle breakers and idle default-budget token buckets from
// memory and returns their records for deletion. It runs inside the flush
// transaction, so a breaker re-created for the same key is written after
// the deletion.
func (s *Store) sweep(now int64) []delKey {
	ttl := s.opts.IdleTTL
	var dels []delKey
	for _, b := range s.breakers.values() {
		b.mu.Lock()
		drop := !b.deleted && b.idle(now, ttl)
		if drop {
			b.deleted = true
		}
		b.mu.Unlock()
		if !drop {
			continue
		}
		s.breakers.deleteIf(b.key, func(v *breaker) bool { return v == b })
		s.countMu.Lock()
		if s.perTenant[b.key.Tenant]--; s.perTenant[b.key.Tenant] <= 0 {
			delete(s.perTenant, b.key.Tenant)
			s.forgetAutoLocked(b.key.Tenant)
		}
		s.countMu.Unlock()
		dels = append(dels, delKey{bucket: bucketBreakers, key: b.key})
	}
	for _, tb := range s.buckets.values() {
		tb.mu.Lock()
		drop := !tb.deleted && tb.cfg == nil && now-tb.lastActive >= int64(ttl)
		if drop {
			tb.deleted = true
		}
		tb.mu.Unlock()
		if !drop {
			continue
		}
		s.buckets.deleteIf(tb.tenant, func(v *tokenBucket) bool { return v == tb })
		s.countMu.Lock()
		s.forgetAutoLocked(tb.tenant)
		s.countMu.Unlock()
		dels = append(dels, delKey{bucket: bucketTokens, key: policy.BreakerKey{Tenant: tb.tenant}})
	}
	keep := int64(s.opts.RunRetention)
	for _, r := range s.runs.values() {
		r.mu.Lock()
		drop := !r.deleted && now-r.cutoff >= keep
		if drop {
			r.deleted = true
		}
		r.mu.Unlock()
		if !drop {
			continue
		}
		s.runs.deleteIf(r.hdr.ID, func(v *run) bool { return v == r })
		dels = append(dels, delKey{bucket: bucketRuns, key: policy.BreakerKey{Tenant: r.hdr.ID}})
	}
	return dels
}

// deleteRecords removes swept records from disk, skipping keys that are back
// in memory.
func (s *Store) deleteRecords(tx *bbolt.Tx, dels []delKey) error {
	for _, d := range dels {
		var k []byte
		switch string(d.bucket) {
		case string(bucketBreakers):
			if _, ok := s.breakers.get(d.key); ok {
				continue
			}
			k = joinKey(d.key.Tenant, d.key.Target)
		case string(bucketTokens):
			if _, ok := s.buckets.get(d.key.Tenant); ok {
				continue
			}
			k = []byte(d.key.Tenant)
		case string(bucketRuns):
			// A run goes whole: header, spend and ledger, and every
			// call's disposition (keys "run id 0x00 call id").
			id := []byte(d.key.Tenant)
			if err := tx.Bucket(bucketRunState).Delete(id); err != nil {
				return err
			}
			calls := tx.Bucket(bucketRunCalls).Cursor()
			prefix := joinKey(d.key.Tenant, "")
			for ck, _ := calls.Seek(prefix); ck != nil && bytes.HasPrefix(ck, prefix); ck, _ = calls.Seek(prefix) {
				if err := calls.Delete(); err != nil {
					return err
				}
			}
			k = id
		}
		if err := tx.Bucket(d.bucket).Delete(k); err != nil {
			return err
		}
	}
	return nil
}
