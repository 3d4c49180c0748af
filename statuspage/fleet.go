package statuspage

import (
	"errors"
	"math"
	"slices"
	"time"

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
		if pool.Adaptive > 0 {
			c.AdaptiveLimit = pool.Adaptive
			c.Limit = min(max(int(math.Floor(pool.Adaptive)), a.Min), a.Max)
		}
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
// MaxEscalations, with the state of each target's breaker; listed are the
// breakers already on the page, looked up by target when the policy is
// every tenant's.
func (p *Page) escalations(listed []policy.BreakerSnapshot) ([]Escalation, error) {
	entries, err := p.cfg.Source.Policies(policy.PolicyScope{}, 0)
	out := []Escalation{}
	for _, e := range entries {
		fb := e.Policy.Fallback
		if len(fb.Targets) == 0 {
			continue
		}
		if len(out) == MaxEscalations {
			break
		}
		esc := Escalation{Tenant: e.Tenant, Target: e.Target, AfterAttempts: fb.AfterAttempts, OnCircuitOpen: fb.OnCircuitOpen}
		esc.Chain = append(esc.Chain, p.link(e.Tenant, e.Target, listed))
		for _, t := range fb.Targets {
			esc.Chain = append(esc.Chain, p.link(e.Tenant, t, listed))
		}
		out = append(out, esc)
	}
	return out, err
}

// link is target's place in a chain of tenant's policy.
func (p *Page) link(tenant, target string, listed []policy.BreakerSnapshot) ChainLink {
	l := ChainLink{Target: target}
	if target == "" {
		return l
	}
	pol, _ := p.cfg.Source.Resolve(tenant, target)
	if tenant != "" || pol.Breaker.Scope == policy.ScopeTarget {
		if s, err := p.cfg.Source.Breaker(policy.KeyFor(pol.Breaker, tenant, target)); err == nil {
			l.State, l.Breakers = s.State.String(), 1
		}
		return l
	}
	worst := len(severity)
	for _, s := range listed {
		if s.Key.Target != target || s.Key.Tenant == "" {
			continue
		}
		l.Breakers++
		worst = min(worst, slices.Index(severity, s.State))
	}
	if l.Breakers > 0 && worst >= 0 && worst < len(severity) {
		l.State = severity[worst].String()
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
