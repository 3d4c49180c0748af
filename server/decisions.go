package server

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// Clock tells the time. The daemon uses the wall clock; tests inject a fake.
type Clock interface{ Now() time.Time }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Config configures the services. Zero fields take the defaults named.
type Config struct {
	Clock  Clock          // default: the wall clock
	Rand   func() float64 // random draws in [0,1); default math/rand/v2
	Logger *slog.Logger   // default: slog.Default()
	// Auth, when set, authenticates and authorizes every call; nil
	// leaves every service open (tests, embedding in a trusted process).
	Auth *Auth
	// Shedder, when set, sheds unary calls beyond its cap with
	// RESOURCE_EXHAUSTED.
	Shedder *Shedder
	// Metrics, when set, counts decisions, outcomes and budgets and times
	// every RPC; nil records nothing.
	Metrics *Metrics
	// WatchBuffer is the per-subscriber queue of breaker events; a
	// subscriber that falls further behind is disconnected. Default 1024.
	WatchBuffer int
	// StreamWorkers is the number of goroutines server.New keeps to serve
	// calls (grpc-go's NumStreamWorkers): reused from call to call, they
	// keep the stack a handler grew instead of growing a new goroutine's
	// on every call; a call that finds them all busy gets a goroutine of
	// its own. Default DefaultStreamWorkers; negative: a goroutine per call.
	StreamWorkers int
	// MaxClockSkew is how far after the daemon's clock a call's
	// origin_time may lie; beyond it NextDelay refuses the call with
	// INVALID_ARGUMENT. Default DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// DeclaredTenants, when set, admits to worker calls only the tenants it
	// reports true for; a call naming another tenant is PERMISSION_DENIED,
	// the same whether or not that tenant has state (--tenants=declared).
	DeclaredTenants func(tenant string) bool
	// SlowRequest is how long a unary call may take before the
	// slow-request log counts it (a WARN line "slow requests" at most once
	// a second, with how many and the slowest). Default
	// DefaultSlowRequest; negative: off.
	SlowRequest time.Duration
}

// DefaultStreamWorkers is Config.StreamWorkers' default.
const DefaultStreamWorkers = 64

