package server

import (
	"strconv"
	"strings"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// Escalation in domain types: a call's chain is its primary target, then
// the fallback targets of the primary's policy (policy.Fallback). Each
// target of the chain keeps its own breaker and ceilings under its own
// effective policy; the call keeps the primary's rules (attempts, backoff,
// deadline, budgets, idempotency). A call whose primary's policy has no
// fallback never reaches these functions beyond a length check, and
// resolves no other policy.

// hop is one target of a call's chain as a decision sees it: its name and
// its breaker (the config of its effective policy, and the key). It holds
// no pointer, so a hop passed to the store does not move the policy it
// was read from to the heap.
type hop struct {
	target  string
	key     policy.BreakerKey
	breaker policy.BreakerConfig
}

// hopOf returns the hop of target for call, whose primary's policy is p:
// p's breaker for the primary, else that of target's own effective
// policy.
func (d *Decisions) hopOf(call *callRef, p *policy.Policy, target string) hop {
	if target == call.target {
		return hop{target: target, key: policy.KeyFor(p.Breaker, call.tenant, target), breaker: p.Breaker}
	}
	tp, _ := d.store.Resolve(call.tenant, target)
	return hop{target: target, key: policy.KeyFor(tp.Breaker, call.tenant, target), breaker: tp.Breaker}
}

// targetPolicy returns the effective policy of target for call: p, the
// primary's, when target is the primary.
func (d *Decisions) targetPolicy(call *callRef, p *policy.Policy, target string) policy.Policy {
	if target == call.target {
		return *p
	}
	tp, _ := d.store.Resolve(call.tenant, target)
	return tp
}

// breakerSnapshot returns the breaker under key as breakers have it; a
// breaker the store does not know (or cannot read) is CLOSED as far as
// routing goes: Admit has the last word.
func breakerSnapshot(breakers breakerReader, key policy.BreakerKey) policy.BreakerSnapshot {
	snap, err := breakers.Breaker(key)
	if err != nil {
		return policy.BreakerSnapshot{Key: key, State: policy.BreakerClosed}
	}
	return snap
}

// routeRetry picks the target of attempt next, after a failed one, on a
// RETRY: the chain's target for it (Fallback.TargetFor); when that one's
// breaker is open and the primary's policy p has on_circuit_open, the
// first target of the chain after it whose breaker is not. failed is the
// hop of the failed attempt, whose breaker snapshot (just recorded) is
// snap. It returns the hop and its breaker's snapshot, which is OPEN when
// no target would do (the call then stops CIRCUIT_OPEN). The breakers
// are read through the request's u.
func (d *Decisions) routeRetry(u Changes, call *callRef, p *policy.Policy, failed hop, snap policy.BreakerSnapshot, next uint32) (hop, policy.BreakerSnapshot) {
	f := &p.Fallback
	look := func(t string) (hop, policy.BreakerSnapshot) {
		if t == failed.target {
			return failed, snap
		}
		h := d.hopOf(call, p, t)
		return h, breakerSnapshot(u, h.key)
	}
	t := f.TargetFor(call.target, int(next))
	h, s := look(t)
	if s.State != policy.BreakerOpen || !f.OnCircuitOpen {
		return h, s
	}
	for i := f.ChainIndex(call.target, t) + 1; ; i++ {
		c := f.ChainAt(call.target, i)
		if c == "" {
			return h, s
		}
		if ch, cs := look(c); cs.State != policy.BreakerOpen {
			return ch, cs
		}
	}
}

// movable reports whether a refused admission is one a fallback takes
// over with on_circuit_open: an open breaker or a ceiling's refusal.
func movable(a *policy.Admission) bool {
	return a.State == policy.BreakerOpen || a.Reason == fleet.ReasonFull || a.Reason == fleet.ReasonRate
}

// admitChain admits an attempt of call to target under the chain of p,
// the primary's policy: target's own admission (its breaker and ceilings,
// under its effective policy), then, when that refuses as movable says and
// p's fallback has on_circuit_open, each later target of the chain in
// order until one admits. The answer is the admitting target's (Target
// set), or target's refusal when none admits. Every admission is asked
// of u, the request's.
func (d *Decisions) admitChain(u Changes, p *policy.Policy, call *callRef, target string) (policy.Admission, error) {
	tp := d.targetPolicy(call, p, target)
	a, err := d.admit(u, &tp, call, target)
	if err != nil || a.Admitted || !p.Fallback.OnCircuitOpen || !movable(&a) {
		a.Target = target
		return a, err
	}
	f := &p.Fallback
	for i := f.ChainIndex(call.target, target) + 1; ; i++ {
		c := f.ChainAt(call.target, i)
		if c == "" {
			return a, nil
		}
		if c == target {
			continue
		}
		cp := d.targetPolicy(call, p, c)
		b, err := d.admit(u, &cp, call, c)
		if err != nil {
			return policy.Admission{}, err
		}
		if b.Admitted {
			b.Target = c
			d.cfg.Metrics.fallback(target, c)
			return b, nil
		}
	}
}

// primaryOf is the primary target an audit record or a call note names
// beside target: the call's own when target is a fallback, "" otherwise.
func primaryOf(call *callRef, target string) string {
	if target == call.target {
		return ""
	}
	return call.target
}

// checkFallbacks checks the fallback of p, about to be stored for tenant
// and target, against its scope and the stored policies: a target-scoped
// policy may not name its own target, and no chain through the effective
// policies of the targets it names (for tenant), followed transitively,
// may lead back to target. The field named is policy.fallback.targets[i].
func checkFallbacks(store Policies, tenant, target string, p *policy.Policy) error {
	if err := checkOwnTarget("policy", target, p); err != nil {
		return err
	}
	if target == "" {
		return nil
	}
	for i, t := range p.Fallback.Targets {
		field := "policy.fallback.targets[" + strconv.Itoa(i) + "]"
		if path := cycleThrough(store, tenant, target, t); path != nil {
			return invalid(field, "forms a cycle through the stored policies: "+strings.Join(path, " -> "))
		}
	}
	return nil
}

// checkOwnTarget checks that p, the policy field names for target (""
// for every target), names no fallback equal to target.
func checkOwnTarget(field, target string, p *policy.Policy) error {
	if target == "" {
		return nil
	}
	for i, t := range p.Fallback.Targets {
		if t == target {
			return invalid(field+".fallback.targets["+strconv.Itoa(i)+"]", "must not be the policy's own target "+strconv.Quote(target))
		}
	}
	return nil
}

// cycleThrough returns the path from target through from to target again
// that the stored policies' fallbacks (the effective policy of each target
// for tenant) make, or nil when there is none.
func cycleThrough(store Policies, tenant, target, from string) []string {
	seen := map[string]bool{target: true}
	var walk func(path []string) []string
	walk = func(path []string) []string {
		at := path[len(path)-1]
		if seen[at] {
			return nil
		}
		seen[at] = true
		p, _ := store.Resolve(tenant, at)
		for _, next := range p.Fallback.Targets {
			if next == target {
				return append(path, next)
			}
			if found := walk(append(path[:len(path):len(path)], next)); found != nil {
				return found
			}
		}
		return nil
	}
	return walk([]string{target, from})
}
