package server

import (
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestSlowLogWritesOneLineAWindow: slow calls within a second of the
// first are one line, written when the second ends; the next slow call
// opens a new window.
func TestSlowLogWritesOneLineAWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out LockedBuffer // written by the window's timer
		l := newSlowLog(50*time.Millisecond, wallClock{}, slog.New(slog.NewTextHandler(&out, nil)))
		method := "/retrypolicy.v1.RetryPolicyService/Admit"
		for _, took := range []time.Duration{70, 90, 60} {
			l.note(took*time.Millisecond, method, nil, nil, nil)
			time.Sleep(100 * time.Millisecond)
		}
		synctest.Wait()
		if out.String() != "" {
			t.Fatalf("a line before the window ended: %s", out.String())
		}
		time.Sleep(slowWindow)
		synctest.Wait()
		l.note(200*time.Millisecond, method, nil, nil, nil)
		time.Sleep(slowWindow)
		synctest.Wait()
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2 || !strings.Contains(lines[0], "count=3") || !strings.Contains(lines[0], "slowest=90ms") ||
			!strings.Contains(lines[1], "count=1") || !strings.Contains(lines[1], "slowest=200ms") {
			t.Errorf("want two lines, of 3 calls (slowest 90ms) then 1 (200ms); got:\n%s", out.String())
		}
	})
}
