package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
)

// boundedReplica is a replica whose calls to Redis end at the store's
// Timeout (ContextTimeoutEnabled, socket timeouts far longer), as policyd
// serve makes them.
func boundedReplica(t *testing.T, addr string) *replica {
	t.Helper()
	return boundedReplicaWith(t, addr, 2)
}

// boundedReplicaWith is boundedReplica counting Redis down after
// downAfter calls in a row fail.
func boundedReplicaWith(t *testing.T, addr string, downAfter int) *replica {
	t.Helper()
	return newReplicaWith(t, func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true,
			ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	}, redisstore.Options{Timeout: 50 * time.Millisecond,
		DownAfter: downAfter, DownFor: 20 * time.Millisecond, Heartbeat: 10 * time.Millisecond, FlushInterval: 10 * time.Millisecond})
}

// boundedPair is two bounded replicas on the Redis at addr, each seeing
// both in the replica set (the degraded shares are split between them).
func boundedPair(t *testing.T, addr string) []*replica {
	t.Helper()
	r := []*replica{boundedReplica(t, addr), boundedReplica(t, addr)}
	for i := range r {
		eventually(t, "both replicas in the replica set", func() bool { return r[i].store.LiveReplicas() == 2 })
	}
	return r
}

// until makes NextDelays of new calls to acme's target "other" on r,
// which the engine breaker counts, until cond holds (the engine seen
// down, or up again).
func (r *replica) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	n := 0
	eventually(t, what, func() bool {
		n++
		_, _ = r.workers.NextDelay(context.Background(), &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "other",
			CallId: strings.ReplaceAll(what, " ", "-") + "-" + strconv.Itoa(n), Idempotent: true}, Attempt: 1, Failure: fail503})
		return cond()
	})
}

// TestDegradedWhileRedisPaused stops Redis (SIGSTOP) under two replicas:
// decisions go on, flagged degraded, from each replica's last known state;
// the run's pool is not overspent (each replica spends only the share the
// engine set aside for it); admin writes are UNAVAILABLE; outcomes queue. After SIGCONT
// the queue replays once (the breaker and the ledger count each outcome
// once) and answers are no longer degraded.
func TestDegradedWhileRedisPaused(t *testing.T) {
	srv := redistest.Standalone(t)
	r := boundedPair(t, srv.Addr)
	ctx := context.Background()
	const pool = 10
	if _, err := r[0].store.OpenRun(policy.Run{ID: "batch-1", Tenant: "acme", Pool: pool, Cutoff: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	call := func(id string) *pb.CallRef {
		return &pb.CallRef{Tenant: "acme", Target: "pay", CallId: id, Idempotent: true, RunId: "batch-1"}
	}
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	// Each replica spends one retry while Redis answers: what it knows.
	for i := range r {
		resp, err := r[i].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("warm-" + strconv.Itoa(i)), Attempt: 1, Failure: fail503})
		if err != nil || resp.GetDecision() != pb.Decision_DECISION_RETRY || resp.GetDegraded() {
			t.Fatalf("replica %d: NextDelay before the pause = %v, %v; want RETRY, not degraded", i, resp, err)
		}
	}
	left := uint64(pool - 2)

	srv.Pause(t)
	// The first calls find Redis silent and bring the engine down.
	granted := uint64(0)
	for i := range r {
		n := 0
		eventually(t, "the engine down on replica "+strconv.Itoa(i), func() bool {
			n++
			resp, err := r[i].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("trip-" + strconv.Itoa(i) + "-" + strconv.Itoa(n)), Attempt: 1,
				Failure: fail503})
			if err != nil {
				t.Fatalf("NextDelay with Redis stopped: %v (want a degraded answer)", err)
			}
			if resp.GetDecision() == pb.Decision_DECISION_RETRY {
				granted++
			}
			return !r[i].store.Up() && resp.GetDegraded()
		})
	}
	for i := range r {
		for j := range 20 {
			resp, err := r[i].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("d-" + strconv.Itoa(i) + "-" + strconv.Itoa(j)), Attempt: 1,
				Failure: fail503})
			if err != nil {
				t.Fatalf("NextDelay degraded: %v", err)
			}
			if !resp.GetDegraded() {
				t.Fatalf("NextDelay with the engine down = %v: not flagged degraded", resp)
			}
			switch {
			case resp.GetDecision() == pb.Decision_DECISION_RETRY:
				granted++
			case resp.GetStopReason() != pb.StopReason_STOP_REASON_BUDGET_EXHAUSTED && resp.GetStopReason() != pb.StopReason_STOP_REASON_CIRCUIT_OPEN:
				t.Fatalf("NextDelay degraded = %v, want RETRY or a stop by the pool or the breaker", resp)
			}
		}
		a, err := r[i].workers.Admit(ctx, &pb.AdmitRequest{Call: call("admit-" + strconv.Itoa(i)), Attempt: 1})
		if err != nil || !a.GetDegraded() {
			t.Fatalf("Admit with the engine down = %v, %v; want an answer flagged degraded", a, err)
		}
	}
	// The trip calls count too: all the pause's grants together stay
	// within what the pool held.
	t.Logf("retries granted during the pause: %d, pool left before it: %d", granted, left)
	if granted > left {
		t.Errorf("replicas granted %d retries from a pool of %d left", granted, left)
	}
	_, err := r[0].admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "acme", Capacity: 5}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("SetTenantBudget with the engine down = %v, want UNAVAILABLE", err)
	}
	// Outcomes queue: ten successes of another breaker, each ending its call.
	out := &pb.ReportOutcomeRequest{}
	for i := range 10 {
		out.Outcomes = append(out.Outcomes, &pb.Outcome{Call: &pb.CallRef{Tenant: "acme", Target: "ledger", CallId: "o" + strconv.Itoa(i),
			Idempotent: true, RunId: "batch-1"}, Attempt: 1, Success: true, FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED})
	}
	if _, err := r[1].workers.ReportOutcome(ctx, out); err != nil {
		t.Fatalf("ReportOutcome with the engine down: %v", err)
	}
	if r[1].store.Queued() == 0 {
		t.Fatal("no outcome batch queued with the engine down")
	}

	srv.Resume(t)
	eventually(t, "the queue replayed", func() bool { return r[1].store.Up() && r[1].store.Queued() == 0 })
	eventually(t, "the engine up on replica 0", r[0].store.Up)
	run, err := r[0].store.Run("batch-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("after SIGCONT: run spent %d of %d, ledger succeeded %d", run.Spent, run.Pool, run.Ledger.Succeeded)
	if run.Spent > run.Pool {
		t.Errorf("run spent %d of a pool of %d", run.Spent, run.Pool)
	}
	if run.Ledger.Succeeded != 10 {
		t.Errorf("ledger counts %d successes, want 10 (each outcome once)", run.Ledger.Succeeded)
	}
	b, err := r[0].store.Breaker(policy.BreakerKey{Tenant: "acme", Target: "ledger"})
	if err != nil {
		t.Fatal(err)
	}
	if b.WindowCalls != 10 {
		t.Errorf("breaker acme/ledger counted %d calls, want 10 (the batch applied once)", b.WindowCalls)
	}
	if r[1].store.Dropped() != 0 {
		t.Errorf("%d batches dropped", r[1].store.Dropped())
	}
	resp, err := r[0].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("after"), Attempt: 1, Failure: fail503})
	if err != nil || resp.GetDegraded() {
		t.Errorf("NextDelay after SIGCONT = %v, %v; want an answer not degraded", resp, err)
	}
}

