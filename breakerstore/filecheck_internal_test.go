//go:build unix

package breakerstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// TestGuardedTurnsAFaultIntoAnError reads a mapping past the end of its
// file, the fault bbolt met in a truncated file, and panics outright:
// guarded returns ErrCorrupt naming the file for both.
func TestGuardedTurnsAFaultIntoAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "short.db")
	if err := os.WriteFile(path, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := syscall.Mmap(int(f.Fd()), 0, 3*4096, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	var sink byte
	for name, fn := range map[string]func() error{
		"fault": func() error { sink = m[2*4096+8]; return nil },
		"panic": func() error { var p []int; sink = byte(p[3]); return nil },
	} {
		err, panicked := guarded(path, fn)
		if !panicked || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: got %v (panicked %v), want ErrCorrupt naming %s", name, err, panicked, path)
		}
	}
	_ = sink
}

// FuzzVerifyFile mutates a real state file. verifyFile must never panic,
// and a file it finds sound must be one Check (bbolt's own check in a
// goroutine of its own, where a fault would kill the process, then the
// loaders) reads without a panic or a fault.
func FuzzVerifyFile(f *testing.F) {
	path := filepath.Join(f.TempDir(), "seed.db")
	s, err := Open(Options{Path: path})
	if err != nil {
		f.Fatal(err)
	}
	for i := range 40 {
		if _, err := s.SetPolicy(fmt.Sprintf("tenant-%d", i), fmt.Sprintf("target-%d", i), policy.Default()); err != nil {
			f.Fatal(err)
		}
	}
	s.AppendAudit(policy.AuditRecord{Tenant: "acme", CallID: "c1", Event: policy.AuditDecision})
	if err := s.Close(); err != nil {
		f.Fatal(err)
	}
	seed, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	// The inputs are where and how to damage the seed, twice: a random
	// file would fail at the meta pages, and small inputs keep the fuzzer
	// fast.
	f.Add(uint32(40), uint64(0xff), uint32(0), uint64(0))
	f.Add(uint32(2*4096+16), uint64(0xffffffff), uint32(3*4096+40), uint64(1))
	f.Add(uint32(4*4096+8), uint64(0xff00), uint32(0), uint64(0))
	f.Fuzz(func(t *testing.T, at1 uint32, mask1 uint64, at2 uint32, mask2 uint64) {
		file := bytes.Clone(seed)
		for _, d := range []struct {
			at   uint32
			mask uint64
		}{{at1, mask1}, {at2, mask2}} {
			at := int(d.at % uint32(len(file)-8))
			for i := range 8 {
				file[at+i] ^= byte(d.mask >> (8 * i))
			}
		}
		problems, _ := verifyFile(bytes.NewReader(file), int64(len(file)))
		if len(problems) > 0 {
			return
		}
		p := filepath.Join(t.TempDir(), "policyd.db")
		if err := os.WriteFile(p, file, 0o600); err != nil {
			t.Fatal(err)
		}
		err := Check(p, time.Second)
		if err != nil && strings.Contains(err.Error(), "reading the file failed") {
			t.Fatalf("verifyFile found no problem, but reading the file panicked or faulted: %v", err)
		}
	})
}
