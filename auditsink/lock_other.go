//go:build !unix

package auditsink

import (
	"fmt"
	"os"
)

// lockFile creates name; without flock(2) it cannot keep a second writer
// out.
func lockFile(name string) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("auditsink: %w", err)
	}
	return f, nil
}
