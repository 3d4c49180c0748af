package statuspage

import (
	"errors"
	"slices"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// Ceiling is a breaker key's fleet-wide ceilings (the effective policy's
// policy.FlowConfig) and their state (policy.PoolStatus), as the proto's
// Breaker.ceiling and Breaker.adaptive_limit have them.
type Ceiling struct {
	// InFlight counts the concurrency leases live; Limit is the
	// concurrency ceiling in force: MaxInFlight, or the adaptive
	// ceiling's current value rounded down; 0 without a concurrency
	// ceiling.
	InFlight    int `json:"leases_in_flight"`
	Limit       int `json:"ceiling"`
	MaxInFlight int `json:"max_in_flight"`
	// Stray counts releases of leases not held (expired, returned twice).
	Stray uint64 `json:"stray_releases"`
	// Adaptive is true when the concurrency ceiling adapts (AIMD) between
	// AdaptiveMin and MaxInFlight; AdaptiveLimit is its exact current
	// value, 0 while it has not started (it then stands at MaxInFlight).
	Adaptive      bool    `json:"adaptive"`
	AdaptiveMin   int     `json:"adaptive_min,omitempty"`
	AdaptiveLimit float64 `json:"adaptive_limit,omitempty"`
	// MaxRate is the rate ceiling in attempts per second (0: none), Burst
	// how many it admits at once.
	MaxRate float64 `json:"max_rate,omitempty"`
	Burst   int     `json:"burst,omitempty"`
}

// ceilingOf is the ceiling of a key under p with pool's state; nil when p
// sets none.
func ceilingOf(p *policy.Policy, pool policy.PoolStatus) *Ceiling {
	if !p.FlowControlled() {
		return nil
	}
	lim := p.FlowLimits()
	c := &Ceiling{InFlight: pool.InFlight, Limit: lim.Ceiling, MaxInFlight: p.Flow.MaxInFlight, Stray: pool.Stray}
	if p.Flow.MaxRate > 0 {
		c.MaxRate, c.Burst = p.Flow.MaxRate, lim.Burst
	}
	if a := lim.Adaptive; a.Max > 0 {
		c.Adaptive, c.AdaptiveMin = true, a.Min
		l := fleet.AdaptiveLimit{Limit: pool.Adaptive} // 0: not started, at its maximum
		c.Limit = l.Ceiling(a)
		c.AdaptiveLimit = pool.Adaptive // the stored value as it is, 0 before it started
	}
	return c
}

// Escalation is a stored policy's fallback chain (policy.Fallback): the
// primary, then the fallback targets in order, each with its breaker's
// state.
type Escalation struct {
	Tenant string `json:"tenant"` // the policy's scope; "" for every tenant
	Target string `json:"target"` // "" for every target of the tenant
	// AfterAttempts is how many attempts each target gets before the next
	// takes over (0: only an open circuit escalates, with OnCircuitOpen).
	AfterAttempts int  `json:"after_attempts"`
	OnCircuitOpen bool `json:"on_circuit_open"`
	// Chain is the primary first, then the fallback targets.
	Chain []ChainLink `json:"chain"`
}

// ChainLink is one target of a fallback chain and its breaker.
type ChainLink struct {
	// Target is "" for the primary of a policy of every target.
	Target string `json:"target"`
	// State is the target's breaker state: the breaker's under the
	// policy's tenant, or, for a policy of every tenant whose breakers are
	// per tenant, the most severe of the listed breakers of the target
	// (Breakers says how many). "" when there is no breaker yet: no
	// failure was recorded, so it is CLOSED.
	State    string `json:"state"`
	Breakers int    `json:"breakers"`
}

// MaxEscalations caps the fallback chains the page lists.
const MaxEscalations = 200

// escalations lists the stored policies' fallback chains, up to
// MaxEscalations, with the state of each target's breaker. listed are the
// breakers on the page: a chain's breaker is read from them, and from the
// store only when the list was cut at Config.MaxBreakers, so a rendering
// costs no call per link.
func (p *Page) escalations(listed []policy.BreakerSnapshot) ([]Escalation, error) {
	entries, err := p.cfg.Source.Policies(policy.PolicyScope{}, 0)
	out := []Escalation{}
	var known breakerIndex
	for _, e := range entries {
		fb := e.Policy.Fallback
		if len(fb.Targets) == 0 {
			continue
		}
		if len(out) == MaxEscalations {
			break
		}
		if known.byKey == nil {
			known = indexBreakers(listed, len(listed) < p.cfg.MaxBreakers)
		}
		esc := Escalation{Tenant: e.Tenant, Target: e.Target, AfterAttempts: fb.AfterAttempts, OnCircuitOpen: fb.OnCircuitOpen}
		esc.Chain = append(esc.Chain, p.link(e.Tenant, e.Target, &known))
		for _, t := range fb.Targets {
			esc.Chain = append(esc.Chain, p.link(e.Tenant, t, &known))
		}
		out = append(out, esc)
	}
	return out, err
}

// breakerIndex is the page's listed breakers by key and by target (those
// of a tenant); complete is true when they are all the store has.
type breakerIndex struct {
	byKey    map[policy.BreakerKey]policy.BreakerState
	byTarget map[string][]policy.BreakerState
	complete bool
}

func indexBreakers(listed []policy.BreakerSnapshot, complete bool) breakerIndex {
	ix := breakerIndex{byKey: make(map[policy.BreakerKey]policy.BreakerState, len(listed)),
		byTarget: map[string][]policy.BreakerState{}, complete: complete}
	for _, s := range listed {
		ix.byKey[s.Key] = s.State
		if s.Key.Tenant != "" {
			ix.byTarget[s.Key.Target] = append(ix.byTarget[s.Key.Target], s.State)
		}
	}
	return ix
}

// link is target's place in a chain of tenant's policy.
func (p *Page) link(tenant, target string, known *breakerIndex) ChainLink {
	l := ChainLink{Target: target}
	if target == "" {
		return l
	}
	pol, _ := p.cfg.Source.Resolve(tenant, target)
	if tenant != "" || pol.Breaker.Scope == policy.ScopeTarget {
		key := policy.KeyFor(pol.Breaker, tenant, target)
		if st, ok := known.byKey[key]; ok {
			l.State, l.Breakers = st.String(), 1
		} else if !known.complete {
			if s, err := p.cfg.Source.Breaker(key); err == nil {
				l.State, l.Breakers = s.State.String(), 1
			}
		}
		return l
	}
	states := known.byTarget[target]
	for _, st := range severity {
		if slices.Contains(states, st) {
			l.State, l.Breakers = st.String(), len(states)
			break
		}
	}
	return l
}

// Replicas tells the page which daemons serve the fleet state. It is
// declared here, where it is consumed; policyd serve adapts the Redis
// engine's replica set to it, and Sole stands for a daemon alone on its
// bbolt file. Implementations must be safe for concurrent use.
type Replicas interface {
	// Replicas lists the live replicas, most recently seen first.
	Replicas() ([]Replica, error)
}

// Replica is one daemon serving the fleet state.
type Replica struct {
	ID string `json:"id"`
	// LastSeen is its last heartbeat; zero for a sole daemon, which has
	// none.
	LastSeen time.Time `json:"last_seen,omitzero"`
	Self     bool      `json:"self"` // the daemon serving this page
}

// Sole returns the Replicas of a daemon alone on its store, named id (the
// bbolt file's base name): one replica, this one.
func Sole(id string) Replicas { return sole(id) }

type sole string

func (s sole) Replicas() ([]Replica, error) { return []Replica{{ID: string(s), Self: true}}, nil }

// notFound reports whether err is of the not-found class (a NotFound
// method returning true, as server/errors.go tells the classes apart).
func notFound(err error) bool {
	var nf interface{ NotFound() bool }
	return errors.As(err, &nf) && nf.NotFound()
}
