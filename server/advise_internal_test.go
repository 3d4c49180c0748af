package server

import (
	"slices"
	"testing"

	"github.com/policyd/policyd/policy"
)

// counts builds AttemptCounts from the counts of attempts 1, 2, ...
func counts(n ...uint64) policy.AttemptCounts {
	var c policy.AttemptCounts
	copy(c[:], n)
	return c
}

// TestAdvise is the advice rule's table: evidence, the attempts beyond k
// against the 1% rule, fallback or max_attempts, and the summary.
func TestAdvise(t *testing.T) {
	def := policy.Default() // max_attempts 3
	withFallback := def
	withFallback.Fallback = policy.Fallback{Targets: []string{"geocoder-b"}}
	escalatesAfter1 := withFallback
	escalatesAfter1.Fallback.AfterAttempts = 1
	five := def
	five.MaxAttempts = 5
	tests := []struct {
		name           string
		p              policy.Policy
		succ, fail     policy.AttemptCounts
		summary        string
		recommendation string
		changes        []string
		proposed       func(p *policy.Policy) // the change, applied to a copy of p; nil: no proposal
		fallbackOf     []string
	}{
		{
			name: "not enough calls", p: def,
			succ: counts(30, 1), fail: counts(0, 0, 2),
			summary:        "97% of successes on attempt 1; attempts 2-3 recovered 33% of failures",
			recommendation: "not enough calls: 33 in the window, 50 needed",
		},
		{
			name: "retries earn nothing: max_attempts 1", p: def,
			// 1000 calls, 40 fail attempt 1, none of them recovered.
			succ: counts(960), fail: counts(0, 0, 40),
			summary:        "100% of successes on attempt 1; attempts 2-3 recovered 0% of failures",
			recommendation: "max_attempts 1: attempts 2-3 recovered 0% of the calls that reached them",
			changes:        []string{"max_attempts: 3 -> 1"},
			proposed:       func(p *policy.Policy) { p.MaxAttempts = 1 },
		},
		{
			name: "the issue's example with a fallback: escalate after 1 attempt", p: withFallback,
			// 970 of 1000 succeed at once, attempt 2 recovers 1 of 250 failures, attempt 3 none.
			succ: counts(970, 1), fail: counts(0, 0, 249),
			summary:        "100% of successes on attempt 1; attempts 2-3 recovered 0.4% of failures",
			recommendation: "escalate after 1 attempt: attempts 2-3 recovered 0.4% of the calls that reached them",
			changes:        []string{"fallback.after_attempts: 0 -> 1"},
			proposed:       func(p *policy.Policy) { p.Fallback.AfterAttempts = 1 },
		},
		{
			name: "already escalates after 1", p: escalatesAfter1,
			succ: counts(970, 1), fail: counts(0, 0, 249),
			summary:        "100% of successes on attempt 1; attempts 2-3 recovered 0.4% of failures",
			recommendation: "escalate after 1 attempt: attempts 2-3 recovered 0.4% of the calls that reached them (it does already)",
		},
		{
			name: "attempt 2 earns, 3 and beyond do not: max_attempts 2", p: five,
			// 200 reach attempt 2, 100 recovered there; 100 reach 3, none recovered.
			succ: counts(800, 100), fail: counts(0, 0, 0, 0, 100),
			summary:        "89% of successes on attempt 1; attempts 2-5 recovered 50% of failures",
			recommendation: "max_attempts 2: attempts 3-5 recovered 0% of the calls that reached them",
			changes:        []string{"max_attempts: 5 -> 2"},
			proposed:       func(p *policy.Policy) { p.MaxAttempts = 2 },
		},
		{
			name: "retries earn their keep", p: def,
			// 100 reach attempt 2: 60 recovered there, 20 of the 40 left on attempt 3.
			succ: counts(900, 60, 20), fail: counts(0, 0, 20),
			summary:        "92% of successes on attempt 1; attempts 2-3 recovered 80% of failures",
			recommendation: "keep max_attempts 3: the retries earn their keep",
		},
		{
			name: "exactly the threshold is kept", p: def,
			// 200 reach attempts 2 and 3, and 2 are recovered on attempt 3:
			// exactly 1% beyond 1 and beyond 2, not under it.
			succ: counts(800, 0, 2), fail: counts(0, 0, 198),
			summary:        "100% of successes on attempt 1; attempts 2-3 recovered 1% of failures",
			recommendation: "keep max_attempts 3: the retries earn their keep",
		},
		{
			name: "too few retries to judge", p: def,
			succ: counts(995, 1), fail: counts(0, 0, 4),
			summary:        "100% of successes on attempt 1; attempts 2-3 recovered 20% of failures",
			recommendation: "keep max_attempts 3: too few calls reached attempt 2 to judge the retries",
		},
		{
			name: "no call reached attempt 2", p: def,
			succ:           counts(100),
			summary:        "100% of successes on attempt 1; no call reached attempt 2",
			recommendation: "keep max_attempts 3: too few calls reached attempt 2 to judge the retries",
		},
		{
			name: "every call failed terminally on attempt 1", p: def,
			fail:           counts(60),
			summary:        "no successes; no call reached attempt 2",
			recommendation: "keep max_attempts 3: too few calls reached attempt 2 to judge the retries",
		},
		{
			name: "a fallback of another target: no proposal", p: def, fallbackOf: []string{"geo"},
			succ: counts(0, 900, 10), fail: counts(0, 0, 90),
			summary:        "0% of successes on attempt 1; attempts 2-3 recovered 91% of failures",
			recommendation: "a fallback of geo: its escalated calls go by their primary's policy; see the primary's advice",
		},
		{
			name: "the 16+ bucket", p: func() policy.Policy { p := def; p.MaxAttempts = 20; return p }(),
			succ: func() policy.AttemptCounts {
				c := counts(100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
				c[15] = 20
				return c
			}(),
			summary:        "83% of successes on attempt 1; attempts 2-16+ recovered 100% of failures",
			recommendation: "keep max_attempts 20: the retries earn their keep",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := policy.TargetStats{Tenant: "acme", Target: "geocoder", Successes: tc.succ, Failures: tc.fail}
			ad := advise(st, tc.p, tc.fallbackOf)
			if ad.summary != tc.summary {
				t.Errorf("summary = %q, want %q", ad.summary, tc.summary)
			}
			if ad.recommendation != tc.recommendation {
				t.Errorf("recommendation = %q, want %q", ad.recommendation, tc.recommendation)
			}
			if !slices.Equal(ad.changes, tc.changes) {
				t.Errorf("changes = %q, want %q", ad.changes, tc.changes)
			}
			switch {
			case tc.proposed == nil && ad.proposed != nil:
				t.Errorf("proposed %+v, want nothing", *ad.proposed)
			case tc.proposed != nil && ad.proposed == nil:
				t.Errorf("proposed nothing, want a change")
			case tc.proposed != nil:
				want := tc.p
				want.Fallback.Targets = slices.Clone(tc.p.Fallback.Targets)
				tc.proposed(&want)
				if got := *ad.proposed; got.MaxAttempts != want.MaxAttempts || got.Fallback.AfterAttempts != want.Fallback.AfterAttempts ||
					!slices.Equal(got.Fallback.Targets, want.Fallback.Targets) || got.Backoff != want.Backoff || got.Breaker != want.Breaker {
					t.Errorf("proposed %+v, want %+v", got, want)
				}
			}
		})
	}
}

func TestPercent(t *testing.T) {
	for _, tc := range []struct {
		part, whole uint64
		want        string
	}{
		{0, 0, "0%"}, {0, 10, "0%"}, {1, 250, "0.4%"}, {1, 100, "1%"}, {97, 100, "97%"}, {1, 3, "33%"}, {1, 1000, "0.1%"}, {1, 20000, "0%"},
		{1, 200000, "0%"},
	} {
		if got := percent(tc.part, tc.whole); got != tc.want {
			t.Errorf("percent(%d, %d) = %q, want %q", tc.part, tc.whole, got, tc.want)
		}
	}
}
