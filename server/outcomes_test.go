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
