package redisstore_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
)

// TestFinalDispositionsReadOncePerTenant: the final-disposition checks of
// a ReportOutcome read the calls' remembered answers in one
// policyd_attempts call per tenant and their breakers from the replica's
// cache: 30 DEAD_LETTERs of two tenants in one request cost two FCALL_RO
// and no read per outcome (before: an HGETALL and a policyd_read each).
// Each DEAD_LETTER is one the check takes only with the call's answer
// read: a transient failure policyd answered RETRY (told to NextDelay,
// so the outcome carries no failure of its own).
func TestFinalDispositionsReadOncePerTenant(t *testing.T) {
	srv := redistest.Standalone(t)
	finalsReadOncePerTenant(t, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) })
}

func TestFinalDispositionsReadOncePerTenantCluster(t *testing.T) {
	addrs := redistest.Cluster(t)
	finalsReadOncePerTenant(t, func() redis.UniversalClient { return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}) })
}

func finalsReadOncePerTenant(t *testing.T, client func() redis.UniversalClient) {
	r := newReplica(t, client)
	ctx := context.Background()
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	call := func(tenant string, i int) *pb.CallRef {
		return &pb.CallRef{Tenant: tenant, Target: "pay-" + strconv.Itoa(i), CallId: tenant + "-" + strconv.Itoa(i), Idempotent: true}
	}
	req := &pb.ReportOutcomeRequest{}
	for i := range 30 {
		tenant := "acme"
		if i%3 == 0 {
			tenant = "beta"
		}
		c := call(tenant, i)
		resp, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: 1, Failure: fail503})
		if err != nil || resp.GetDecision() != pb.Decision_DECISION_RETRY {
			t.Fatalf("NextDelay(%s) = %v, %v; want RETRY", c.GetCallId(), resp, err)
		}
		req.Outcomes = append(req.Outcomes, &pb.Outcome{Call: c, Attempt: 1, AlreadyRecorded: true,
			FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER})
	}
	// A call never decided: its DEAD_LETTER has nothing to agree with.
	bad := &pb.ReportOutcomeRequest{Outcomes: append(req.Outcomes[:3:3], &pb.Outcome{Call: call("acme", 99), Attempt: 1,
		AlreadyRecorded: true, FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER})}
	r.trips.take()
	if _, err := r.workers.ReportOutcome(ctx, bad); err == nil {
		t.Fatalf("ReportOutcome of a DEAD_LETTER of a call never decided: nil, want INVALID_ARGUMENT")
	}
	if _, cmds := r.trips.take(); cmds["fcall_ro"] != 3 || len(cmds) != 1 {
		t.Errorf("a refused request read %v; want 3 FCALL_RO (its two tenants' answers, the refused call's breaker from the engine) and nothing else", cmds)
	}

	if _, err := r.workers.ReportOutcome(ctx, req); err != nil {
		t.Fatalf("ReportOutcome of 30 DEAD_LETTERs policyd's RETRYs justify: %v, want them taken", err)
	}
	// Besides the reads, the request's commands are its outcome calls,
	// one a tenant (policyd_outcomes).
	if _, cmds := r.trips.take(); cmds["fcall_ro"] != 2 || cmds["fcall"] != 2 || len(cmds) != 2 {
		t.Errorf("30 DEAD_LETTERs of 2 tenants sent %v; want 2 FCALL_RO (their answers, one call a tenant), 2 FCALL (their outcomes) and nothing else", cmds)
	}
}
