package policyclient

import (
	"context"
	"sync"
	"time"
)

// attemptCtx is the context one attempt's fn gets: its parent bounded by the
// attempt's deadline, as context.WithDeadline would make it. Most of
// WithDeadline's cost is its timer and cancellation wiring, which an fn that
// never waits on Done does not need, so attemptCtx builds that context only
// when Done (or AfterFunc) is first called. Until then Err compares the
// clock with the deadline itself. When the attempt ends, end fixes Err for
// good and closes Done, as a cancel func would.
type attemptCtx struct {
	parent   context.Context
	deadline time.Time
	own      bool // the deadline is the attempt's, not the parent's

	mu     sync.Mutex
	inner  context.Context // built by Done or AfterFunc
	stop   context.CancelFunc
	ended  bool
	endErr error // Err from end on
}

// newAttemptCtx returns parent bounded by timeout from now, the wall clock's
// time (by parent's own deadline when that is earlier).
func newAttemptCtx(parent context.Context, now time.Time, timeout time.Duration) *attemptCtx {
	a := new(attemptCtx)
	a.start(parent, now, timeout)
	return a
}

// start makes the zero a what newAttemptCtx returns.
func (a *attemptCtx) start(parent context.Context, now time.Time, timeout time.Duration) {
	a.parent, a.deadline, a.own = parent, now.Add(timeout), true
	if pd, ok := parent.Deadline(); ok && !pd.After(a.deadline) {
		a.deadline, a.own = pd, false
	}
}

// Deadline implements context.Context.
func (a *attemptCtx) Deadline() (time.Time, bool) { return a.deadline, true }

// Value implements context.Context: the values are the parent's.
func (a *attemptCtx) Value(key any) any { return a.parent.Value(key) }

// Done implements context.Context.
func (a *attemptCtx) Done() <-chan struct{} { return a.built().Done() }

// AfterFunc lets context.AfterFunc and contexts derived from this one
// (context.WithCancel and the like) follow its cancellation without a
// goroutine each, as they follow the standard library's own contexts.
func (a *attemptCtx) AfterFunc(f func()) (stop func() bool) { return context.AfterFunc(a.built(), f) }

// Err implements context.Context.
func (a *attemptCtx) Err() error {
	a.mu.Lock()
	inner, ended, endErr := a.inner, a.ended, a.endErr
	a.mu.Unlock()
	switch {
	case ended:
		return endErr
	case inner != nil:
		return inner.Err()
	}
	return a.errAt(time.Now())
}

// errAt is Err at now, for a context whose Done was never asked for: the
// parent's error first, as a parent cancelled first would win the race.
func (a *attemptCtx) errAt(now time.Time) error {
	if err := a.parent.Err(); err != nil {
		return err
	}
	if !now.Before(a.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// built returns the context.WithDeadline context behind Done, making it the
// first time; after end it is already cancelled.
func (a *attemptCtx) built() context.Context {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inner == nil {
		a.inner, a.stop = context.WithDeadline(a.parent, a.deadline)
		if a.ended {
			a.stop()
		}
	}
	return a.inner
}

// end ends the attempt at now, the wall clock's time: Err keeps the error
// it has then (context.Canceled when there is none yet) and Done, when
// built, closes. It returns whether the attempt ran into its own deadline
// while the parent was still live.
func (a *attemptCtx) end(now time.Time) (timedOut bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ended {
		return a.own && a.endErr == context.DeadlineExceeded
	}
	var err error
	if a.inner != nil {
		err = a.inner.Err()
	} else {
		err = a.errAt(now)
	}
	// The parent's error is checked first (errAt), so DeadlineExceeded with
	// an own deadline is this attempt's timeout.
	timedOut = a.own && err == context.DeadlineExceeded
	if err == nil {
		err = context.Canceled
	}
	a.ended, a.endErr = true, err
	if a.stop != nil {
		a.stop()
	}
	return timedOut
}
