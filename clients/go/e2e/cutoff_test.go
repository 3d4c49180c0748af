package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// fakeClock is the one clock of a test's daemon and clients: it moves only
// when the test advances it.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
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

// startDaemonAt is startDaemon with the daemon's store and decisions on
// clock.
func startDaemonAt(t testing.TB, clock *fakeClock) *daemon {
	t.Helper()
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(t.TempDir(), "policyd.db"),
		FlushInterval: time.Hour, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	gs := server.New(store, server.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Clock: clock})
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	conn, err := dialBufconn(lis)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		store.Close()
	})
	return &daemon{gs: gs, store: store, lis: lis, conn: conn, admin: pb.NewAdminServiceClient(conn)}
}

// TestRunCutoffHolds runs a batch whose run's cut-off passes mid-batch: 2
// clients x 2 workers take 40 documents in waves of 4, the clock moving 10
// s between waves and standing still within one (waits return at once),
// the cut-off 60 s in. Every third document fails once with a 503. No
// document is attempted at or after the cut-off; each one after it ends
// DEADLINE_CUT without its function being called; a failure whose retry
// could not end before the cut-off is cut too; and the run's ledger equals
// the workers' own results. With its breakers known CLOSED, each client
// asks Admit only to learn the run's cut-off (its two first, concurrent
// calls at most), not once per attempt.
func TestRunCutoffHolds(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 11, 28, 22, 0, 0, 0, time.UTC)}
	d := startDaemonAt(t, clock)
	ctx := context.Background()
	cutoff := clock.Now().Add(60 * time.Second)
	if _, err := d.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "nightly", Tenant: "acme", RetryPool: 100,
		CutoffTime: timestamppb.New(cutoff)}); err != nil {
		t.Fatal(err)
	}
	var clients [2]*policyclient.Client
	for i := range clients {
		c, err := policyclient.New(d.conn, policyclient.Config{Tenant: "acme", Now: clock.Now,
			Sleep:  func(ctx context.Context, _ time.Duration) error { return ctx.Err() },
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), DecisionTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = c
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = c.Ready(rctx) // the breakers are known CLOSED: Admit is skipped but for the run's cut-off
		cancel()
		if err != nil {
			t.Fatalf("Ready: %v", err)
		}
	}

	const docs, wave = 40, 4
	var (
		mu      sync.Mutex
		results = map[string]policyclient.Result{}
		late    []string // documents attempted at or after the cut-off
	)
	for w := 0; w < docs/wave; w++ {
		var wg sync.WaitGroup
		for j := range wave {
			doc := fmt.Sprintf("doc-%02d", w*wave+j)
			failFirst := (w*wave+j)%3 == 0
			wg.Go(func() {
				res, err := clients[j%2].Do(ctx, policyclient.Call{Target: "grants", SubmissionID: doc, RunID: "nightly"},
					func(_ context.Context, a policyclient.Attempt) error {
						if !clock.Now().Before(cutoff) {
							mu.Lock()
							late = append(late, doc)
							mu.Unlock()
						}
						if failFirst && a.Number == 1 {
							return policyclient.HTTPError(503, nil)
						}
						return nil
					})
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				results[doc] = res
				mu.Unlock()
			})
		}
		wg.Wait()
		clock.Advance(10 * time.Second)
	}
	for _, c := range clients {
		if err := c.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}

	if len(late) != 0 {
		t.Errorf("documents attempted past the cut-off: %v, want none", late)
	}
	var ok, cut, cutUnattempted int
	for doc, res := range results {
		switch res.Disposition {
		case policyclient.Succeeded:
			ok++
		case policyclient.DeadlineCut:
			cut++
			if res.Attempts == 0 {
				cutUnattempted++
			}
			if res.StopReason != policyclient.StopDeadline {
				t.Errorf("%s: cut with stop reason %v, want DEADLINE", doc, res.StopReason)
			}
		default:
			t.Errorf("%s: %v (%v), want succeeded or deadline_cut", doc, res.Disposition, res.StopReason)
		}
	}
	// Waves 0-5 start before the cut-off (t = 0 .. 50 s), 6-9 after it.
	if ok+cut != docs || cutUnattempted != 16 || cut <= cutUnattempted {
		t.Errorf("results: %d succeeded, %d cut (%d never attempted), want %d in all, 16 never attempted and a retry cut",
			ok, cut, cutUnattempted, docs)
	}
	run, err := d.admin.GetRun(ctx, &pb.GetRunRequest{RunId: "nightly"})
	if err != nil {
		t.Fatal(err)
	}
	l := run.GetRun().GetLedger()
	if l.GetSucceeded() != uint64(ok) || l.GetDeadlineCut() != uint64(cut) ||
		l.GetSucceeded()+l.GetDeadlineCut() != docs {
		t.Errorf("ledger: %v, want the workers' own %d succeeded and %d cut", l, ok, cut)
	}
	for i, c := range clients {
		if got := c.Stats().AdmitRPCs; got == 0 || got > 2 {
			t.Errorf("client %d sent %d Admit RPCs, want 1 or 2 (the run's cut-off, learnt by its first calls)", i, got)
		}
	}
	t.Logf("%d documents: %d succeeded, %d DEADLINE_CUT (%d never attempted); ledger %v", docs, ok, cut, cutUnattempted, l)
}

// TestOriginAnchorsTheDeadline: a call's Origin (the event's time) anchors
// the policy's call deadline, so an event almost a deadline old stops at
// its first failure (DEAD_LETTER, DEADLINE) where a fresh one retries.
func TestOriginAnchorsTheDeadline(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 11, 28, 22, 0, 0, 0, time.UTC)}
	d := startDaemonAt(t, clock)
	ctx := context.Background()
	if _, err := d.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "grants",
		Policy: &pb.Policy{CallDeadline: durationpb.New(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	c, err := policyclient.New(d.conn, policyclient.Config{Tenant: "acme", Now: clock.Now, NoWatch: true,
		Sleep:  func(ctx context.Context, _ time.Duration) error { return ctx.Err() },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), DecisionTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	fn, _ := script(policyclient.HTTPError(503, nil))
	for _, tt := range []struct {
		name   string
		origin time.Time
		want   policyclient.Disposition
		stop   policyclient.StopReason
	}{
		{"fresh", time.Time{}, policyclient.Succeeded, policyclient.StopNone},
		{"59 min 55 s old", clock.Now().Add(-59*time.Minute - 55*time.Second), policyclient.DeadLetter, policyclient.StopDeadline},
	} {
		res, err := c.Do(ctx, policyclient.Call{Target: "grants", Idempotent: true, CallID: tt.name, Origin: tt.origin}, fn)
		if err != nil || res.Disposition != tt.want || res.StopReason != tt.stop {
			t.Errorf("%s: %v %v (%v), want %v %v", tt.name, res.Disposition, res.StopReason, err, tt.want, tt.stop)
		}
	}
}
