package policyclient

import (
	"slices"
	"sync"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// chainCache is what the client knows of each primary target's escalation
// chain (its effective policy's fallback). It is told the chains by the
// WatchBreakers snapshot (fallback_chains, other_targets_fallback) and by
// every ReportOutcome answer (fallback_chains of the batch's primaries),
// and learns from policyd's other answers too: the fallback targets it sent calls
// to, in order; after how many attempts it first sent one off the primary
// by the after_attempts rule; and that it sent a call on from an open
// circuit (on_circuit_open).
//
// A call to a primary whose breaker is known OPEN asks Admit (one RPC,
// which names the fallback) when its told chain escalates on an open
// circuit to a target not known OPEN, or when policyd was seen escalating
// it on an open circuit in the last escalationMemory; otherwise it fails
// fast locally, without an RPC. While policyd is away the local policy
// routes each attempt by the told chain (chain.route, the rules of
// policy.Fallback on the client's last view of the breakers), or, with
// none told, by what was seen: attempt n goes to entry min((n-1)/K, last)
// of [primary, seen targets...], and with nothing seen the call stays
// where it is. The client's CLOSED path never reads it. It is safe for
// concurrent use.
type chainCache struct {
	mu sync.Mutex
	m  map[string]*chainSeen
	// told: a snapshot has arrived; chains holds the chain of each target
	// a policy names (the zero chain for none), other the chain of the
	// rest.
	told   bool
	chains map[string]chain
	other  chain
}

type chainSeen struct {
	targets []string // fallbacks, in the order calls were sent to them
	after   int      // attempts on each target before the next; 0 unknown
	// onOpenUntil: policyd sent a call on from an open circuit; until
	// then an attempt to the open primary asks Admit.
	onOpenUntil time.Time
}

// move says what sent a call to another target of its chain.
type move int

const (
	moveByChain   move = iota // a NextDelay answer, by after_attempts
	moveByCircuit             // an Admit or NextDelay answer, past an open breaker
	moveLocal                 // the local policy, by the chain known
)

// maxChainTargets bounds what is kept per primary (policyd allows 4).
const maxChainTargets = 4

// escalationMemory is how long a call sent on from an open circuit makes
// the client ask Admit for an attempt to that open primary.
const escalationMemory = 10 * time.Minute

func (c *chainCache) get(primary string) *chainSeen {
	if c.m == nil {
		c.m = map[string]*chainSeen{}
	}
	s := c.m[primary]
	if s == nil {
		s = &chainSeen{}
		c.m[primary] = s
	}
	return s
}

// snapshot replaces the chains told with a watch snapshot's: every
// target of its flow lists is named by a policy, and has the chain
// fallback_chains gives it or none.
func (c *chainCache) snapshot(msg *pb.WatchBreakersResponse) {
	m := make(map[string]chain, len(msg.GetFlowControlledTargets())+len(msg.GetUncontrolledTargets()))
	for _, t := range msg.GetFlowControlledTargets() {
		m[t] = chain{}
	}
	for _, t := range msg.GetUncontrolledTargets() {
		m[t] = chain{}
	}
	for _, fc := range msg.GetFallbackChains() {
		m[fc.GetTarget()] = chainFromPB(fc.GetFallback())
	}
	other := chainFromPB(msg.GetOtherTargetsFallback())
	c.mu.Lock()
	c.told, c.chains, c.other = true, m, other
	c.mu.Unlock()
}

// reported learns from a ReportOutcome answer: each primary of the
// batch's outcomes of attempts on the call's own target has the chain the
// answer lists for it, or none, so a chain set after the snapshot is
// learnt within one report. Before a snapshot told the chains it changes
// nothing (the chains seen are followed then).
func (c *chainCache) reported(batch []*pb.Outcome, resp *pb.ReportOutcomeResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.told {
		return
	}
	listed := resp.GetFallbackChains()
	last := ""
	for _, o := range batch {
		t := o.GetCall().GetTarget()
		if o.GetAttemptTarget() != "" || t == last {
			continue
		}
		last = t
		var ch chain
		for _, l := range listed {
			if l.GetTarget() == t {
				ch = chainFromPB(l.GetFallback())
				break
			}
		}
		c.chains[t] = ch
	}
}

// toldChain returns the chain told for primary; the caller holds mu.
func (c *chainCache) toldChain(primary string) (chain, bool) {
	if !c.told {
		return chain{}, false
	}
	if ch, ok := c.chains[primary]; ok {
		return ch, true
	}
	return c.other, true
}

// learn records that the call to primary went from target from to target
// to from attempt on, for the reason why, at now.
func (c *chainCache) learn(primary, from, to string, attempt int, why move, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.get(primary)
	if to != primary && !slices.Contains(s.targets, to) && len(s.targets) < maxChainTargets {
		s.targets = append(s.targets, to)
	}
	switch {
	case why == moveByCircuit:
		s.onOpenUntil = now.Add(escalationMemory)
	case why == moveByChain && from == primary && s.after == 0 && attempt > 1:
		s.after = attempt - 1
	}
}

// local is the target of attempt of a call to primary when policyd cannot
// be asked, open telling which breakers the client last saw open: by the
// chain told (chain.route; ok false when the target is open and no
// fallback takes the call, which then stops CIRCUIT_OPEN), or by the
// chain seen ("" for the current target when no after_attempts rule was
// seen).
func (c *chainCache) local(primary string, attempt int, open func(string) bool) (target string, ok bool) {
	c.mu.Lock()
	ch, told := c.toldChain(primary)
	if told {
		c.mu.Unlock()
		if len(ch.targets) == 0 {
			return "", true
		}
		return ch.route(primary, attempt, open)
	}
	defer c.mu.Unlock()
	s := c.m[primary]
	if s == nil || s.after == 0 || len(s.targets) == 0 {
		return "", true
	}
	if i := min((attempt-1)/s.after, len(s.targets)); i > 0 {
		return s.targets[i-1], true
	}
	return primary, true
}

// escalatesOnOpen reports whether attempt to primary, whose breaker is
// known open, should ask Admit, which may send it to a fallback: its told
// chain escalates on an open circuit to a target open does not say is
// open, or policyd was seen escalating it within escalationMemory.
func (c *chainCache) escalatesOnOpen(primary string, attempt int, now time.Time, open func(string) bool) bool {
	c.mu.Lock()
	ch, told := c.toldChain(primary)
	s := c.m[primary]
	seen := s != nil && s.onOpenUntil.After(now)
	c.mu.Unlock()
	if told && ch.onOpen {
		if _, ok := ch.route(primary, attempt, open); ok {
			return true
		}
	}
	return seen
}

// refusedOpen records that an Admit of a call to primary was refused on
// an open breaker, no fallback taking it: fail fast locally again, unless
// the told chain says otherwise.
func (c *chainCache) refusedOpen(primary string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.m[primary]; s != nil {
		s.onOpenUntil = time.Time{}
	}
}

// chain is a primary's escalation chain as a policy's fallback sets it
// (FallbackSettings): the fallback targets in order, the attempts each
// target gets (0: only an open circuit moves a call), and whether an open
// circuit moves it.
type chain struct {
	targets []string
	after   int
	onOpen  bool
}

func chainFromPB(f *pb.FallbackSettings) chain {
	return chain{targets: f.GetTargets(), after: int(f.GetAfterAttempts()), onOpen: f.GetOnCircuitOpen()}
}

// The functions below are policy.Fallback's (policy/fallback.go), which
// this module cannot import, line for line: the chain is the primary, then
// the targets in order, a target equal to the primary skipped. The shared
// vectors (testdata/vectors.json, fallback_chains) hold both to one rule.

// chainLen returns the length of the chain of a call to primary, the
// primary included.
func (ch *chain) chainLen(primary string) int {
	n := 1
	for _, t := range ch.targets {
		if t != primary {
			n++
		}
	}
	return n
}

// chainAt returns entry i of the chain of a call to primary (0 is the
// primary), or "" when i is past its end.
func (ch *chain) chainAt(primary string, i int) string {
	if i == 0 {
		return primary
	}
	for _, t := range ch.targets {
		if t == primary {
			continue
		}
		if i--; i == 0 {
			return t
		}
	}
	return ""
}

// chainIndex returns the position of target in the chain of a call to
// primary, or -1 when it is not in it.
func (ch *chain) chainIndex(primary, target string) int {
	if target == primary {
		return 0
	}
	i := 0
	for _, t := range ch.targets {
		if t == primary {
			continue
		}
		i++
		if t == target {
			return i
		}
	}
	return -1
}

// targetFor returns the target of attempt (from 1) of a call to primary
// by the after_attempts rule: entry min((attempt-1)/after, last) of the
// chain; the primary for every attempt when after is 0.
func (ch *chain) targetFor(primary string, attempt int) string {
	if ch.after <= 0 || len(ch.targets) == 0 || attempt <= 1 {
		return primary
	}
	i := min((attempt-1)/ch.after, ch.chainLen(primary)-1)
	return ch.chainAt(primary, i)
}

// route is where policyd sends attempt of a call to primary (server
// routeRetry and admitChain): targetFor's target; when its breaker is
// open (open says) and the chain escalates on an open circuit, the first
// later target of the chain whose breaker is not. ok is false when the
// target chosen is open: the call stops CIRCUIT_OPEN.
func (ch *chain) route(primary string, attempt int, open func(string) bool) (string, bool) {
	t := ch.targetFor(primary, attempt)
	if !open(t) {
		return t, true
	}
	if !ch.onOpen {
		return t, false
	}
	for i := ch.chainIndex(primary, t) + 1; ; i++ {
		c := ch.chainAt(primary, i)
		if c == "" {
			return t, false
		}
		if !open(c) {
			return c, true
		}
	}
}
