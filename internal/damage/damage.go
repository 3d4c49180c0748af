// Package damage makes damaged copies of a policyd state file, for the tests
// of breakerstore.Open, breakerstore.Check and the daemon's refusal to start:
// a file cut short at several sizes, a zero-filled tail, bytes flipped in a
// meta, branch, leaf or freelist page or in a stored value, a foreign file
// and an empty one. It is imported only by tests.
package damage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// Marker is in the target of every policy Populate writes, so a case can
// find a stored value in the file.
const Marker = "damage-marker"

// Populate writes a state file at path with enough policies, budgets,
// breakers and audit records for its buckets to have branch pages, and with
// pages on the freelist (some budgets are deleted). clock stamps the audit
// records.
func Populate(path string, now time.Time) error {
	s, err := breakerstore.Open(breakerstore.Options{Path: path, Clock: fixed(now)})
	if err != nil {
		return err
	}
	for i := range 600 {
		p := policy.Default()
		if _, err := s.SetPolicy(fmt.Sprintf("tenant-%03d", i%40), fmt.Sprintf("%s-%04d", Marker, i), p); err != nil {
			return errors.Join(err, s.Close())
		}
	}
	for i := range 200 {
		b := policy.TenantBudget{Tenant: fmt.Sprintf("budget-%03d", i), Capacity: float64(10 + i)}
		if _, err := s.SetBudget(b); err != nil {
			return errors.Join(err, s.Close())
		}
	}
	for i := range 100 {
		if err := s.DeleteBudget(fmt.Sprintf("budget-%03d", 2*i)); err != nil {
			return errors.Join(err, s.Close())
		}
	}
	for i := range 30 {
		key := policy.BreakerKey{Tenant: "tenant-000", Target: fmt.Sprintf("forced-%02d", i)}
		if _, err := s.ForceBreaker(key, policy.BreakerOpen); err != nil {
			return errors.Join(err, s.Close())
		}
	}
	recs := make([]policy.AuditRecord, 3000)
	for i := range recs {
		recs[i] = policy.AuditRecord{Event: policy.AuditDecision, Tenant: "tenant-001", Target: "geo",
			CallID: fmt.Sprintf("call-%d", i), Attempt: 1, Verdict: policy.VerdictRetry, Delay: time.Second}
	}
	s.AppendAudit(recs...)
	if err := s.Flush(); err != nil {
		return errors.Join(err, s.Close())
	}
	return s.Close()
}

type fixed time.Time

func (c fixed) Now() time.Time { return time.Time(c) }

// Case is one kind of damage: Make returns a damaged copy of good, the
// bytes of a sound state file.
type Case struct {
	Name string
	Make func(good []byte) ([]byte, error)
}

