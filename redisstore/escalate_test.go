package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
)

// TestEscalationOverRedis: the escalation chain over real gRPC on two
// replicas of one Redis: after_attempts 1 sends attempt 2 to the fallback,
// each target's breaker counts its own failures (read on the other
// replica), on_circuit_open moves an Admit past an open primary, and the
// run's call table and audit trail name the fallback and the primary.
func TestEscalationOverRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	client := func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) }
	r := []*replica{newReplica(t, client), newReplica(t, client)}
	ctx := context.Background()
	three := uint32(3)
	if _, err := r[0].admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "geo-a", Policy: &pb.Policy{
		MaxAttempts: &three, Fallback: &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1, OnCircuitOpen: true}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	if _, err := r[0].admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "nightly", Tenant: "acme", RetryPool: 10,
		CutoffTime: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	c := &pb.CallRef{Tenant: "acme", Target: "geo-a", CallId: "doc-1", Idempotent: true, RunId: "nightly"}
	fail := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	var targets []string
	for attempt, sentTo := range []string{"", "geo-b"} {
		// The first NextDelay on one replica, the next on the other:
		// the policy and the attempts are the engine's, not a replica's.
		nd, err := r[attempt%2].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: uint32(attempt + 1), Failure: fail, AttemptTarget: sentTo})
		if err != nil {
			t.Fatalf("NextDelay(attempt %d): %v", attempt+1, err)
		}
		targets = append(targets, fmt.Sprintf("%v:%s", nd.GetDecision(), nd.GetTarget()))
	}
	if got := fmt.Sprint(targets); got != "[DECISION_RETRY:geo-b DECISION_RETRY:geo-b]" {
		t.Fatalf("NextDelay answers: %s, want RETRY on geo-b twice", got)
	}
	if _, err := r[1].workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: c, Attempt: 3,
		Success: true, AttemptTarget: "geo-b", FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}}}); err != nil {
		t.Fatalf("ReportOutcome: %v", err)
	}
	for target, want := range map[string]uint32{"geo-a": 1, "geo-b": 0} {
		b, err := r[1].admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: target}})
		if err != nil || b.GetBreaker().GetConsecutiveFailures() != want {
			t.Errorf("breaker %s: %v, %v; want %d consecutive failures", target, b, err, want)
		}
	}
	calls, err := r[0].admin.ListRunCalls(ctx, &pb.ListRunCallsRequest{RunId: "nightly"})
	if err != nil || len(calls.GetCalls()) != 1 {
		t.Fatalf("ListRunCalls: %v, %v", calls, err)
	}
	if rc := calls.GetCalls()[0]; rc.GetTarget() != "geo-b" || rc.GetPrimaryTarget() != "geo-a" || rc.GetDisposition() != pb.Disposition_DISPOSITION_SUCCEEDED {
		t.Fatalf("run call: %v, want SUCCEEDED on geo-b, primary geo-a", rc)
	}

	if _, err := r[0].admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "geo-a"},
		State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
		t.Fatal(err)
	}
	// Replica 1 learns of the transition from the engine's change stream.
	var last *pb.AdmitResponse
	eventually(t, "Admit on replica 1 after geo-a was forced OPEN on replica 0 admits on geo-b", func() bool {
		a, err := r[1].workers.Admit(ctx, &pb.AdmitRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo-a", CallId: "doc-2"}, Attempt: 1})
		if err != nil {
			t.Fatal(err)
		}
		last = a
		return a.GetAdmitted() && a.GetTarget() == "geo-b"
	})
	if last.GetLeaseId() != "" {
		t.Fatalf("Admit: %v, want no lease (no ceiling)", last)
	}
}