// TestDegradedProbeOfTheEngineAnswered: a HALF_OPEN probe permit handed
// out by the engine, reported while the engine does not answer, settles
// nothing on the replica's local copy (which cannot check it) and the
// decision is answered, flagged degraded: it was FAILED_PRECONDITION.
func TestDegradedProbeOfTheEngineAnswered(t *testing.T) {
	srv := redistest.Standalone(t)
	r := boundedReplica(t, srv.Addr)
	ctx := context.Background()
	one := uint32(1)
	eventually(t, "the policy written (a store call of 50ms may time out on a loaded machine)", func() bool {
		_, err := r.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "pay", Policy: &pb.Policy{
			Breaker: &pb.BreakerSettings{ConsecutiveFailures: &one, Cooldown: durationpb.New(time.Millisecond)}}})
		return err == nil
	})
	call := &pb.CallRef{Tenant: "acme", Target: "pay", CallId: "c1", Idempotent: true}
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	eventually(t, "the policy on the replica", func() bool {
		p, _ := r.store.Resolve("acme", "pay")
		return p.Breaker.Cooldown == time.Millisecond
	})
	if _, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call, Attempt: 1, Failure: fail503}); err != nil {
		t.Fatal(err)
	}
	var permit string
	eventually(t, "a probe permit once the cool-down ends", func() bool {
		a, err := r.workers.Admit(ctx, &pb.AdmitRequest{Call: call, Attempt: 2})
		if err != nil {
			t.Fatal(err)
		}
		permit = a.GetPermitId()
		return a.GetAdmitted() && permit != ""
	})
	srv.Pause(t)
	n := 0
	eventually(t, "the engine down", func() bool {
		n++
		_, _ = r.workers.Admit(ctx, &pb.AdmitRequest{Call: &pb.CallRef{Tenant: "acme", Target: "other", CallId: "d" + strconv.Itoa(n)}, Attempt: 1})
		_, _ = r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "other", CallId: "d" + strconv.Itoa(n),
			Idempotent: true}, Attempt: 1, Failure: fail503})
		return !r.store.Up()
	})
	resp, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call, Attempt: 2, Failure: fail503, PermitId: permit})
	if err != nil || !resp.GetDegraded() {
		t.Fatalf("NextDelay of the engine's probe with the engine down = %v, %v; want an answer flagged degraded", resp, err)
	}
}

