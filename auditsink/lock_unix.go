//go:build unix

package auditsink

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockFile takes an exclusive lock on name, created when absent, without
// waiting; closing the file releases it.
func lockFile(name string) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("auditsink: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("auditsink: %s is held by another process: two writers would break the chain", name)
		}
		return nil, fmt.Errorf("auditsink: locking %s: %w", name, err)
	}
	return f, nil
}
