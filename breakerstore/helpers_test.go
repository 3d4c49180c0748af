package breakerstore_test

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// fakeClock is a Clock that moves only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// env is one database file, its clock and options, reopened at will.
type env struct {
	t     testing.TB
	clock *fakeClock
	opts  breakerstore.Options
}

// newEnv returns an env whose background flusher practically never fires:
// tests flush explicitly with Store.Flush, Close or not at all (Crash).
func newEnv(t testing.TB, mutate ...func(*breakerstore.Options)) *env {
	t.Helper()
	c := newFakeClock()
	e := &env{t: t, clock: c, opts: breakerstore.Options{
		Path:          filepath.Join(t.TempDir(), "policyd.db"),
		FlushInterval: time.Hour,
		Clock:         c,
		LockTimeout:   100 * time.Millisecond,
	}}
	for _, m := range mutate {
		m(&e.opts)
	}
	return e
}

// open opens the store and closes it at the end of the test.
func (e *env) open() *breakerstore.Store {
	e.t.Helper()
	s, err := breakerstore.Open(e.opts)
	if err != nil {
		e.t.Fatalf("Open(%s) = %v, want nil", e.opts.Path, err)
	}
	e.t.Cleanup(func() {
		if err := s.Close(); err != nil {
			e.t.Errorf("Close() = %v, want nil", err)
		}
	})
	return s
}

// reopen closes s (flushing it) and opens the file again.
func (e *env) reopen(s *breakerstore.Store) *breakerstore.Store {
	e.t.Helper()
	if err := s.Close(); err != nil {
		e.t.Fatalf("Close() = %v, want nil", err)
	}
	return e.open()
}

// crashAndReopen closes s without the final flush and opens the file again.
func (e *env) crashAndReopen(s *breakerstore.Store) *breakerstore.Store {
	e.t.Helper()
	if err := s.Crash(); err != nil {
		e.t.Fatalf("Crash() = %v, want nil", err)
	}
	return e.open()
}

// consecutive is a CONSECUTIVE breaker config used across tests.
var consecutive = policy.BreakerConfig{
	Mode:                policy.BreakerConsecutive,
	ConsecutiveFailures: 5,
	Cooldown:            30 * time.Second,
	HalfOpenProbes:      3,
	ProbeTimeout:        10 * time.Second,
}

// result holds a call's two results until get checks the error.
type result[T any] struct {
	v   T
	err error
}

// must captures a (value, error) pair; must(f()).get(t) fails t on an error.
func must[T any](v T, err error) result[T] { return result[T]{v, err} }

func (r result[T]) get(t testing.TB) T {
	t.Helper()
	if r.err != nil {
		t.Fatalf("unexpected error: %v", r.err)
	}
	return r.v
}

func wantErr(t testing.TB, what string, got, want error) {
	t.Helper()
	if !errors.Is(got, want) {
		t.Fatalf("%s: got error %v, want %v", what, got, want)
	}
}

// record reports n results of r to key.
func record(t testing.TB, s *breakerstore.Store, key policy.BreakerKey, cfg policy.BreakerConfig, r policy.Result, n int) policy.BreakerSnapshot {
	t.Helper()
	var snap policy.BreakerSnapshot
	for range n {
		snap = must(s.Record(key, cfg, r, "")).get(t)
	}
	return snap
}

// watch is a test's breaker subscription.
type watch struct {
	C     <-chan policy.BreakerEvent
	Close func()
}

// subscribe subscribes to tenant's breakers until the test ends.
func subscribe(t testing.TB, s *breakerstore.Store, tenant string, buffer int) *watch {
	c, cancel := s.Subscribe(tenant, buffer)
	t.Cleanup(cancel)
	return &watch{C: c, Close: cancel}
}

// drainAll returns the events queued on w without blocking, markers included.
func drainAll(w *watch) []policy.BreakerEvent {
	var out []policy.BreakerEvent
	for {
		select {
		case ev, ok := <-w.C:
			if !ok {
				return out
			}
			out = append(out, ev)
		default:
			return out
		}
	}
}

// drain returns the breaker events queued on w, without the SnapshotDone
// marker.
func drain(w *watch) []policy.BreakerEvent {
	var out []policy.BreakerEvent
	for _, ev := range drainAll(w) {
		if !ev.SnapshotDone {
			out = append(out, ev)
		}
	}
	return out
}
