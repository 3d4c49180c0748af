package policyclient

import (
	"strings"
	"testing"
	"time"
)

// TestChainCacheFollowsTheSeenRule: once policyd moved a call off its
// primary after K attempts by the chain rule, local decisions send attempt
// n to entry min((n-1)/K, last) of the chain seen; a move past an open
// circuit teaches no K but makes an open primary worth an Admit, until an
// Admit is refused on it; with nothing seen the call stays where it is.
func TestChainCacheFollowsTheSeenRule(t *testing.T) {
	var c chainCache
	now := time.Now()
	if got := c.next("a", 2); got != "" || c.escalatesOnOpen("a", now) {
		t.Fatalf("nothing seen: next %q, escalates on open %v; want \"\" and false", got, c.escalatesOnOpen("a", now))
	}
	c.learn("a", "a", "b", 2, moveByCircuit, now)
	if got := c.next("a", 3); got != "" || !c.escalatesOnOpen("a", now) {
		t.Fatalf("a circuit move seen: next %q, escalates on open %v; want \"\" and true", got, c.escalatesOnOpen("a", now))
	}
	if c.escalatesOnOpen("a", now.Add(escalationMemory+time.Second)) {
		t.Fatal("escalates on open after escalationMemory: true, want false")
	}
	c.refusedOpen("a")
	if c.escalatesOnOpen("a", now) {
		t.Fatal("escalates on open after a refusal: true, want false")
	}
	c.learn("a", "a", "b", 3, moveByChain, now) // attempts 1-2 on a, then b
	c.learn("a", "b", "c", 5, moveByChain, now)
	var got []string
	for n := 1; n <= 7; n++ {
		got = append(got, c.next("a", n))
	}
	if s := strings.Join(got, " "); s != "a a b b c c c" {
		t.Fatalf("attempts 1-7: %s, want a a b b c c c", s)
	}
}
