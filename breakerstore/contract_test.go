package breakerstore_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/server"
	"github.com/policyd/policyd/server/storetest"
)

// TestContract runs the engine contract suite against a bbolt file, in
// both sync modes. The group commit never fires on its own (its interval
// is an hour), so what survives Restart, a crash without the final flush,
// is what the store committed before it answered. The one embedded store
// stands for every replica.
func TestContract(t *testing.T) {
	for _, mode := range []breakerstore.SyncMode{breakerstore.SyncGroup, breakerstore.SyncAlways} {
		t.Run("sync="+mode.String(), func(t *testing.T) {
			storetest.Run(t, func(t *testing.T, clock *storetest.Clock) storetest.Engine {
				opts := breakerstore.Options{
					Path:          filepath.Join(t.TempDir(), "policyd.db"),
					FlushInterval: time.Hour,
					Sync:          mode,
					Clock:         clock,
					LockTimeout:   100 * time.Millisecond,
					MaxBatchDelay: time.Millisecond,
				}
				open := func() *breakerstore.Store {
					s, err := breakerstore.Open(opts)
					if err != nil {
						t.Fatalf("Open(%s) = %v, want nil", opts.Path, err)
					}
					t.Cleanup(func() { _ = s.Close() })
					return s
				}
				s := open()
				return storetest.Engine{Store: s, Restart: func() server.Store {
					if err := s.Crash(); err != nil {
						t.Fatalf("Crash() = %v, want nil", err)
					}
					s = open()
					return s
				}, Adaptive: true}
			})
		})
	}
}
