package storetest

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/fleet"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// testNextDelays drives NextDelay decisions through the server over the
// engine (whatever path the engine takes them by: a batch of Changes, or
// one step of its own, server.OneCallNextDelay) and checks every answer
// against what the rules say (policy.Decide, policy.SpreadHint,
// fleet.GateRetry's order): a retry and its spend, a replay on another
// replica, a lower attempt refused, an open circuit, a delay spread over
// the fleet's cool-down, the deadline that cool-down breaks, a tenant's
// budget spent, a run's pool spent, a STOP and the refusal after it; and
// that each decision left its audit record, its call-table note and, for
// a STOP, its attempt tally.
func testNextDelays(t *testing.T, e *env) {
	ctx := context.Background()
	p := policy.Default()
	p.Backoff = policy.Backoff{Base: time.Second, Factor: 2, Max: 30 * time.Second, Jitter: policy.JitterNone}
	p.MaxAttempts, p.AttemptTimeout = 3, time.Second
	p.Breaker.ConsecutiveFailures = 100 // only a forced breaker opens here
	for _, tenant := range []string{"nd", "poor"} {
		if _, err := e.s.SetPolicy(tenant, "", p); err != nil {
			t.Fatalf("SetPolicy(%s): %v", tenant, err)
		}
	}
	if _, err := e.s.SetBudget(policy.TenantBudget{Tenant: "poor", Capacity: 1, DepositRatio: 0.1, MinPerSecond: 0.001,
		RetryCost: 1, TimeoutCost: 1}); err != nil {
		t.Fatalf("SetBudget: %v", err)
	}
	run, err := e.s.OpenRun(policy.Run{Tenant: "nd", Pool: 1, Cutoff: e.clock.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("OpenRun: %v", err)
	}
	e.everywhere(t, "the policies, the budget and the run", func(s server.Store) bool {
		got, _ := s.Resolve("poor", "api")
		b, err := s.Budget("poor")
		_, rerr := s.Run(run.ID)
		return got.Breaker.ConsecutiveFailures == 100 && err == nil && b.Budget.Capacity == 1 && rerr == nil
	})
	const draw = 0.5
	decisions := make([]*server.Decisions, len(e.replicas))
	for i, s := range e.replicas {
		decisions[i] = server.NewDecisions(s, server.Config{Clock: e.clock, Rand: func() float64 { return draw }})
	}
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	call := func(tenant, target, id string) *pb.CallRef {
		return &pb.CallRef{Tenant: tenant, Target: target, CallId: id, Idempotent: true}
	}
	next := func(i int, c *pb.CallRef, attempt uint32) (*pb.NextDelayResponse, error) {
		return decisions[i%len(decisions)].NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: attempt, Failure: fail503})
	}
	decide := func(what string, i int, c *pb.CallRef, attempt uint32) *pb.NextDelayResponse {
		t.Helper()
		resp, err := next(i, c, attempt)
		if err != nil {
			t.Fatalf("%s: NextDelay = %v", what, err)
		}
		return resp
	}
	retries := func(what string, resp *pb.NextDelayResponse, delay time.Duration) {
		t.Helper()
		if resp.GetDecision() != pb.Decision_DECISION_RETRY || resp.GetDelay().AsDuration() != delay {
			t.Errorf("%s: %v after %v, want RETRY after %v", what, resp.GetDecision(), resp.GetDelay().AsDuration(), delay)
		}
	}
	stops := func(what string, resp *pb.NextDelayResponse, stop pb.StopReason, disp pb.Disposition) {
		t.Helper()
		if resp.GetDecision() != pb.Decision_DECISION_STOP || resp.GetStopReason() != stop || resp.GetDisposition() != disp {
			t.Errorf("%s: %v %v %v, want STOP %v %v", what, resp.GetDecision(), resp.GetStopReason(), resp.GetDisposition(), stop, disp)
		}
	}
	refused := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "attempt") {
			t.Errorf("%s: %v, want FAILED_PRECONDITION naming attempt", what, err)
		}
	}
	nominal := func(attempt int) time.Duration { return policy.Nominal(p.Backoff, attempt-1) }

	// A retry spends one token of the tenant's default budget.
	c1 := call("nd", "api", "c1")
	first := decide("retry", 0, c1, 1)
	retries("retry", first, nominal(1))
	if got, want := first.GetTenantBudgetRemaining(), fleet.DefaultBudget().Capacity-1; got != want {
		t.Errorf("retry: %v tokens left, want %v", got, want)
	}
	if got := strings.Join(first.GetChecks(), ","); got != "classification,idempotency,attempts,pushback,deadline,breaker,tenant_budget" {
		t.Errorf("retry: checks %s, want every rule to the tenant's budget", got)
	}
	// The same attempt again, on another replica: the answer again, nothing
	// spent twice; a lower attempt, once the next is decided, is refused.
	if again := decide("replay", 1, c1, 1); !proto.Equal(again, first) {
		t.Errorf("replay on replica 1:\n%v\nwant the first answer\n%v", again, first)
	}
	retries("attempt 2", decide("attempt 2", 0, c1, 2), nominal(2))
	_, err = next(2, c1, 1)
	refused("attempt 1 after attempt 2", err)
	// The last attempt stops; no attempt follows a STOP.
	stops("attempt 3", decide("attempt 3", 0, c1, 3), pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED, pb.Disposition_DISPOSITION_DEAD_LETTER)
	_, err = next(1, c1, 4)
	refused("attempt 4 after a STOP", err)

	// An open circuit stops without spending.
	key := policy.KeyFor(p.Breaker, "nd", "down")
	if _, err := e.s.ForceBreaker(key, policy.BreakerOpen); err != nil {
		t.Fatalf("ForceBreaker: %v", err)
	}
	open := decide("open", 0, call("nd", "down", "c2"), 1)
	stops("open", open, pb.StopReason_STOP_REASON_CIRCUIT_OPEN, pb.Disposition_DISPOSITION_CIRCUIT_OPEN)
	if open.GetTenantBudgetRemaining() != 0 || open.GetBreakerState() != pb.BreakerState_BREAKER_STATE_OPEN {
		t.Errorf("open: %v tokens, breaker %v; want nothing spent, OPEN", open.GetTenantBudgetRemaining(), open.GetBreakerState())
	}

	// A cool-down of the fleet longer than the delay: the delay is spread
	// over it; with a deadline before its end, the call stops there.
	slow := policy.KeyFor(p.Breaker, "nd", "slow")
	u := e.s.Begin()
	if _, err := u.ExtendCooldown(slow, p.Breaker, e.clock.Now().Add(20*time.Second)); err != nil {
		t.Fatalf("ExtendCooldown: %v", err)
	}
	if err := u.Commit(); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	spread := decide("cool-down", 0, call("nd", "slow", "c3"), 1)
	retries("cool-down", spread, policy.SpreadHint(p.Pushback, 20*time.Second, draw))
	if spread.GetPushbackNote() != "cooldown:fleet" {
		t.Errorf("cool-down: note %q, want cooldown:fleet", spread.GetPushbackNote())
	}
	late := call("nd", "slow", "c4")
	late.DeadlineTime = timestamppb.New(e.clock.Now().Add(10 * time.Second))
	stops("cool-down past the deadline", decide("deadline", 1, late, 1), pb.StopReason_STOP_REASON_DEADLINE, pb.Disposition_DISPOSITION_DEAD_LETTER)

	// A budget of one token: one retry, then BUDGET_EXHAUSTED.
	retries("poor tenant's first retry", decide("budget", 0, call("poor", "api", "c5"), 1), nominal(1))
	stops("poor tenant's second retry", decide("budget spent", 2, call("poor", "api", "c6"), 1),
		pb.StopReason_STOP_REASON_BUDGET_EXHAUSTED, pb.Disposition_DISPOSITION_DEAD_LETTER)

	// A run's pool of one retry: one retry, then BUDGET_EXHAUSTED, each
	// noted in the run's call table.
	inRun := func(id string) *pb.CallRef { c := call("nd", "api", id); c.RunId = run.ID; return c }
	pooled := decide("run pool", 0, inRun("r1"), 1)
	retries("run pool", pooled, nominal(1))
	if pooled.GetRunBudgetRemaining() != 0 {
		t.Errorf("run pool: %d left, want 0", pooled.GetRunBudgetRemaining())
	}
	stops("run pool spent", decide("run pool spent", 1, inRun("r2"), 1),
		pb.StopReason_STOP_REASON_BUDGET_EXHAUSTED, pb.Disposition_DISPOSITION_DEAD_LETTER)

	// What the decisions left behind: their audit records, the run's call
	// table, the attempt tallies of the STOPs (the last two held for a
	// flush by an engine that decides a NextDelay in one step).
	e.settle()
	recs, _, err := e.s.QueryAudit(policy.AuditQuery{Tenant: "nd", CallID: "c1"})
	if err != nil {
		t.Fatalf("QueryAudit: %v", err)
	}
	var verdicts []string
	for _, r := range recs {
		if r.Event == policy.AuditDecision {
			verdicts = append(verdicts, r.Verdict.String()+"/"+r.Stop.String())
		}
	}
	if got := strings.Join(verdicts, " "); got != "RETRY/NONE RETRY/NONE STOP/ATTEMPTS_EXHAUSTED" {
		t.Errorf("c1's decisions in the audit trail: %s, want two retries and the stop, the replay not among them", got)
	}
	e.everywhere(t, "the run's call table noting r1 and r2", func(s server.Store) bool {
		calls, _, err := s.RunCalls(run.ID, policy.RunCallFilter{}, "", 0)
		return err == nil && len(calls) == 2 && calls[0].Attempts == 1 && calls[1].Attempts == 1 &&
			strings.Contains(calls[1].Detail, "budget")
	})
	e.everywhere(t, "the STOPs' attempt tallies", func(s server.Store) bool {
		st, err := s.AttemptStats("nd", "", e.clock.Now().Add(-time.Hour))
		if err != nil {
			return false
		}
		failures := map[string]uint64{}
		for _, ts := range st {
			failures[ts.Target] += ts.Failures.Total()
		}
		// c1 at attempt 3, c2 on down, c4 on slow, r2 on api
		return failures["api"] == 2 && failures["down"] == 1 && failures["slow"] == 1
	})
}
