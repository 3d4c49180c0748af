package server_test

import (
	"context"
	"testing"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestDeadLetterWaitingOnAFullCeiling: a call refused by a full ceiling
// whose deadline is nearer than the policy's attempt timeout cannot make
// an attempt before it, so the Go client ends it DEAD_LETTER (DEADLINE)
// without waiting, as policyd's own deadline rule would. Its outcome is
// accepted, and the batch carrying it returns the lease another attempt
// held: a refused batch would keep the ceiling full until the lease
// expires.
func TestDeadLetterWaitingOnAFullCeiling(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	setCeiling(t, h, 1)
	held, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "portal", "doc-1"), Attempt: 1})
	if err != nil || held.GetLeaseId() == "" {
		t.Fatalf("Admit under the ceiling: %v, %v; want a lease", held, err)
	}
	late := call("acme", "portal", "doc-2")
	late.OriginTime, late.DeadlineTime = timestampIn(h, 0), timestampIn(h, 2*time.Second) // nearer than the 10s attempt timeout
	refused, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: late, Attempt: 1})
	if err != nil || refused.GetAdmitted() || refused.GetReason() != "concurrency:full" {
		t.Fatalf("Admit at the ceiling: %v, %v; want refused concurrency:full", refused, err)
	}
	rep, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("acme", "portal", "doc-1"), Attempt: 1, Success: true, LeaseId: held.GetLeaseId(),
			FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED},
		{Call: late, Attempt: 1, AlreadyRecorded: true,
			FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER, FinalStopReason: pb.StopReason_STOP_REASON_DEADLINE},
	}})
	if err != nil || rep.GetAccepted() != 2 {
		t.Fatalf("ReportOutcome: %v, %v; want both outcomes accepted", rep, err)
	}
	if a, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "portal", "doc-3"), Attempt: 1}); err != nil || !a.GetAdmitted() {
		t.Fatalf("Admit after the report: %v, %v; want admitted, the lease returned", a, err)
	}
}
