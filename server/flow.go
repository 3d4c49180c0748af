package server

import (
	"context"
	"log/slog"
	"slices"

	"github.com/policyd/policyd/fleet"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// Flow control in domain types: the concurrency ceiling's leases, handed
// out by Admit and returned by the attempt's outcome (NextDelay,
// ReportOutcome) or ReleaseLease. A policy without a ceiling takes none of
// these paths: its Admit is the breaker's alone and its outcomes release
// nothing.

// admit is the admission of an attempt of call to target under p,
// target's effective policy: the breaker's alone, or, when p has a
// ceiling, a rate slot and a lease, then the breaker's (Store.AdmitFlow).
// A rate ceiling tells the exact wait; a full concurrency ceiling asks the
// caller to come back after the policy's backoff base delay, or sooner
// when a lease expires sooner. The admissions are asked of st: the Store,
// or a request's Changes.
func (d *Decisions) admit(st admitter, p *policy.Policy, call *callRef, target string) (policy.Admission, error) {
	key := policy.KeyFor(p.Breaker, call.tenant, target)
	if !p.FlowControlled() {
		return st.Admit(key, p.Breaker)
	}
	a, err := st.AdmitFlow(key, p.Breaker, p.FlowLimits())
	a.FlowControlled = true
	d.cfg.Metrics.lease(target, a.LeaseID != "", a.Reason)
	return a, err
}

// flowSignal is what an attempt's outcome tells an adaptive ceiling: a
// success grows it; a 429, or a 503 carrying a pushback hint (any of
// hints set), is the upstream asking for less and shrinks it; any other
// failure says nothing of its capacity.
func flowSignal(success bool, f policy.Failure, hints policy.Hints) policy.FlowSignal {
	switch {
	case success:
		return policy.SignalSuccess
	case f.Kind != policy.FailureHTTP:
		return policy.SignalNone
	case f.Code == 429, f.Code == 503 && hints != (policy.Hints{}):
		return policy.SignalCongestion
	}
	return policy.SignalNone
}

// releaseLease returns lease, when set, to the ceiling of target (the
// call's primary or a fallback) under p, target's effective policy, with
// what the attempt's outcome tells an adaptive ceiling (sig,
// policy.SignalNone for a release without an outcome). A lease not held
// is ignored and counted; a store that cannot release it is logged, and
// the lease expires on its own.
func (d *Decisions) releaseLease(ctx context.Context, leases leaseReleaser, p *policy.Policy, call callRef, target, lease string, sig policy.FlowSignal) bool {
	if lease == "" {
		return false
	}
	held, err := leases.ReleaseLease(policy.KeyFor(p.Breaker, call.tenant, target), lease, p.FlowLimits(), sig)
	return d.released(ctx, call, target, held, err)
}

// released reports a release of a lease of call to target that answered
// held, err: a store that could not release it is logged (the lease
// expires on its own), a lease not held counted as a stray release. It
// returns held.
func (d *Decisions) released(ctx context.Context, call callRef, target string, held bool, err error) bool {
	if err != nil {
		d.cfg.Logger.WarnContext(ctx, "lease not released; it expires on its own", "call_id", call.callID,
			"tenant", call.tenant, "target", target, "err", err)
		return false
	}
	if !held {
		d.cfg.Metrics.strayRelease(target)
		if d.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
			d.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "release of a lease not held, ignored",
				slog.String("call_id", call.callID), slog.String("tenant", call.tenant), slog.String("target", target))
		}
	}
	return held
}

// targetFallback is the fallback of a primary target's effective policy.
type targetFallback struct {
	target   string
	fallback policy.Fallback
}

// settleLeases returns the leases the outcomes of a batch carry (each to
// its attempt's target), all in one step of the store's (ReleaseLeases),
// and lists, once each, the batch's targets whose
// policy has a concurrency ceiling, so a client that skips Admit while a
// breaker is CLOSED learns of one within a report, and the batch's
// primaries (outcomes of attempts on the call's own target) whose policy
// has a fallback, with it, so a client learns of a chain set after its
// watch's snapshot. It resolves only the outcomes decideOutcomes marked
// (ceiled, chained) or that carry a lease, and consecutive ones of one
// tenant and attempt target once: a batch of targets without ceilings or
// chains resolves nothing here.
func (d *Decisions) settleLeases(ctx context.Context, u Changes, items []outcomeItem) (flow []string, chains []targetFallback) {
	var p policy.Policy
	var lastTenant, lastTarget string
	resolved := false
	// The leases go back together, in one step of the store's
	// (ReleaseLeases), after the loop; of is each release's outcome.
	var rs []policy.LeaseRelease
	var of []int
	for i := range items {
		it := &items[i]
		if !it.ceiled && !it.chained && it.lease == "" {
			continue
		}
		if !resolved || it.call.tenant != lastTenant || it.target != lastTarget {
			p, _ = d.store.Resolve(it.call.tenant, it.target)
			lastTenant, lastTarget, resolved = it.call.tenant, it.target, true
		}
		if p.FlowControlled() && !slices.Contains(flow, it.target) {
			flow = append(flow, it.target)
		}
		if len(p.Fallback.Targets) > 0 && it.target == it.call.target &&
			!slices.ContainsFunc(chains, func(c targetFallback) bool { return c.target == it.target }) {
			chains = append(chains, targetFallback{it.target, p.Fallback})
		}
		if it.lease != "" {
			rs = append(rs, policy.LeaseRelease{Key: policy.KeyFor(p.Breaker, it.call.tenant, it.target), ID: it.lease,
				Limits: p.FlowLimits(), Signal: flowSignal(it.success, it.failure, policy.Hints{})})
			of = append(of, i)
		}
	}
	if len(rs) > 0 {
		held, errs := make([]bool, len(rs)), make([]error, len(rs))
		u.ReleaseLeases(rs, held, errs)
		for j, i := range of {
			d.released(ctx, items[i].call, items[i].target, held[j], errs[j])
		}
	}
	return flow, chains
}

