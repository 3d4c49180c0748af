//go:build unix

package breakerstore

import (
	"errors"
	"os"
	"syscall"
	"time"
)

// errLockTimeout reports that lockFile gave up.
var errLockTimeout = errors.New("lock timeout")

// lockFile takes f's flock, exclusive or shared, waiting at most timeout.
// bbolt takes the same lock again on the same open file, which holds.
func lockFile(f *os.File, exclusive bool, timeout time.Duration) error {
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
		if err != syscall.EWOULDBLOCK {
			return err
		}
		if time.Now().After(deadline) {
			return errLockTimeout
		}
		time.Sleep(50 * time.Millisecond)
	}
}
