//go:build unix

package breakerstore

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