// ReleaseLease returns a concurrency lease without an outcome. Releasing a
// lease not held is not an error: the answer says released false.
func (d *Decisions) ReleaseLease(ctx context.Context, req *pb.ReleaseLeaseRequest) (*pb.ReleaseLeaseResponse, error) {
	call, err := checkNamed("call", func(field string) (callRef, error) { return callFromPB(field, req.GetCall(), false) })
	if err != nil {
		return nil, err
	}
	if req.GetLeaseId() == "" {
		return nil, invalid("lease_id", "is required")
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
	p, _ := d.store.Resolve(call.tenant, target)
	return &pb.ReleaseLeaseResponse{Released: d.releaseLease(ctx, d.store, &p, call, target, req.GetLeaseId(), policy.SignalNone)}, nil
}

// ceilingOf returns the concurrency ceiling in force under p for a pool
// in state s (p's max_in_flight, or its adaptive ceiling's current
// Ceiling) and the adaptive ceiling's exact value (0 without one).
func ceilingOf(p *policy.Policy, s policy.PoolStatus) (int, float64) {
	lim := p.FlowLimits()
	if lim.Adaptive.Max == 0 {
		return lim.Ceiling, 0
	}
	l := fleet.AdaptiveLimit{Limit: s.Adaptive}
	return l.Ceiling(lim.Adaptive), l.Current(lim.Adaptive)
}

// withPool adds the state of the ceiling under p to a breaker's message.
func withPool(b *pb.Breaker, p *policy.Policy, s policy.PoolStatus) *pb.Breaker {
	b.LeasesInFlight, b.StrayReleases = uint32(s.InFlight), s.Stray
	c, a := ceilingOf(p, s)
	b.Ceiling, b.AdaptiveLimit = uint32(c), a
	return b
}

// flowStore is what a breaker's message needs for its ceiling: the policy
// in force under a key and its pool.
type flowStore interface {
	Resolve(tenant, target string) (policy.Policy, policy.PolicyEntry)
	Pool(key policy.BreakerKey) (policy.PoolStatus, error)
}

// breakerWithPool is breakerToPB with the state of the breaker's
// concurrency ceiling, when the policy in force under its key has one; a
// pool the store cannot read is left out (the breaker's own state is what
// was asked for).
func breakerWithPool(st flowStore, s policy.BreakerSnapshot) *pb.Breaker {
	b := breakerToPB(s)
	p, _ := st.Resolve(s.Key.Tenant, s.Key.Target)
	if p.Flow.MaxInFlight == 0 {
		return b
	}
	pool, err := st.Pool(s.Key)
	if err != nil {
		return b
	}
	return withPool(b, &p, pool)
}

// flowTargets tells a watch of tenant, on the message that completes its
// snapshot, which targets have a ceiling and which escalate (a fallback,
// with its chain): each target a stored policy names, by its effective
// policy for tenant, and every other target by the tenant's policy (the
// default policy has neither). It resolves from one listing of the stored
// policies, in the order Resolve applies (tenant and target, then target,
// then tenant), rather than a Resolve per target.
func (w *watcher) flowTargets(tenant string, msg *pb.WatchBreakersResponse) {
	entries, err := w.policies.Policies(policy.PolicyScope{}, 0)
	if err != nil {
		return // the Admit and NextDelay answers and the outcome reports tell instead
	}
	byScope := make(map[policy.PolicyScope]*policy.Policy, len(entries))
	for i := range entries {
		byScope[policy.PolicyScope{Tenant: entries[i].Tenant, Target: entries[i].Target}] = &entries[i].Policy
	}
	var tp *policy.Policy // the tenant's policy, for the targets no policy names
	if tenant != "" {
		tp = byScope[policy.PolicyScope{Tenant: tenant}]
	}
	other := tp != nil && tp.FlowControlled()
	for _, e := range entries {
		if e.Target == "" || (e.Tenant != "" && e.Tenant != tenant) ||
			slices.Contains(msg.FlowControlledTargets, e.Target) || slices.Contains(msg.UncontrolledTargets, e.Target) {
			continue
		}
		p := byScope[policy.PolicyScope{Tenant: tenant, Target: e.Target}]
		if p == nil || tenant == "" {
			p = byScope[policy.PolicyScope{Target: e.Target}]
		}
		if p != nil && p.FlowControlled() || p == nil && other {
			msg.FlowControlledTargets = append(msg.FlowControlledTargets, e.Target)
		} else {
			msg.UncontrolledTargets = append(msg.UncontrolledTargets, e.Target)
		}
		if p == nil {
			p = tp
		}
		if p != nil && len(p.Fallback.Targets) > 0 {
			msg.FallbackChains = append(msg.FallbackChains, &pb.FallbackChain{Target: e.Target, Fallback: fallbackToPB(p.Fallback)})
		}
	}
	msg.OtherTargetsFlowControlled = other
	if tp != nil && len(tp.Fallback.Targets) > 0 {
		msg.OtherTargetsFallback = fallbackToPB(tp.Fallback)
	}
}
