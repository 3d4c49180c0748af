package policyclient

import (
	"slices"
	"strings"
	"testing"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

func openOf(targets ...string) func(string) bool {
	return func(t string) bool { return slices.Contains(targets, t) }
}

// TestChainCacheFollowsTheSeenRule: with no chain told, once policyd moved
// a call off its primary after K attempts by the chain rule, local
// decisions send attempt n to entry min((n-1)/K, last) of the chain seen;
// a move past an open circuit teaches no K but makes an open primary worth
// an Admit, until an Admit is refused on it; with nothing seen the call
// stays where it is.
func TestChainCacheFollowsTheSeenRule(t *testing.T) {
	var c chainCache
	now := time.Now()
	none := openOf()
	if got, ok := c.local("a", 2, none); got != "" || !ok || c.escalatesOnOpen("a", 1, now, none) {
		t.Fatalf("nothing seen: local %q %v, escalates on open %v; want \"\" true and false", got, ok, c.escalatesOnOpen("a", 1, now, none))
	}
	c.learn("a", "a", "b", 2, moveByCircuit, now)
	if got, _ := c.local("a", 3, none); got != "" || !c.escalatesOnOpen("a", 1, now, none) {
		t.Fatalf("a circuit move seen: local %q, escalates on open %v; want \"\" and true", got, c.escalatesOnOpen("a", 1, now, none))
	}
	if c.escalatesOnOpen("a", 1, now.Add(escalationMemory+time.Second), none) {
		t.Fatal("escalates on open after escalationMemory: true, want false")
	}
	c.refusedOpen("a")
	if c.escalatesOnOpen("a", 1, now, none) {
		t.Fatal("escalates on open after a refusal: true, want false")
	}
	c.learn("a", "a", "b", 3, moveByChain, now) // attempts 1-2 on a, then b
	c.learn("a", "b", "c", 5, moveByChain, now)
	var got []string
	for n := 1; n <= 7; n++ {
		tg, _ := c.local("a", n, none)
		got = append(got, tg)
	}
	if s := strings.Join(got, " "); s != "a a b b c c c" {
		t.Fatalf("attempts 1-7: %s, want a a b b c c c", s)
	}
}

// TestChainCacheFollowsTheToldChain: once a snapshot told the chains, an
// open primary is worth an Admit exactly when its chain escalates on an
// open circuit to a target not known open, with or without a move seen; a
// target named by a policy without a fallback has none even when the
// tenant's policy has one; local routing follows the told chain, not what
// was seen.
func TestChainCacheFollowsTheToldChain(t *testing.T) {
	var c chainCache
	now := time.Now()
	c.snapshot(&pb.WatchBreakersResponse{SnapshotComplete: true, UncontrolledTargets: []string{"a", "plain"},
		FallbackChains:       []*pb.FallbackChain{{Target: "a", Fallback: &pb.FallbackSettings{Targets: []string{"b", "c"}, OnCircuitOpen: true}}},
		OtherTargetsFallback: &pb.FallbackSettings{Targets: []string{"z"}, AfterAttempts: 1}})
	tests := []struct {
		name      string
		primary   string
		open      []string
		escalates bool
	}{
		{"on-open chain, fallbacks closed", "a", []string{"a"}, true},
		{"on-open chain, first fallback open", "a", []string{"a", "b"}, true},
		{"on-open chain, every target open", "a", []string{"a", "b", "c"}, false},
		{"named without a fallback", "plain", []string{"plain"}, false},
		{"the tenant's chain, not on open", "other", []string{"other"}, false},
	}
	for _, tt := range tests {
		if got := c.escalatesOnOpen(tt.primary, 1, now, openOf(tt.open...)); got != tt.escalates {
			t.Errorf("%s: escalates on open %v, want %v", tt.name, got, tt.escalates)
		}
	}
	c.learn("a", "a", "x", 2, moveByChain, now) // seen, but the told chain rules
	if got, ok := c.local("a", 2, openOf("a", "b")); got != "c" || !ok {
		t.Errorf("local route of a's attempt 2 past open a and b: %q %v, want c true", got, ok)
	}
	if got, ok := c.local("other", 2, openOf()); got != "z" || !ok {
		t.Errorf("local route of other's attempt 2: %q %v, want z (the tenant's chain) true", got, ok)
	}
	if got, ok := c.local("plain", 2, openOf("plain")); got != "" || !ok {
		t.Errorf("local route of plain: %q %v, want \"\" true (no chain: the call stays)", got, ok)
	}
}

// TestChainCacheLearnsFromReports: a report's answer sets the chain of each
// primary of the batch (attempts on a fallback target say nothing of
// theirs): listed, the chain it gives; not listed, none.
func TestChainCacheLearnsFromReports(t *testing.T) {
	var c chainCache
	now := time.Now()
	c.snapshot(&pb.WatchBreakersResponse{SnapshotComplete: true, UncontrolledTargets: []string{"b"},
		FallbackChains: []*pb.FallbackChain{{Target: "b", Fallback: &pb.FallbackSettings{Targets: []string{"c"}, OnCircuitOpen: true}}}})
	out := func(target, attemptTarget string) *pb.Outcome {
		return &pb.Outcome{Call: &pb.CallRef{Target: target}, AttemptTarget: attemptTarget}
	}
	c.reported([]*pb.Outcome{out("a", ""), out("a", ""), out("b", ""), out("x", "b")}, &pb.ReportOutcomeResponse{
		FallbackChains: []*pb.FallbackChain{{Target: "a", Fallback: &pb.FallbackSettings{Targets: []string{"a2"}, OnCircuitOpen: true}}}})
	if !c.escalatesOnOpen("a", 1, now, openOf("a")) {
		t.Error("a, listed with an on-open chain: escalates on open false, want true")
	}
	if c.escalatesOnOpen("b", 1, now, openOf("b")) {
		t.Error("b, a primary of the batch not listed: escalates on open true, want false (its chain is gone)")
	}
}
