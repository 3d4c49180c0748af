package main

import (
	"context"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestGoClientEscalatesAndFollowsTheChainWithoutPolicyd, against a real
// daemon process: geo-a escalates after one attempt and on an open
// circuit to geo-b, then geo-c, and its breaker is forced OPEN before the
// worker starts. The fresh client's first attempt goes to geo-b (one
// Admit, named from the chain the watch snapshot told); once the daemon
// has stopped (SIGTERM), a call whose every attempt fails is routed by the
// local policy along the same chain, past the open geo-a: geo-b, geo-b,
// geo-c, as policyd would route it.
func TestGoClientEscalatesAndFollowsTheChainWithoutPolicyd(t *testing.T) {
	d := startDaemon(t, t.TempDir()+"/policyd.db")
	conn := d.conn(t)
	ctx := context.Background()
	admin := pb.NewAdminServiceClient(conn)
	three := uint32(3)
	if _, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "geo-a", Policy: &pb.Policy{
		MaxAttempts: &three, Fallback: &pb.FallbackSettings{Targets: []string{"geo-b", "geo-c"}, AfterAttempts: 1, OnCircuitOpen: true}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	if _, err := admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "geo-a"},
		State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
		t.Fatalf("ForceBreaker: %v", err)
	}
	// The client's clock moves by its sleeps, so no wait is real.
	var mu sync.Mutex
	var slept time.Duration
	c, err := policyclient.New(conn, policyclient.Config{Tenant: "acme", DecisionTimeout: time.Second,
		Sleep: func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			slept += d
			mu.Unlock()
			return ctx.Err()
		},
		Now: func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return time.Now().Add(slept)
		}})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Ready(rctx); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	do := func(id string, fail bool) (policyclient.Result, string) {
		t.Helper()
		var targets []string
		res, err := c.Do(ctx, policyclient.Call{Target: "geo-a", SubmissionID: id, Idempotent: true},
			func(_ context.Context, a policyclient.Attempt) error {
				targets = append(targets, a.Target)
				if fail {
					return policyclient.HTTPError(503, nil)
				}
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
		return res, strings.Join(targets, " ")
	}
	if res, targets := do("doc-1", false); !res.OK() || targets != "geo-b" || res.Local {
		t.Fatalf("doc-1 with geo-a open: %v after attempts on %q (local %v), want success on geo-b decided by policyd", res.Disposition, targets, res.Local)
	}
	if n := c.Stats().AdmitRPCs; n != 1 {
		t.Fatalf("Admit RPCs: %d, want 1", n)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v; daemon said: %s", err, d.stderr)
	}
	res, targets := do("doc-2", true)
	if targets != "geo-b geo-b geo-c" || res.Disposition != policyclient.DeadLetter || res.StopReason != policyclient.StopAttemptsExhausted || !res.Local {
		t.Fatalf("doc-2 with policyd stopped: %v/%v after attempts on %q (local %v), want dead_letter/ATTEMPTS_EXHAUSTED on geo-b geo-b geo-c, decided locally",
			res.Disposition, res.StopReason, targets, res.Local)
	}
	cctx, ccancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer ccancel()
	c.Close(cctx) // doc-2's outcomes cannot reach a stopped policyd: bounded
}
