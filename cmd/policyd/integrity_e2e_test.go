package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestIntegrityEndToEnd runs the daemon with --tenant-tokens-file and two
// tenants, and tries as a hostile or buggy caller would: tenant-b forges a
// permit for the target-scoped breaker tenant-a is probing, a stopped call
// sends attempt 1 again, and a ledger is told a lie. Each is refused with
// the field named, and the fleet's state is unchanged. On the code before,
// the forged permit closed the breaker, attempt 1 after the STOP got RETRY
// and the lie was counted.
func TestIntegrityEndToEnd(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tenant-tokens")
	if err := os.WriteFile(tokens, []byte("tenant-a tok-a\ntenant-b tok-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "policyd.db")
	d := startDaemon(t, db, "--tenant-tokens-file", tokens)
	admin := pb.NewAdminServiceClient(d.conn(t))
	wc, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wc.Close() })
	workers := pb.NewRetryPolicyServiceClient(wc)
	as := func(tok string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok)
	}
	a, b := as("tok-a"), as("tok-b")
	ctx := context.Background()
	code := func(err error) (codes.Code, string) {
		st, _ := status.FromError(err)
		return st.Code(), st.Message()
	}

	// A target-scoped breaker that trips on one failure and half-opens at
	// once; tenant-a takes its one probe permit.
	one := uint32(1)
	if _, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Target: "geo", Policy: &pb.Policy{Breaker: &pb.BreakerSettings{
		Scope: pb.BreakerScope_BREAKER_SCOPE_TARGET, ConsecutiveFailures: &one, HalfOpenProbes: &one,
		Cooldown: durationpb.New(time.Millisecond), ProbeTimeout: durationpb.New(time.Hour)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := workers.NextDelay(a, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "tenant-a", Target: "geo", CallId: "trip",
		Idempotent: true}, Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}}); err != nil {
		t.Fatal(err)
	}
	var permit string
	for i := 0; permit == ""; i++ { // the cooldown is 1 ms: a few Admits
		if i == 10000 {
			t.Fatal("no probe permit after 10000 Admits")
		}
		r, err := workers.Admit(a, &pb.AdmitRequest{Call: &pb.CallRef{Tenant: "tenant-a", Target: "geo", CallId: "probe"}, Attempt: 1})
		if err != nil {
			t.Fatal(err)
		}
		permit = r.GetPermitId()
	}
	resp, err := workers.ReportOutcome(b, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{
		Call: &pb.CallRef{Tenant: "tenant-b", Target: "geo", CallId: "forger"}, Attempt: 1, Success: true,
		PermitId: strings.Repeat("0f", 16)}}})
	if err != nil || len(resp.GetRefused()) != 1 || resp.GetRefused()[0].GetField() != "outcomes[0].permit_id" {
		t.Fatalf("a forged permit: %v, %v; want outcome 0 refused naming outcomes[0].permit_id", resp, err)
	}
	br, err := admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Target: "geo"}})
	if err != nil || br.GetBreaker().GetState() != pb.BreakerState_BREAKER_STATE_HALF_OPEN {
		t.Fatalf("breaker after the forged permit: %v, %v; want HALF_OPEN", br, err)
	}
	if _, err := workers.ReportOutcome(a, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{
		Call: &pb.CallRef{Tenant: "tenant-a", Target: "geo", CallId: "probe"}, Attempt: 1, Success: true, PermitId: permit}}}); err != nil {
		t.Fatal(err)
	}
	if br, _ := admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Target: "geo"}}); br.GetBreaker().GetState() != pb.BreakerState_BREAKER_STATE_CLOSED {
		t.Fatalf("breaker after the real probe: %v, want CLOSED", br.GetBreaker().GetState())
	}

	// A call stopped at attempt 3 cannot start over at 1.
	stopped := &pb.CallRef{Tenant: "tenant-b", Target: "maps", CallId: "job", Idempotent: true}
	stop, err := workers.NextDelay(b, &pb.NextDelayRequest{Call: stopped, Attempt: 3, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}})
	if err != nil || stop.GetStopReason() != pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED {
		t.Fatalf("attempt 3: %v, %v; want ATTEMPTS_EXHAUSTED", stop, err)
	}
	_, err = workers.NextDelay(b, &pb.NextDelayRequest{Call: stopped, Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}})
	if c, msg := code(err); c != codes.FailedPrecondition || !strings.HasPrefix(msg, "attempt: ") {
		t.Fatalf("attempt 1 after the STOP: %v %q, want FAILED_PRECONDITION naming attempt", c, msg)
	}

	// A run's ledger is not told that a failed call succeeded.
	if _, err := admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "nightly", Tenant: "tenant-b", RetryPool: 5,
		CutoffTime: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	_, err = workers.ReportOutcome(b, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{
		Call: &pb.CallRef{Tenant: "tenant-b", Target: "maps", CallId: "liar", RunId: "nightly"}, Attempt: 1,
		Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}, FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}}})
	if c, msg := code(err); c != codes.InvalidArgument || !strings.HasPrefix(msg, "outcomes[0].final_disposition: ") {
		t.Fatalf("a lying ledger: %v %q, want INVALID_ARGUMENT naming outcomes[0].final_disposition", c, msg)
	}
	run, err := admin.GetRun(ctx, &pb.GetRunRequest{RunId: "nightly"})
	if err != nil || run.GetRun().GetLedger().GetSucceeded() != 0 {
		t.Fatalf("ledger after the lie: %v, %v; want nothing succeeded", run, err)
	}
}
