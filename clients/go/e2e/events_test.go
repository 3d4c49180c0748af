package e2e_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/clients/go/policyclient"
)

// events records what Config.OnEvent receives, breaker changes aside.
type events struct {
	mu sync.Mutex
	ev []policyclient.Event
}

func (e *events) on(ev policyclient.Event) {
	if ev.Kind == policyclient.EventBreakerChanged {
		return
	}
	e.mu.Lock()
	e.ev = append(e.ev, ev)
	e.mu.Unlock()
}

// summary is each event as kind/attempt, with the disposition of the end.
func (e *events) summary() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var s []string
	for _, ev := range e.ev {
		line := ev.Kind.String() + "/" + string(rune('0'+ev.Attempt))
		if ev.Kind == policyclient.EventCallEnded {
			line += "/" + ev.Disposition.String()
		}
		s = append(s, line)
	}
	return s
}

func TestOnEventFollowsTheLoop(t *testing.T) {
	d := startDaemon(t, nil)
	var rec events
	c, sl := newClient(t, d, func(cfg *policyclient.Config) { cfg.OnEvent = rec.on })
	fn, _ := script(policyclient.HTTPError(503, nil), policyclient.HTTPError(503, nil))
	if res, _ := c.Do(context.Background(), policyclient.Call{Target: "events", Idempotent: true}, fn); !res.OK() {
		t.Fatalf("got %v, want success", res.Disposition)
	}
	want := []string{"attempt_started/1", "retry_scheduled/1", "attempt_started/2", "retry_scheduled/2",
		"attempt_started/3", "call_ended/3/succeeded"}
	if got := rec.summary(); !slices.Equal(got, want) {
		t.Errorf("events: got %v, want %v", got, want)
	}
	var delays []time.Duration
	for _, ev := range rec.ev {
		if ev.Kind == policyclient.EventRetryScheduled {
			delays = append(delays, ev.Delay)
			if ev.Reason != "transient:503" || ev.Local || ev.Target != "events" {
				t.Errorf("retry_scheduled: got %+v, want transient:503 decided by policyd for target events", ev)
			}
		}
	}
	if waits := sl.all(); !slices.Equal(delays, waits) {
		t.Errorf("scheduled delays %v, but the client waited %v", delays, waits)
	}
}

func TestOnEventReportsTheStopAndLocalDecisions(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // policyd is away: connection refused
	var rec events
	sl := newSleeps()
	c, err := policyclient.Dial(addr, policyclient.Config{Tenant: "acme", NoWatch: true, Sleep: sl.Sleep, Now: sl.Now,
		OnEvent: rec.on, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Nobody would take the outcomes: Close drops them at once.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		c.Close(ctx)
	})
	fn, _ := script(policyclient.HTTPError(503, nil), policyclient.HTTPError(404, nil))
	res, _ := c.Do(context.Background(), policyclient.Call{Target: "away", Idempotent: true}, fn)
	if res.Disposition != policyclient.FailedTerminal || !res.Local {
		t.Fatalf("got %v (local %v), want failed_terminal decided locally", res.Disposition, res.Local)
	}
	want := []string{"attempt_started/1", "local_decision/1", "retry_scheduled/1", "attempt_started/2", "local_decision/2",
		"call_ended/2/failed_terminal"}
	if got := rec.summary(); !slices.Equal(got, want) {
		t.Errorf("events: got %v, want %v", got, want)
	}
	last := rec.ev[len(rec.ev)-1]
	if last.StopReason != policyclient.StopTerminal || last.Reason != "terminal:404" {
		t.Errorf("call_ended: got %s/%q, want TERMINAL/terminal:404", last.StopReason, last.Reason)
	}
	if rs := rec.ev[2]; !rs.Local {
		t.Errorf("retry_scheduled: got Local false, want the local policy's decision")
	}
}

func TestDoValueReturnsTheSucceedingAttemptsValue(t *testing.T) {
	d := startDaemon(t, nil)
	c, _ := newClient(t, d, nil)
	v, res, err := policyclient.DoValue(context.Background(), c, policyclient.Call{Target: "value", Idempotent: true},
		func(_ context.Context, a policyclient.Attempt) (string, error) {
			if a.Number < 2 {
				return "partial", policyclient.HTTPError(503, nil)
			}
			return "answer", nil
		})
	if err != nil || !res.OK() || v != "answer" || res.Attempts != 2 {
		t.Errorf("got %q, %v after %d attempts, err %v; want \"answer\" after 2", v, res.Disposition, res.Attempts, err)
	}
	v, res, _ = policyclient.DoValue(context.Background(), c, policyclient.Call{Target: "value-terminal", Idempotent: true},
		func(context.Context, policyclient.Attempt) (string, error) {
			return "ignored", policyclient.HTTPError(400, nil)
		})
	if v != "" || res.Disposition != policyclient.FailedTerminal {
		t.Errorf("failed call: got %q, %v; want the zero value and failed_terminal", v, res.Disposition)
	}
}
