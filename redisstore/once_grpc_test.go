package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
)

// TestOnceOverGRPC: the idempotency ledger and a run's call table through
// the real handlers on two replicas over one Redis: a key claimed on one
// is in flight on the other, completed there with the first one's lease,
// and answers SUCCEEDED with its result on both; a NextDelay of a call of
// a run on one replica is listed by ListRunCalls on the other.
func TestOnceOverGRPC(t *testing.T) {
	srv := redistest.Standalone(t)
	client := func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) }
	r := []*replica{newReplica(t, client), newReplica(t, client)}
	ctx := context.Background()
	call := &pb.CallRef{Tenant: "acme", Target: "pay", CallId: "doc-1", IdempotencyKey: "sha-1"}

	first, err := r[0].workers.ClaimKey(ctx, &pb.ClaimKeyRequest{Call: call, Attempt: 1})
	if err != nil || first.GetState() != pb.KeyState_KEY_STATE_NEW || first.GetLeaseId() == "" {
		t.Fatalf("ClaimKey on replica 0 = %v, %v; want NEW with a lease", first, err)
	}
	second, err := r[1].workers.ClaimKey(ctx, &pb.ClaimKeyRequest{Call: call, Attempt: 1})
	if err != nil || second.GetState() != pb.KeyState_KEY_STATE_IN_FLIGHT {
		t.Fatalf("ClaimKey on replica 1 = %v, %v; want IN_FLIGHT", second, err)
	}
	_, err = r[1].workers.CompleteKey(ctx, &pb.CompleteKeyRequest{Tenant: "acme", IdempotencyKey: "sha-1", LeaseId: "beef",
		Outcome: pb.KeyOutcome_KEY_OUTCOME_SUCCEEDED})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("CompleteKey with a lease not held = %v, want FAILED_PRECONDITION", err)
	}
	if _, err := r[1].workers.CompleteKey(ctx, &pb.CompleteKeyRequest{Tenant: "acme", IdempotencyKey: "sha-1",
		LeaseId: first.GetLeaseId(), Outcome: pb.KeyOutcome_KEY_OUTCOME_SUCCEEDED, ResultRef: "grant-77"}); err != nil {
		t.Fatalf("CompleteKey = %v", err)
	}
	for i, rep := range r {
		a, err := rep.workers.ClaimKey(ctx, &pb.ClaimKeyRequest{Call: call, Attempt: 1})
		if err != nil || a.GetState() != pb.KeyState_KEY_STATE_SUCCEEDED || a.GetResultRef() != "grant-77" {
			t.Errorf("ClaimKey on replica %d after the success = %v, %v; want SUCCEEDED grant-77", i, a, err)
		}
	}
	if _, err := r[0].workers.GetKey(ctx, &pb.GetKeyRequest{Tenant: "beta", IdempotencyKey: "sha-1"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetKey of another tenant's key = %v, want NOT_FOUND", err)
	}

	run, err := r[0].admin.OpenRun(ctx, &pb.OpenRunRequest{Tenant: "acme", RetryPool: 10, CutoffTime: timestamppb.New(time.Now().Add(time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	runCall := &pb.CallRef{Tenant: "acme", Target: "pay", CallId: "doc-2", Idempotent: true, RunId: run.GetRun().GetRunId()}
	if _, err := r[0].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: runCall, Attempt: 1,
		Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}}); err != nil {
		t.Fatal(err)
	}
	list, err := r[1].admin.ListRunCalls(ctx, &pb.ListRunCallsRequest{RunId: run.GetRun().GetRunId()})
	if err != nil || len(list.GetCalls()) != 1 || list.GetCalls()[0].GetCallId() != "doc-2" ||
		list.GetCalls()[0].GetLastClassification() != "transient:503" || list.GetCalls()[0].GetTarget() != "pay" {
		t.Errorf("ListRunCalls on replica 1 = %v, %v; want doc-2, transient:503 on pay", list, err)
	}
}
