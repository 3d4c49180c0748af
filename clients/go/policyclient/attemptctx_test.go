package policyclient

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"testing/synctest"
	"time"
)

// The attempt context must behave as context.WithDeadline's would; these
// tests run in a synctest bubble, whose clock moves only when every
// goroutine in it is blocked, so time.Sleep here waits for nothing.

func TestAttemptCtxDoneClosesAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newAttemptCtx(context.Background(), time.Now(), time.Second)
		if d, ok := a.Deadline(); !ok || !d.Equal(time.Now().Add(time.Second)) {
			t.Fatalf("Deadline() = %v, %v; want now+1s, true", d, ok)
		}
		done := a.Done()
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("Done closed before the deadline")
		default:
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("Done not closed at the deadline")
		}
		if err := a.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err() = %v, want DeadlineExceeded", err)
		}
		if !a.end(time.Now()) {
			t.Fatal("end() = false, want timed out")
		}
	})
}

func TestAttemptCtxErrWithoutDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newAttemptCtx(context.Background(), time.Now(), time.Second)
		if err := a.Err(); err != nil {
			t.Fatalf("Err() before the deadline = %v, want nil", err)
		}
		time.Sleep(time.Second)
		if err := a.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err() at the deadline = %v, want DeadlineExceeded", err)
		}
		if a.inner != nil {
			t.Fatal("Err built the timer context; only Done and AfterFunc should")
		}
		if !a.end(time.Now()) {
			t.Fatal("end() = false, want timed out")
		}
		// After the end Done is closed too, and Err keeps its answer.
		<-a.Done()
		if err := a.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err() after end = %v, want DeadlineExceeded", err)
		}
	})
}

func TestAttemptCtxEndCancels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newAttemptCtx(context.Background(), time.Now(), time.Minute)
		child, cancel := context.WithCancel(a) // derived before the end
		defer cancel()
		fired := make(chan struct{})
		context.AfterFunc(a, func() { close(fired) })
		if a.end(time.Now()) {
			t.Fatal("end() = true for an attempt that ended in time")
		}
		<-fired
		<-child.Done()
		<-a.Done()
		if err := a.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Err() after end = %v, want Canceled", err)
		}
		// A context derived after the end is done at once.
		late, cancelLate := context.WithTimeout(a, time.Hour)
		defer cancelLate()
		<-late.Done()
	})
}

func TestAttemptCtxParentWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent, cancel := context.WithCancel(context.Background())
		a := newAttemptCtx(parent, time.Now(), time.Minute)
		cancel()
		if err := a.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Err() after the parent's cancel = %v, want Canceled", err)
		}
		<-a.Done()
		if a.end(time.Now()) {
			t.Fatal("end() = true when the parent was cancelled")
		}

		// A parent deadline earlier than the attempt's bounds the attempt,
		// but running into it is the call's deadline, not the attempt's.
		pctx, pcancel := context.WithTimeout(context.Background(), time.Second)
		defer pcancel()
		b := newAttemptCtx(pctx, time.Now(), time.Minute)
		if d, _ := b.Deadline(); !d.Equal(time.Now().Add(time.Second)) {
			t.Fatalf("Deadline() = %v, want the parent's", d)
		}
		time.Sleep(time.Second)
		if err := b.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err() = %v, want DeadlineExceeded", err)
		}
		if b.end(time.Now()) {
			t.Fatal("end() = true, but the parent's deadline ended the attempt")
		}
	})
}

func TestAttemptCtxDerivedContextsNeedNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := newAttemptCtx(context.Background(), time.Now(), time.Minute)
		before := runtime.NumGoroutine()
		var cancels []context.CancelFunc
		for range 50 {
			_, cancel := context.WithCancel(a)
			cancels = append(cancels, cancel)
		}
		// NumGoroutine counts the whole process: a goroutine of another test may
		// end meanwhile, so only a rise means a derived context started one.
		if after := runtime.NumGoroutine(); after > before {
			t.Fatalf("goroutines %d -> %d after deriving 50 contexts, want no new ones", before, after)
		}
		for _, c := range cancels {
			c()
		}
		a.end(time.Now())
	})
}

func TestAttemptCtxValuesAreTheParents(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "v")
	a := newAttemptCtx(parent, time.Now(), time.Minute)
	defer a.end(time.Now())
	if got := a.Value(key{}); got != "v" {
		t.Fatalf("Value = %v, want the parent's value", got)
	}
}
