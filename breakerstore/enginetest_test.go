package breakerstore_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/internal/enginetest"
)

// TestEngineBehaviours runs the engines' shared behaviours on bbolt: one
// embedded store stands for every replica, on the real clock.
func TestEngineBehaviours(t *testing.T) {
	enginetest.Run(t, func(t *testing.T, n int) enginetest.Fleet {
		s, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(t.TempDir(), "policyd.db")})
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		f := enginetest.Fleet{WaitPast: func(tm time.Time) {
			for !time.Now().After(tm) {
			}
		}}
		for range n {
			f.Replicas = append(f.Replicas, s)
		}
		return f
	})
}