// Cases returns every kind of damage the tests make.
func Cases() []Case {
	cut := func(name string, size func(used int) int) Case {
		return Case{name, func(good []byte) ([]byte, error) {
			used, err := usedBytes(good)
			if err != nil {
				return nil, err
			}
			return bytes.Clone(good[:size(used)]), nil
		}}
	}
	flip := func(name string, find func(good []byte) (int, error)) Case {
		return Case{name, func(good []byte) ([]byte, error) {
			at, err := find(good)
			if err != nil {
				return nil, err
			}
			out := bytes.Clone(good)
			for i := at; i < at+8; i++ {
				out[i] ^= 0xff
			}
			return out, nil
		}}
	}
	pageOf := func(flags uint16, at int) func([]byte) (int, error) {
		return func(good []byte) (int, error) {
			id, err := findPage(good, flags)
			if err != nil {
				return 0, err
			}
			return int(id)*pageSize(good) + at, nil
		}
	}
	return []Case{
		cut("truncated to 20000 bytes", func(int) int { return 20000 }),
		cut("truncated to three pages", func(int) int { return 3 * 4096 }),
		cut("truncated to half", func(used int) int { return used / 2 }),
		cut("truncated by one page", func(used int) int { return used - 4096 }),
		cut("truncated by one byte", func(used int) int { return used - 1 }),
		{"zero-filled tail", func(good []byte) ([]byte, error) {
			used, err := usedBytes(good)
			if err != nil {
				return nil, err
			}
			out := bytes.Clone(good)
			clear(out[used-used/4 : used])
			return out, nil
		}},
		flip("flipped bytes in meta page 0", func([]byte) (int, error) { return 40, nil }),
		flip("flipped bytes in meta page 1", func(good []byte) (int, error) { return pageSize(good) + 40, nil }),
		flip("flipped bytes in a branch page", pageOf(flagBranch, 16)),
		flip("flipped bytes in a leaf page", pageOf(flagLeaf, 16)),
		flip("flipped bytes in the freelist page", func(good []byte) (int, error) {
			return int(freelist(good))*pageSize(good) + 8, nil
		}),
		flip("flipped bytes in a policy value", func(good []byte) (int, error) {
			// A policy's JSON value follows its key, which ends in the
			// marker's target name: flip its first bytes.
			key := []byte(Marker + "-0007")
			free := freeIDs(good)
			for at := 0; ; {
				i := bytes.Index(good[at:], key)
				if i < 0 {
					return 0, errors.New("no policy value after the marker in a page in use")
				}
				at += i + len(key)
				id := uint64(at / pageSize(good))
				if at < len(good) && good[at] == '{' && !free[id] {
					return at, nil
				}
			}
		}),
		{"foreign file", func([]byte) ([]byte, error) {
			return bytes.Repeat([]byte("this is not a bbolt database\n"), 1000), nil
		}},
		{"empty file", func([]byte) ([]byte, error) { return []byte{}, nil }},
	}
}

const (
	flagBranch = 0x01
	flagLeaf   = 0x02
)

var native = binary.NativeEndian

func pageSize(f []byte) int { return int(native.Uint32(f[24:])) }

// meta returns the meta page bbolt uses, the one with the higher txid.
func meta(f []byte) []byte {
	m0, m1 := f, f[pageSize(f):]
	if native.Uint64(m1[64:]) > native.Uint64(m0[64:]) {
		return m1
	}
	return m0
}

func hwm(f []byte) uint64      { return native.Uint64(meta(f)[56:]) }
func freelist(f []byte) uint64 { return native.Uint64(meta(f)[48:]) }

// usedBytes is the part of the file below the high-water mark; bbolt may
// have grown the file beyond it.
func usedBytes(f []byte) (int, error) {
	if len(f) < 4096 {
		return 0, errors.New("not a bbolt file")
	}
	n := int(hwm(f)) * pageSize(f)
	if n > len(f) {
		return 0, fmt.Errorf("high-water mark %d pages past the file's %d bytes", hwm(f), len(f))
	}
	return n, nil
}

// findPage returns the id of the first page with the given flags whose
// header names it, past the meta pages.
func findPage(f []byte, flags uint16) (uint64, error) {
	ps := pageSize(f)
	free := freeIDs(f)
	for id := uint64(2); id < hwm(f); id++ {
		p := f[int(id)*ps:]
		if !free[id] && native.Uint64(p) == id && native.Uint16(p[8:]) == flags && native.Uint16(p[10:]) > 1 {
			return id, nil
		}
	}
	return 0, fmt.Errorf("no page with flags %#x", flags)
}

// freeIDs returns the pages the freelist lists: they keep the content they
// had, and damage there would go unnoticed.
func freeIDs(f []byte) map[uint64]bool {
	p := f[int(freelist(f))*pageSize(f):]
	start, count := 16, int(native.Uint16(p[10:]))
	if count == 0xFFFF {
		count, start = int(native.Uint64(p[16:])), 24
	}
	free := make(map[uint64]bool, count)
	for i := range count {
		free[native.Uint64(p[start+8*i:])] = true
	}
	return free
}
