package policyclient

import (
	"slices"
	"sync"
	"time"
)

// chainCache is what the client has seen of each primary target's
// escalation chain (its policy's fallback), from policyd's answers: the
// fallback targets it sent calls to, in order; after how many attempts it
// first sent one off the primary by the after_attempts rule; and whether
// it sends calls on to a fallback when the primary's circuit is open
// (on_circuit_open). While policyd is away the local policy follows the
// same rule with what was seen: attempt n goes to entry min((n-1)/K, last)
// of [primary, seen targets...]; with nothing seen the call stays where it
// is. A call to a primary whose breaker is known OPEN fails fast locally,
// without an RPC, unless policyd was seen escalating it on an open circuit
// in the last escalationMemory: then Admit is asked, and names the
// fallback. The client's CLOSED path never reads it. It is safe for
// concurrent use.
type chainCache struct {
	mu sync.Mutex
	m  map[string]*chainSeen
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
	moveLocal                 // the local policy, by the chain seen
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

// next is the target of attempt under the chain seen for primary, or ""
// (stay on the current target) when no after_attempts rule was seen.
func (c *chainCache) next(primary string, attempt int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.m[primary]
	if s == nil || s.after == 0 || len(s.targets) == 0 {
		return ""
	}
	if i := min((attempt-1)/s.after, len(s.targets)); i > 0 {
		return s.targets[i-1]
	}
	return primary
}

// escalatesOnOpen reports whether an attempt to primary, whose breaker is
// known open, should ask Admit, which may send it to a fallback.
func (c *chainCache) escalatesOnOpen(primary string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.m[primary]
	return s != nil && s.onOpenUntil.After(now)
}

// refusedOpen records that an Admit of a call to primary was refused on
// an open breaker, no fallback taking it: fail fast locally again.
func (c *chainCache) refusedOpen(primary string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.m[primary]; s != nil {
		s.onOpenUntil = time.Time{}
	}
}