func (c Config) withDefaults() Config {
	if c.Clock == nil {
		c.Clock = wallClock{}
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.WatchBuffer <= 0 {
		c.WatchBuffer = 1024
	}
	if c.StreamWorkers == 0 {
		c.StreamWorkers = DefaultStreamWorkers
	}
	if c.MaxClockSkew <= 0 {
		c.MaxClockSkew = DefaultMaxClockSkew
	}
	if c.SlowRequest == 0 {
		c.SlowRequest = DefaultSlowRequest
	}
	return c
}

// Decisions implements RetryPolicyService over a Store. It is safe for
// concurrent use.
type Decisions struct {
	pb.UnimplementedRetryPolicyServiceServer
	store Store
	cfg   Config
	up    upReporter // the store's, nil for an engine that is always up
}

// upReporter is a store that can be out of reach: a shared engine that
// decides in degraded mode while Up is false (redisstore).
type upReporter interface{ Up() bool }

// NewDecisions returns the worker-facing service.
func NewDecisions(store Store, cfg Config) *Decisions {
	up, _ := store.(upReporter)
	return &Decisions{store: store, cfg: cfg.withDefaults(), up: up}
}

// degraded reports whether the store is deciding in degraded mode.
func (d *Decisions) degraded() bool { return d.up != nil && !d.up.Up() }

// Classify says whether a failure is worth retrying under the policy of the
// call's tenant and target.
func (d *Decisions) Classify(_ context.Context, req *pb.ClassifyRequest) (*pb.ClassifyResponse, error) {
	call, err := checkNamed("call", func(field string) (callRef, error) { return callFromPB(field, req.GetCall(), false) })
	if err != nil {
		return nil, err
	}
	f, err := failureFromPB("failure", req.GetFailure())
	if err != nil {
		return nil, err
	}
	p, _ := d.store.Resolve(call.tenant, call.target)
	c := policy.Classify(&p, f, call.idempotent, call.key != "")
	return &pb.ClassifyResponse{Retryable: c.Retryable, Category: enumToPB[pb.Category](c.Category), Reason: c.Reason}, nil
}

// NextDelay decides after a failed attempt: the stateless rules of policy
// first, then the shared breaker, the fleet-wide cool-down, the deadline
// again, and the tenant and run budgets. A refusal is an OK answer.
func (d *Decisions) NextDelay(ctx context.Context, req *pb.NextDelayRequest) (*pb.NextDelayResponse, error) {
	call, err := checkNamed("call", func(field string) (callRef, error) { return callFromPB(field, req.GetCall(), true) })
	if err != nil {
		return nil, err
	}
	if req.GetAttempt() < 1 || req.GetAttempt() > maxAttempt {
		return nil, invalid("attempt", "must be 1 to "+strconv.Itoa(maxAttempt)+" (the attempt that failed, counting the first as 1)")
	}
	f, err := failureFromPB("failure", req.GetFailure())
	if err != nil {
		return nil, err
	}
	hints, err := checkNamed("pushback", func(field string) (policy.Hints, error) { return hintsFromPB(field, req.GetPushback()) })
	if err != nil {
		return nil, err
	}
	prev, err := duration("previous_delay", req.GetPreviousDelay(), 0)
	if err != nil {
		return nil, err
	}
	if err := checkName("permit_id", req.GetPermitId(), maxCallIDLen, false); err != nil {
		return nil, err
	}
	if err := checkName("lease_id", req.GetLeaseId(), maxCallIDLen, false); err != nil {
		return nil, err
	}
	if err := checkName("attempt_target", req.GetAttemptTarget(), maxTargetLen, false); err != nil {
		return nil, err
	}
	target := call.target
	if t := req.GetAttemptTarget(); t != "" {
		target = t
	}

	if err := checkOrigin("call.origin_time", call.origin, d.cfg.Clock.Now(), d.cfg.MaxClockSkew); err != nil {
		return nil, err
	}
	ans, why, err := d.decideNextDelay(ctx, &nextDelayRequest{call: call, attempt: req.GetAttempt(), failure: f,
		hints: hints, prev: prev, permit: req.GetPermitId(), lease: req.GetLeaseId(), target: target})
	if err != nil {
		return nil, err
	}
	return nextDelayToPB(&ans, why), nil
}

// runOf returns run id for tenant. Another tenant's run is NOT_FOUND, with
// the very message of a run that does not exist, so a caller cannot learn
// which run ids other tenants use.
func (d *Decisions) runOf(ctx context.Context, runs runReader, field, id, tenant string) (policy.Run, error) {
	r, err := runs.Run(id)
	if err == nil && r.Tenant == tenant {
		return r, nil
	}
	if err == nil || notFound(err) {
		return policy.Run{}, status.Error(codes.NotFound, field+": run "+strconv.Quote(id)+" not found for tenant "+strconv.Quote(tenant))
	}
	return policy.Run{}, storeError(ctx, d.cfg.Logger, field, err)
}

// ReportOutcome records a batch of outcomes. The batch is validated whole
// before anything is applied, so a bad entry loses nothing.
func (d *Decisions) ReportOutcome(ctx context.Context, req *pb.ReportOutcomeRequest) (*pb.ReportOutcomeResponse, error) {
	outs := req.GetOutcomes()
	if len(outs) == 0 || len(outs) > maxOutcomes {
		return nil, invalid("outcomes", "must hold 1 to "+strconv.Itoa(maxOutcomes)+" outcomes, got "+strconv.Itoa(len(outs)))
	}
	sc := outcomeScratchPool.Get().(*outcomeScratch)
	defer sc.put()
	items := slices.Grow(sc.items[:0], len(outs))[:len(outs)]
	sc.items = items
	for i, o := range outs {
		if err := outcomeFromPB("", o, &items[i]); err != nil {
			// Only now build the field's path, checking again under it: a
			// valid batch of a thousand outcomes builds no paths at all.
			return nil, outcomeFromPB("outcomes["+strconv.Itoa(i)+"]", o, &items[i])
		}
	}
	// Every engine call of this request goes through u, which bounds them
	// together (redisstore: one --store-timeout for all of them).
	u := d.store.Begin()
	n, ups, err := d.decideOutcomes(ctx, u, items, sc)
	d.cfg.Metrics.successes(items[:n])
	if err != nil {
		return nil, err
	}
	resp := &pb.ReportOutcomeResponse{Accepted: uint32(len(outs))}
	for i := range ups[:n] {
		if r := ups[i].Refused; r != nil {
			resp.Refused = append(resp.Refused, refusalToPB(i, r))
		}
	}
	resp.Accepted -= uint32(len(resp.Refused))
	var chains []targetFallback
	resp.FlowControlledTargets, chains = d.settleLeases(ctx, u, items[:n])
	for _, c := range chains {
		resp.FallbackChains = append(resp.FallbackChains, &pb.FallbackChain{Target: c.target, Fallback: fallbackToPB(c.fallback)})
	}
	return resp, nil
}

// outcomeScratch is ReportOutcome's working memory, reused from request to
// request: a batch of a thousand outcomes needs a few hundred KB of it,
// which the store copies what it keeps from.
type outcomeScratch struct {
	items []outcomeItem
	ups   []policy.OutcomeUpdate
	trail []policy.AuditRecord
	pols  requestPolicies
}

// requestPolicies are the policies one request's outcomes resolved, each
// tenant and target once: a batch of 256 outcomes over 16 targets, in
// any order, resolves 16 times, not 256 (each a store lookup and two
// copies of a 360-byte policy). A batch is mostly one tenant's, so the
// policies are kept by target for the first tenant seen; another
// tenant's are resolved each time. A policy changed during the request is
// seen by the next one, as it would be had the request come a moment
// earlier.
type requestPolicies struct {
	tenant string
	at     map[string]int // tenant's, by target: index in p
	p      []policy.Policy
}

// reset forgets the last request's policies.
func (rp *requestPolicies) reset() {
	clear(rp.at)
	clear(rp.p) // pins no policy's strings
	rp.p, rp.tenant = rp.p[:0], ""
}

// resolve returns the index in rp.p of the policy of tenant and target,
// resolved through st the first time. A pointer into rp.p is good until
// the next resolve.
func (rp *requestPolicies) resolve(st Policies, tenant, target string) int {
	if len(rp.p) == 0 {
		rp.tenant = tenant
	}
	mine := tenant == rp.tenant
	if i, ok := rp.at[target]; ok && mine {
		return i
	}
	p, _ := st.Resolve(tenant, target)
	rp.p = append(rp.p, p)
	if mine {
		if rp.at == nil {
			rp.at = make(map[string]int)
		}
		rp.at[target] = len(rp.p) - 1
	}
	return len(rp.p) - 1
}

var outcomeScratchPool = sync.Pool{New: func() any { return new(outcomeScratch) }}

// put returns sc to the pool, cleared so it pins no request's strings.
func (sc *outcomeScratch) put() {
	clear(sc.items)
	clear(sc.ups)
	clear(sc.trail)
	sc.items, sc.ups, sc.trail = sc.items[:0], sc.ups[:0], sc.trail[:0]
	sc.pols.reset()
	outcomeScratchPool.Put(sc)
}

// finalDetails are the details of FINAL records, by disposition and stop
// reason, made once rather than for every call that ends.
var finalDetails = func() (t [policy.DispositionCircuitOpen + 1][policy.StopServerPushback + 1]string) {
	for fd := range t {
		for stop := range t[fd] {
			t[fd][stop] = "final disposition " + policy.Disposition(fd).String()
			if policy.StopReason(stop) != policy.StopNone {
				t[fd][stop] += " (" + policy.StopReason(stop).String() + ")"
			}
		}
	}
	return t
}()

// finalDetail is the detail of a FINAL record.
func finalDetail(fd policy.Disposition, stop policy.StopReason) string {
	if int(fd) < len(finalDetails) && int(stop) < len(finalDetails[fd]) {
		return finalDetails[fd][stop]
	}
	return "final disposition " + fd.String() + " (" + stop.String() + ")"
}

// Admit asks the shared breaker whether an attempt may go ahead.
func (d *Decisions) Admit(ctx context.Context, req *pb.AdmitRequest) (*pb.AdmitResponse, error) {
	call, err := checkNamed("call", func(field string) (callRef, error) { return callFromPB(field, req.GetCall(), false) })
	if err != nil {
		return nil, err
	}
	if req.GetAttempt() > maxAttempt {
		return nil, invalid("attempt", "must be at most "+strconv.Itoa(maxAttempt))
	}
	if err := checkName("attempt_target", req.GetAttemptTarget(), maxTargetLen, false); err != nil {
		return nil, err
	}
	target := call.target
	if t := req.GetAttemptTarget(); t != "" {
		target = t
	}
	a, err := d.decideAdmit(ctx, call, target, req.GetAttempt())
	if err != nil {
		return nil, err
	}
	if a.LeaseID != "" && ctx.Err() != nil {
		// The caller stopped waiting (its decision timeout passed, or it
		// was cut off): the answer cannot reach it, so the lease goes back
		// now instead of holding a slot of the ceiling until it expires.
		if a.Target != "" {
			target = a.Target
		}
		p, _ := d.store.Resolve(call.tenant, target)
		d.releaseLease(ctx, d.store, &p, call, target, a.LeaseID, policy.SignalNone)
	}
	return admissionToPB(&a), nil
}

// PlanBudget fits retries into a window, offline.
func (d *Decisions) PlanBudget(_ context.Context, req *pb.PlanBudgetRequest) (*pb.PlanBudgetResponse, error) {
	in, hops, err := planInputFromPB(req)
	if err != nil {
		return nil, err
	}
	if in, err = d.planRemaining(req, in); err != nil {
		return nil, err
	}
	if hops <= 1 {
		plan, err := policy.PlanBudget(in)
		if err != nil {
			return nil, invalidFrom("", err)
		}
		return &pb.PlanBudgetResponse{Plan: planToPB(plan)}, nil
	}
	plans, err := policy.SplitHops(in, hops)
	if err != nil {
		return nil, invalidFrom("", err)
	}
	resp := &pb.PlanBudgetResponse{Plan: planToPB(plans[0])}
	for _, p := range plans {
		resp.Hops = append(resp.Hops, planToPB(p))
	}
	return resp, nil
}
