package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// The workload: benchTenants tenants, each calling benchHealthy targets that
// mostly work and benchFailing targets that always fail (their breakers
// open, go HALF_OPEN after a short cooldown, and open again). One tenant has
// a small retry budget that runs dry; the others have ample budgets.
const (
	benchTenants = 8
	benchHealthy = 16
	benchFailing = 2
	// benchCeiled is the number of targets with a concurrency ceiling,
	// which every tenant calls in the admit-ceiling phases.
	benchCeiled = 16
	// benchCeiling is their max_in_flight: far above the callers, so the
	// ceiling never refuses and the phases measure what a lease costs.
	benchCeiling = 1000000
	// failingShare is the share of calls that go to a failing target.
	failingShare = 0.1
	// defaultReportBatch is the number of outcomes per ReportOutcome
	// request: the Go client's default batch size.
	defaultReportBatch = 256
	// poolSize is the number of prebuilt requests each caller cycles
	// through, so building messages costs the client little.
	poolSize = 64
)

func tenantName(i int) string  { return fmt.Sprintf("bench-t%d", i) }
func healthyName(i int) string { return fmt.Sprintf("api-%02d", i) }
func failingName(i int) string { return fmt.Sprintf("down-%d", i) }
func ceiledName(i int) string  { return fmt.Sprintf("ceil-%02d", i) }

// setupWorkload writes the tenants' budgets and policies through the admin
// service: ample budgets (the last tenant's is small), breakers on healthy
// targets that tolerate mixed failures (50 in a row), and on the failing
// targets the default 5 with a 2s cooldown so they cycle through HALF_OPEN;
// the ceiled targets get a concurrency ceiling (benchCeiling) for every
// tenant, each tenant's leases under its own key. A write refused
// UNAVAILABLE is sent again (retryUnavailable).
func setupWorkload(ctx context.Context, admin pb.AdminServiceClient) error {
	// Every write sets a value, so one sent again after UNAVAILABLE (a
	// replica whose engine is counted down for a moment) changes nothing
	// more.
	setPolicy := func(req *pb.SetPolicyRequest) error {
		err := retryUnavailable(ctx, func(ctx context.Context) error {
			_, err := admin.SetPolicy(ctx, req)
			return err
		})
		if err != nil {
			return fmt.Errorf("SetPolicy %s: %w", strings.Trim(req.GetTenant()+"/"+req.GetTarget(), "/"), err)
		}
		return nil
	}
	ceiling := uint32(benchCeiling)
	for j := range benchCeiled {
		if err := setPolicy(&pb.SetPolicyRequest{Target: ceiledName(j), Policy: &pb.Policy{
			Flow: &pb.FlowSettings{MaxInFlight: &ceiling},
		}}); err != nil {
			return err
		}
	}
	tolerant := uint32(50)
	strict := uint32(5)
	maxAttempts := uint32(5)
	for i := range benchTenants {
		t := tenantName(i)
		b := &pb.TenantBudget{Tenant: t, Capacity: 1e9, MinRetriesPerSecond: 1e6, DepositRatio: 0.2}
		if i == benchTenants-1 {
			b = &pb.TenantBudget{Tenant: t, Capacity: 50, MinRetriesPerSecond: 20, DepositRatio: 0.1}
		}
		if err := retryUnavailable(ctx, func(ctx context.Context) error {
			_, err := admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: b})
			return err
		}); err != nil {
			return fmt.Errorf("SetTenantBudget %s: %w", t, err)
		}
		if err := setPolicy(&pb.SetPolicyRequest{Tenant: t, Policy: &pb.Policy{
			MaxAttempts: &maxAttempts,
			Breaker:     &pb.BreakerSettings{ConsecutiveFailures: &tolerant},
		}}); err != nil {
			return err
		}
		for j := range benchFailing {
			if err := setPolicy(&pb.SetPolicyRequest{Tenant: t, Target: failingName(j), Policy: &pb.Policy{
				MaxAttempts: &maxAttempts,
				Breaker:     &pb.BreakerSettings{ConsecutiveFailures: &strict, Cooldown: durationpb.New(2 * time.Second)},
			}}); err != nil {
				return err
			}
		}
	}
	return nil
}

// gen builds the requests of one caller from its own random source.
type gen struct {
	rng      *rand.Rand
	caller   int
	epoch    int64 // when the generator was made: call ids of two phases never meet
	seq      int
	batch    int // outcomes per ReportOutcome
	origin   *timestamppb.Timestamp
	deadline *timestamppb.Timestamp
}

