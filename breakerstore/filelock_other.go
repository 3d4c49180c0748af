//go:build !unix

package breakerstore

import (
	"errors"
	"os"
	"time"
)

// errLockTimeout reports that lockFile gave up.
var errLockTimeout = errors.New("lock timeout")

// lockFile leaves locking to bbolt, which takes the file's lock itself.
func lockFile(*os.File, bool, time.Duration) error { return nil }
