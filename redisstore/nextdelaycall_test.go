package redisstore

import (
	"strconv"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// TestNextDelayCallFillsItsSlice: nextDelayArgs and the carried permits
// are the length of the arguments, and nextDelayNumbersLen and a byte per
// carried result the length of the packed numbers, so neither slice made
// for them grows.
func TestNextDelayCallFillsItsSlice(t *testing.T) {
	st, cfg, bg, sa := nextDelayCallStep()
	for n := range 3 {
		carried := make([]result, n)
		_, args := nextDelayCall(&st, &cfg, &bg, 1000, carried, &sa)
		if len(args) != nextDelayArgs+n || cap(args) != len(args) {
			t.Errorf("%d results carried: %d arguments in a slice of %d, want %d", n, len(args), cap(args), nextDelayArgs+n)
		}
		p := args[0].([]byte)
		if len(p) != nextDelayNumbersLen+n || cap(p) != len(p) {
			t.Errorf("%d results carried: %d bytes of numbers in a slice of %d, want %d", n, len(p), cap(p), nextDelayNumbersLen+n)
		}
	}
}

// nextDelayCallStep is a NextDelay step with a deadline and a run, and
// its breaker configuration, budget and share arguments.
func nextDelayCallStep() (policy.NextDelayStep, policy.BreakerConfig, policy.TenantBudget, shareArgs) {
	p := policy.Default()
	now := time.Unix(1_800_000_000, 123_456_789)
	cfg := fleet.NormConfig(p.Breaker)
	bg := policy.TenantBudget{Tenant: "acme", Capacity: 100, DepositRatio: 0.1, MinPerSecond: 1, RetryCost: 1, TimeoutCost: 2}
	dec := policy.Decision{Retry: true, Delay: 1234567 * time.Microsecond, Deadline: now.Add(time.Minute), Checks: policy.CheckBreaker}
	st := policy.NextDelayStep{Call: policy.CallKey{Tenant: "acme", CallID: "call-000123"}, Attempt: 2,
		Key: policy.BreakerKey{Tenant: "acme", Target: "payments"}, Breaker: cfg, Result: policy.ResultTransientFailure,
		Decision: dec, Policy: &p, SpreadDraw: 0.37, Spend: policy.SpendRequest{Tenant: "acme", RunID: "run-7"},
		RunCutoff: now.Add(time.Hour), Answer: policy.Answer{Class: "transient:503", Checks: dec.Checks, Deadline: dec.Deadline},
		Keep: now.Add(time.Hour)}
	sa := shareArgs{replica: "0123456789abcdef", bucket: 12, run: 3, live: "0123456789abcdef", grace: 3 * time.Second}
	return st, cfg, bg, sa
}

// BenchmarkNextDelayCall builds the keys and arguments of a
// policyd_nextdelay call with a deadline, a run and a held result carried:
// the replica's work before the client writes them.
func BenchmarkNextDelayCall(b *testing.B) {
	st, cfg, bg, sa := nextDelayCallStep()
	carried := []result{{Result: policy.ResultSuccess}}
	b.ReportAllocs()
	for b.Loop() {
		_, _ = nextDelayCall(&st, &cfg, &bg, 1000, carried, &sa)
	}
}

// BenchmarkNextDelayReplayReply reads policyd_nextdelay's reply to an
// attempt asked again: the attempt record, decoded, and its check.
func BenchmarkNextDelayReplayReply(b *testing.B) {
	st, _, _, _ := nextDelayCallStep()
	now := time.Now()
	reply := []any{now.UnixMicro(), "replay", "2", strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10),
		string(packAnswer(&st.Answer)), "1 1234567000 0 0 1 96 41.5 3 0"}
	var s *Store // the replay path reads the reply alone
	b.ReportAllocs()
	for b.Loop() {
		if res, err := s.nextDelayReply(&st, reply); err != nil || !res.Replay {
			b.Fatal(res, err)
		}
	}
}