// TestDegradedOutcomeWithFinalDispositionQueued: with the engine down, a
// ReportOutcome whose final disposition is checked against the breaker
// (a dead letter) is accepted and queued, the breaker read from what the
// replica last knew: it was UNAVAILABLE.
func TestDegradedOutcomeWithFinalDispositionQueued(t *testing.T) {
	srv := redistest.Standalone(t)
	r := boundedReplica(t, srv.Addr)
	ctx := context.Background()
	call := &pb.CallRef{Tenant: "acme", Target: "pay", CallId: "c1", Idempotent: true}
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	if _, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call, Attempt: 1, Failure: fail503}); err != nil {
		t.Fatal(err) // the replica knows the breaker
	}
	srv.Pause(t)
	r.until(t, "the engine down", func() bool { return !r.store.Up() })
	_, err := r.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: call, Attempt: 2,
		Failure: fail503, FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER}}})
	if err != nil {
		t.Fatalf("ReportOutcome of a dead letter with the engine down: %v, want it accepted", err)
	}
	if r.store.Queued() == 0 {
		t.Error("no outcome batch queued with the engine down")
	}
}

// TestDegradedProbeReportedAfterRecovery: a HALF_OPEN probe permit a
// replica's local copy handed out while the engine did not answer,
// reported once the engine answers again, to that replica or to another
// (the clients spread calls over the replicas), is not refused: the
// engine never handed it out, so it is sent as a result without a permit
// (in HALF_OPEN it settles nothing, as a late result does). Every replica
// tells such a permit from the engine's by its id. It was
// FAILED_PRECONDITION (policybench replicas, stop-redis: 1-6 of them on
// the replica that drew it; one on another, after that was fixed).
func TestDegradedProbeReportedAfterRecovery(t *testing.T) {
	for _, tc := range []struct {
		name    string
		another bool
	}{{"to the replica that drew it", false}, {"to another replica", true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			a := boundedReplica(t, srv.Addr)
			b := a
			if tc.another {
				b = boundedReplica(t, srv.Addr)
			}
			ctx := context.Background()
			one, four := uint32(1), uint32(4) // a's share: ceil(4 / 2 live replicas) = 2 probes
			eventually(t, "the policy written (a store call of 50ms may time out on a loaded machine)", func() bool {
				_, err := a.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "pay", Policy: &pb.Policy{
					Breaker: &pb.BreakerSettings{ConsecutiveFailures: &one, HalfOpenProbes: &four, Cooldown: durationpb.New(time.Millisecond)}}})
				return err == nil
			})
			for _, r := range []*replica{a, b} {
				eventually(t, "the policy on the replicas", func() bool {
					p, _ := r.store.Resolve("acme", "pay")
					return p.Breaker.Cooldown == time.Millisecond
				})
			}
			fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
			call := func(id string) *pb.CallRef {
				return &pb.CallRef{Tenant: "acme", Target: "pay", CallId: id, Idempotent: true}
			}
			if _, err := a.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("trip"), Attempt: 1, Failure: fail503}); err != nil {
				t.Fatal(err) // the breaker OPEN, and replica a knows it
			}
			srv.Pause(t)
			a.until(t, "the engine down", func() bool { return !a.store.Up() })
			var permits []string
			for _, id := range []string{"c1", "c2"} {
				eventually(t, "a degraded probe permit once the cool-down ends", func() bool {
					r, err := a.workers.Admit(ctx, &pb.AdmitRequest{Call: call(id), Attempt: 1})
					if err != nil {
						t.Fatal(err)
					}
					if r.GetAdmitted() && r.GetPermitId() != "" {
						if !r.GetDegraded() {
							t.Fatalf("Admit with the engine down = %v, want it flagged degraded", r)
						}
						permits = append(permits, r.GetPermitId())
						return true
					}
					return false
				})
			}
			srv.Resume(t)
			// Until the engine answers b within its 50ms: counted up is not
			// enough, as the first calls after SIGCONT may still time out,
			// and an answer made without the engine is (rightly) flagged
			// degraded, which the check below would take for the bug.
			settle := 0
			eventually(t, "the engine answering replica b", func() bool {
				settle++
				resp, err := b.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "other",
					CallId: "settle-" + strconv.Itoa(settle), Idempotent: true}, Attempt: 1, Failure: fail503})
				return err == nil && !resp.GetDegraded()
			})
			resp, err := b.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("c1"), Attempt: 1, Failure: fail503, PermitId: permits[0]})
			if err != nil || resp.GetDegraded() {
				t.Errorf("NextDelay of a degraded probe after recovery = %v, %v; want an answer, not degraded", resp, err)
			}
			rep, err := b.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: call("c2"), Attempt: 1, Success: true,
				PermitId: permits[1], FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}}})
			if err != nil || rep.GetAccepted() != 1 || len(rep.GetRefused()) != 0 {
				t.Errorf("ReportOutcome of a degraded probe's success after recovery = %v, %v; want it accepted", rep, err)
			}
		})
	}
}
