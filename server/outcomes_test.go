package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// TestReportOutcomeOneCommitWithSyncAlways: with every decision durable
// before its answer, a batch of 100 outcomes (breakers, final dispositions
// in a run, a deposit, the audit trail) is made durable in one commit, not
// one per outcome.
func TestReportOutcomeOneCommitWithSyncAlways(t *testing.T) {
	h := newHarness(t, func(_ *server.Config, o *breakerstore.Options) {
		o.Sync, o.MaxBatchDelay = breakerstore.SyncAlways, time.Millisecond
	})
	ctx := context.Background()
	run, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{Tenant: "acme", RetryPool: 10, CutoffTime: timestampIn(h, time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	req := &pb.ReportOutcomeRequest{}
	for i := range 100 {
		c := call("acme", fmt.Sprint("target-", i%10), fmt.Sprint("c", i))
		c.RunId = run.GetRun().GetRunId()
		o := &pb.Outcome{Call: c, Attempt: 1, Success: true, Latency: durationpb.New(time.Millisecond),
			FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}
		if i%5 == 4 {
			o = &pb.Outcome{Call: c, Attempt: 1, Failure: http(503)}
		}
		req.Outcomes = append(req.Outcomes, o)
	}
	before := h.store.Stats()
	resp, err := h.workers.ReportOutcome(ctx, req)
	if err != nil || resp.GetAccepted() != 100 {
		t.Fatalf("ReportOutcome: got %v, %v; want 100 accepted", resp, err)
	}
	if got := h.store.Stats().SyncCommits - before.SyncCommits; got != 1 {
		t.Errorf("commits for one ReportOutcome of 100 outcomes: got %d, want 1", got)
	}
	got, err := h.admin.GetRun(ctx, &pb.GetRunRequest{RunId: run.GetRun().GetRunId()})
	if err != nil || got.GetRun().GetLedger().GetSucceeded() != 80 {
		t.Errorf("run ledger: got %v, %v; want 80 succeeded", got.GetRun().GetLedger(), err)
	}
}

// TestReportOutcomeEachOutcomeUnderItsOwnPolicy: a batch interleaving two
// tenants' outcomes over two targets applies each under its own tenant's
// and target's policy (ReportOutcome resolves each policy once a request),
// and a policy changed between two requests holds for the second.
func TestReportOutcomeEachOutcomeUnderItsOwnPolicy(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	threshold := func(tenant, target string, n uint32) {
		t.Helper()
		if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: tenant, Target: target,
			Policy: &pb.Policy{Breaker: &pb.BreakerSettings{ConsecutiveFailures: &n}}}); err != nil {
			t.Fatalf("SetPolicy %s/%s: %v", tenant, target, err)
		}
	}
	threshold("acme", "geo-a", 3)
	threshold("acme", "geo-b", 100)
	threshold("globex", "geo-b", 3)
	keys := []*pb.BreakerKey{ // the outcomes' order in each batch
		{Tenant: "acme", Target: "geo-a"}, {Tenant: "acme", Target: "geo-b"},
		{Tenant: "globex", Target: "geo-a"}, {Tenant: "globex", Target: "geo-b"},
	}
	report := func(failures int) {
		t.Helper()
		req := &pb.ReportOutcomeRequest{}
		for i := range failures * len(keys) {
			k := keys[i%len(keys)]
			req.Outcomes = append(req.Outcomes, &pb.Outcome{Call: call(k.Tenant, k.Target, fmt.Sprint("c", i)),
				Attempt: 1, Failure: http(503)})
		}
		if resp, err := h.workers.ReportOutcome(ctx, req); err != nil || int(resp.GetAccepted()) != len(req.Outcomes) {
			t.Fatalf("ReportOutcome: got %v, %v", resp, err)
		}
	}
	states := func() []pb.BreakerState {
		t.Helper()
		var got []pb.BreakerState
		for _, k := range keys {
			br, err := h.admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: k})
			if err != nil {
				t.Fatalf("GetBreaker %v: %v", k, err)
			}
			got = append(got, br.GetBreaker().GetState())
		}
		return got
	}
	open, closed := pb.BreakerState_BREAKER_STATE_OPEN, pb.BreakerState_BREAKER_STATE_CLOSED
	report(3) // globex/geo-a has the default policy: 5 failures
	if got, want := states(), []pb.BreakerState{open, closed, closed, open}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after 3 failures each: breakers %v, want %v (by %v)", got, want, keys)
	}
	threshold("acme", "geo-b", 4)
	report(1) // acme/geo-b's fourth failure, now at its threshold; globex/geo-a's fourth, under the default
	if got, want := states(), []pb.BreakerState{open, open, closed, open}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("after the policy change and one failure more each: breakers %v, want %v", got, want)
	}
}