func newGen(caller int, seed uint64) *gen {
	now := time.Now()
	return &gen{
		rng:      rand.New(rand.NewPCG(seed, uint64(caller))),
		caller:   caller,
		epoch:    now.UnixNano(),
		batch:    defaultReportBatch,
		origin:   timestamppb.New(now),
		deadline: timestamppb.New(now.Add(24 * time.Hour)),
	}
}

// pick returns a tenant and a target, and whether the target always fails.
func (g *gen) pick() (tenant, target string, failing bool) {
	tenant = tenantName(g.rng.IntN(benchTenants))
	if g.rng.Float64() < failingShare {
		return tenant, failingName(g.rng.IntN(benchFailing)), true
	}
	return tenant, healthyName(g.rng.IntN(benchHealthy)), false
}

func (g *gen) callRef(tenant, target string) *pb.CallRef {
	g.seq++
	return &pb.CallRef{
		Tenant: tenant, Target: target, CallId: fmt.Sprintf("c%d-%x-%d", g.caller, g.epoch, g.seq), Idempotent: true,
		OriginTime: g.origin, DeadlineTime: g.deadline,
	}
}

// outcomeRef is a call as the Go client names it in an outcome: tenant,
// target and call id (and run id) only, what ReportOutcome reads.
func outcomeRef(c *pb.CallRef) *pb.CallRef {
	return &pb.CallRef{Tenant: c.GetTenant(), Target: c.GetTarget(), CallId: c.GetCallId(), RunId: c.GetRunId()}
}

func httpFailure(code uint32) *pb.Failure {
	return &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: code}}
}

func (g *gen) admit() *pb.AdmitRequest {
	tenant, target, _ := g.pick()
	return &pb.AdmitRequest{Call: g.callRef(tenant, target), Attempt: uint32(1 + g.rng.IntN(3))}
}

// ceiledCall is a fresh call to a target with a concurrency ceiling.
func (g *gen) ceiledCall() *pb.CallRef {
	return g.callRef(tenantName(g.rng.IntN(benchTenants)), ceiledName(g.rng.IntN(benchCeiled)))
}

// failure is a failed attempt on a healthy target: mostly 503, some
// timeouts, terminal 422s, and now and then a 429 with a Retry-After.
func (g *gen) failure(failing bool) (*pb.Failure, *pb.Pushback) {
	if failing {
		return httpFailure(503), nil
	}
	switch r := g.rng.Float64(); {
	case r < 0.70:
		return httpFailure(503), nil
	case r < 0.80:
		return &pb.Failure{Kind: &pb.Failure_TransportError{TransportError: pb.TransportError_TRANSPORT_ERROR_TIMEOUT}}, nil
	case r < 0.98:
		return httpFailure(422), nil
	default:
		return httpFailure(429), &pb.Pushback{RetryAfter: "1"}
	}
}

func (g *gen) nextDelay() *pb.NextDelayRequest {
	tenant, target, failing := g.pick()
	f, push := g.failure(failing)
	return &pb.NextDelayRequest{
		Call: g.callRef(tenant, target), Attempt: uint32(1 + g.rng.IntN(3)), Failure: f, Pushback: push,
		PreviousDelay: durationpb.New(500 * time.Millisecond),
	}
}

// report is a batch of one tenant's outcomes, as a client sends them:
// mostly successes, some last failures closing their calls as dead letters
// (with the transient failure that justifies it: policyd refuses a dead
// letter it has no reason for), and failures on the failing targets.
func (g *gen) report() *pb.ReportOutcomeRequest {
	tenant := tenantName(g.rng.IntN(benchTenants))
	req := &pb.ReportOutcomeRequest{Outcomes: make([]*pb.Outcome, 0, g.batch)}
	for range g.batch {
		target := healthyName(g.rng.IntN(benchHealthy))
		o := &pb.Outcome{Attempt: 1, Latency: durationpb.New(time.Duration(5+g.rng.IntN(50)) * time.Millisecond)}
		switch r := g.rng.Float64(); {
		case r < 0.92:
			o.Success = true
			o.FinalDisposition = pb.Disposition_DISPOSITION_SUCCEEDED
		case r < 0.97:
			o.Attempt = 3
			o.Failure = httpFailure(503)
			o.FinalDisposition = pb.Disposition_DISPOSITION_DEAD_LETTER
			o.FinalStopReason = pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED
		default:
			target = failingName(g.rng.IntN(benchFailing))
			o.Failure = httpFailure(503)
		}
		o.Call = outcomeRef(g.callRef(tenant, target))
		req.Outcomes = append(req.Outcomes, o)
	}
	return req
}

func durationOf(d time.Duration) *durationpb.Duration { return durationpb.New(d) }
