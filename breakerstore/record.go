package breakerstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// breakerRecordV2 is the version byte of the breaker record, a
// fleet.Breaker:
//
//	off  size  field
//	0    1     version (2)
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
//	204  8     generation (state transitions so far), uint64
//	212  2     permit count n, uint16
//	214  24n   permits x (id 16 bytes, expiry Unix ns int64)
//
// Version 1, read but no longer written, had no generation (read as 0) and
// 16-byte permits (id uint64, expiry); its permits are dropped on load, as
// their ids can no longer be presented, and their slots freed.
const (
	breakerRecordV1 = 1
	breakerRecordV2 = 2
)

const (
	breakerFixedLenV1 = 206
	breakerFixedLen   = 214
	permitLen         = 24
)

// encode returns b's record; b.mu must be held.
func (b *breaker) encode() []byte {
	v := &b.v
	buf := make([]byte, 0, breakerFixedLen+permitLen*len(v.Permits))
	buf = append(buf, breakerRecordV2, byte(v.State), boolByte(v.Forced), byte(v.Mode))
	buf = binary.BigEndian.AppendUint64(buf, uint64(v.OpenUntil))
	buf = binary.BigEndian.AppendUint64(buf, uint64(v.Changed))
	buf = binary.BigEndian.AppendUint64(buf, uint64(v.Cooldown.Until))
	buf = binary.BigEndian.AppendUint32(buf, uint32(v.Consecutive))
	buf = binary.BigEndian.AppendUint32(buf, uint32(v.HalfOpenOK))
	buf = binary.BigEndian.AppendUint64(buf, uint64(v.SlotWidth))
	for _, sl := range v.Slots {
		buf = binary.BigEndian.AppendUint64(buf, uint64(sl.Epoch))
		buf = binary.BigEndian.AppendUint32(buf, sl.Calls)
		buf = binary.BigEndian.AppendUint32(buf, sl.Failures)
	}
	buf = binary.BigEndian.AppendUint64(buf, v.Generation)
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(v.Permits)))
	for _, p := range v.Permits {
		buf = append(buf, p.ID[:]...)
		buf = binary.BigEndian.AppendUint64(buf, uint64(p.Expiry))
	}
	return buf
}

// decodeBreaker parses a record written by encode (or a version 1 record)
// into b.
func decodeBreaker(b *breaker, rec []byte) error {
	if len(rec) < 1 || (rec[0] != breakerRecordV1 && rec[0] != breakerRecordV2) {
		return fmt.Errorf("breaker record version %v, want %d or %d", rec[:min(len(rec), 1)], breakerRecordV1, breakerRecordV2)
	}
	ver := rec[0]
	fixed := breakerFixedLen
	if ver == breakerRecordV1 {
		fixed = breakerFixedLenV1
	}
	if len(rec) < fixed {
		return fmt.Errorf("breaker record is %d bytes, want at least %d", len(rec), fixed)
	}
	v := &b.v
	v.State = policy.BreakerState(rec[1])
	if v.State < policy.BreakerClosed || v.State > policy.BreakerDisabled {
		return fmt.Errorf("breaker state %d out of range", rec[1])
	}
	if rec[2] > 1 {
		return fmt.Errorf("breaker forced flag %d is not 0 or 1", rec[2])
	}
	v.Forced = rec[2] == 1
	v.Mode = policy.BreakerMode(rec[3])
	be := binary.BigEndian
	v.OpenUntil = int64(be.Uint64(rec[4:]))
	v.Changed = int64(be.Uint64(rec[12:]))
	v.Cooldown.Until = int64(be.Uint64(rec[20:]))
	v.Consecutive = int(be.Uint32(rec[28:]))
	v.HalfOpenOK = int(be.Uint32(rec[32:]))
	v.SlotWidth = int64(be.Uint64(rec[36:]))
	off := 44
	for i := range v.Slots {
		v.Slots[i] = fleet.Slot{Epoch: int64(be.Uint64(rec[off:])), Calls: be.Uint32(rec[off+8:]), Failures: be.Uint32(rec[off+12:])}
		off += 16
	}
	plen := 16
	if ver == breakerRecordV2 {
		v.Generation = be.Uint64(rec[off:])
		off += 8
		plen = permitLen
	}
	n := int(be.Uint16(rec[off:]))
	off += 2
	if len(rec) != off+plen*n {
		return fmt.Errorf("breaker record is %d bytes, want %d for %d permits", len(rec), off+plen*n, n)
	}
	v.Permits = nil
	if ver == breakerRecordV1 {
		return nil
	}
	v.Permits = make([]fleet.Permit, n)
	for i := range v.Permits {
		copy(v.Permits[i].ID[:], rec[off:off+16])
		v.Permits[i].Expiry = int64(be.Uint64(rec[off+16:]))
		off += permitLen
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
		s.tenants.breakers[tenant]++
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
		s.tenants.mu.Lock()
		if s.tenants.breakers[b.key.Tenant]--; s.tenants.breakers[b.key.Tenant] <= 0 {
			delete(s.tenants.breakers, b.key.Tenant)
			s.forgetAutoLocked(b.key.Tenant)
		}
		s.tenants.mu.Unlock()
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
		s.tenants.mu.Lock()
		s.forgetAutoLocked(tb.tenant)
		s.tenants.mu.Unlock()
		dels = append(dels, delKey{bucket: bucketTokens, key: policy.BreakerKey{Tenant: tb.tenant}})
	}
	if s.attempts.expire(now) && s.attempts.markDirty() {
		s.queue(&s.attempts)
	}
	dels = append(dels, s.sweepKeys(now)...)
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
		case string(bucketIdemKeys):
			// Only a record still expired on disk goes: one claimed anew
			// since the sweep has a later expiry.
			k = joinKey(d.key.Tenant, d.key.Target)
			if v := tx.Bucket(bucketIdemKeys).Get(k); v != nil {
				if r, err := decodeKeyRecord(v); err == nil && r.Expires > s.now() {
					continue
				}
			}
		case string(bucketRuns):
			// A run goes whole: header, spend and ledger, and every
			// call's disposition (keys "run id 0x00 call id").
			id := []byte(d.key.Tenant)
			if err := tx.Bucket(bucketRunState).Delete(id); err != nil {
				return err
			}
			prefix := joinKey(d.key.Tenant, "")
			for _, b := range [][]byte{bucketRunCalls, bucketCallTable} {
				calls := tx.Bucket(b).Cursor()
				for ck, _ := calls.Seek(prefix); ck != nil && bytes.HasPrefix(ck, prefix); ck, _ = calls.Seek(prefix) {
					if err := calls.Delete(); err != nil {
						return err
					}
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
