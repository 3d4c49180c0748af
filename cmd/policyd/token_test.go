package main

import (
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// TestTokenFileMadeWhole starts the token file of replicas started at
// once in one directory (each with the default --db, so one file): one of
// them makes it, and every one reads the token it holds, never a file
// made but not yet written.
func TestTokenFileMadeWhole(t *testing.T) {
	const replicas = 8
	for range 100 {
		path := filepath.Join(t.TempDir(), "policyd.db.admin-token")
		var made atomic.Int32
		toks := make([]string, replicas)
		errs := make([]error, replicas)
		var wg sync.WaitGroup
		for i := range replicas {
			wg.Go(func() {
				created, err := ensureToken(path)
				if created {
					made.Add(1)
				}
				if err == nil {
					toks[i], err = readToken(path)
				}
				errs[i] = err
			})
		}
		wg.Wait()
		if n := made.Load(); n != 1 {
			t.Fatalf("%d replicas made the token file, want 1", n)
		}
		for i, err := range errs {
			if err != nil {
				t.Fatalf("replica %d: %v", i, err)
			}
			if toks[i] != toks[0] {
				t.Fatalf("replica %d read token %q, replica 0 %q", i, toks[i], toks[0])
			}
		}
	}
}
