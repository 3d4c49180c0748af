package server_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// slowResolveStore moves the clock on by its tenant's delay in Resolve:
// the store took that long to answer.
type slowResolveStore struct {
	server.Store
	clock *fakeClock
	delay map[string]time.Duration
}

func (s slowResolveStore) Resolve(tenant, target string) (policy.Policy, policy.PolicyEntry) {
	s.clock.Advance(s.delay[tenant])
	return s.Store.Resolve(tenant, target)
}

// TestSlowRequestsLogged: the calls slower than Config.SlowRequest, as
// the handler saw them, are counted in one WARN line that names the
// slowest; the fast ones are not. Shutdown writes the open window's line.
func TestSlowRequestsLogged(t *testing.T) {
	var logs lockedBuffer
	var clk *fakeClock
	h := newHarnessWrapped(t, func(s server.Store) server.Store {
		return slowResolveStore{Store: s, clock: clk, delay: map[string]time.Duration{
			"quick": 10 * time.Millisecond, "slow": 80 * time.Millisecond, "slower": 120 * time.Millisecond}}
	}, func(c *server.Config, _ *breakerstore.Options) {
		clk = c.Clock.(*fakeClock)
		c.SlowRequest = 60 * time.Millisecond
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	ctx := context.Background()
	for _, tenant := range []string{"quick", "slow", "slower", "quick", "slow"} {
		if _, err := h.workers.Classify(ctx, &pb.ClassifyRequest{Call: call(tenant, "geocoder", ""), Failure: http(503)}); err != nil {
			t.Fatalf("Classify %s: %v", tenant, err)
		}
	}
	if got := logRecords(t, &logs, "slow requests"); len(got) != 0 {
		t.Fatalf("a line before the window ended: %v", got)
	}
	if err := h.gs.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	got := logRecords(t, &logs, "slow requests")
	if len(got) != 1 {
		t.Fatalf("%d slow-request lines, want 1: %v", len(got), got)
	}
	rec := got[0]
	if rec["level"] != "WARN" || rec["count"] != 3.0 || rec["slowest"] != float64(120*time.Millisecond) ||
		rec["slowest_call"] != "Classify slower/geocoder" || rec["over"] != float64(60*time.Millisecond) {
		t.Errorf("line %v, want WARN, count 3, slowest 120ms, slowest_call %q, over 60ms", rec, "Classify slower/geocoder")
	}
}

// TestSlowRequestLogOff: a negative SlowRequest logs nothing.
func TestSlowRequestLogOff(t *testing.T) {
	var logs lockedBuffer
	var clk *fakeClock
	h := newHarnessWrapped(t, func(s server.Store) server.Store {
		return slowResolveStore{Store: s, clock: clk, delay: map[string]time.Duration{"slow": time.Hour}}
	}, func(c *server.Config, _ *breakerstore.Options) {
		clk = c.Clock.(*fakeClock)
		c.SlowRequest = -1
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	ctx := context.Background()
	if _, err := h.workers.Classify(ctx, &pb.ClassifyRequest{Call: call("slow", "geocoder", ""), Failure: http(503)}); err != nil {
		t.Fatal(err)
	}
	if err := h.gs.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if got := logRecords(t, &logs, "slow requests"); len(got) != 0 {
		t.Errorf("logged with the log off: %v", got)
	}
}

// TestDescribeCall: the slowest-call lines (the slow-request log,
// policybench's fault tests) name the call's
// tenant, target, attempt, lease and degraded answer, or its error.
func TestDescribeCall(t *testing.T) {
	call := &pb.CallRef{Tenant: "stop-chain", Target: "primary", CallId: "c1"}
	for _, tc := range []struct {
		m          string
		req, reply any
		err        error
		want       string
	}{
		{"NextDelay", &pb.NextDelayRequest{Call: call, Attempt: 1, LeaseId: "l1"}, &pb.NextDelayResponse{Degraded: true}, nil,
			"NextDelay stop-chain/primary attempt 1 with a lease, degraded"},
		{"Admit", &pb.AdmitRequest{Call: call, Attempt: 2, AttemptTarget: "backup"}, &pb.AdmitResponse{}, nil,
			"Admit stop-chain/backup attempt 2"},
		{"Admit", &pb.AdmitRequest{Call: call, Attempt: 1}, &pb.AdmitResponse{}, status.Error(codes.Unavailable, "gone"),
			"Admit stop-chain/primary attempt 1, Unavailable"},
		{"ReportOutcome", &pb.ReportOutcomeRequest{Outcomes: make([]*pb.Outcome, 3)}, &pb.ReportOutcomeResponse{}, nil,
			"ReportOutcome of 3 outcomes"},
	} {
		if got := server.DescribeCall(tc.m, tc.req, tc.reply, tc.err); got != tc.want {
			t.Errorf("DescribeCall(%s) = %q, want %q", tc.m, got, tc.want)
		}
	}
}
