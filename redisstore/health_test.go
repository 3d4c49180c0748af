package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// TestEngineBreaker drives the breaker around Redis on a fake clock: down
// after Threshold failures in a row, nothing through during the
// cool-down, then one probe at a time until one succeeds.
func TestEngineBreaker(t *testing.T) {
	now := time.Unix(1000, 0)
	b := engineBreaker{Threshold: 3, Cooldown: time.Second}
	call := func(failed bool) (allowed, changed bool) {
		if !b.allow(now) {
			return false, false
		}
		return true, b.done(now, now, failed)
	}
	for i := range 2 {
		if ok, ch := call(true); !ok || ch {
			t.Fatalf("failure %d: allowed %v changed %v, want allowed and still up", i+1, ok, ch)
		}
	}
	if ok, _ := call(false); !ok || b.down {
		t.Fatal("a success resets the count: the engine must stay up")
	}
	for i := range 3 {
		_, ch := call(true)
		if want := i == 2; ch != want || b.down != want {
			t.Fatalf("failure %d after the success: changed %v down %v, want %v", i+1, ch, b.down, want)
		}
	}
	if b.allow(now.Add(999 * time.Millisecond)) {
		t.Fatal("a call went through during the cool-down")
	}
	now = now.Add(time.Second)
	if !b.allow(now) {
		t.Fatal("no probe after the cool-down")
	}
	if b.allow(now) {
		t.Fatal("a second call went through while the probe is out")
	}
	if b.done(now, now, true) || !b.down {
		t.Fatal("a failed probe must keep the engine down")
	}
	if b.allow(now.Add(500 * time.Millisecond)) {
		t.Fatal("a failed probe must start another cool-down")
	}
	now = now.Add(time.Second)
	if !b.allow(now) || !b.done(now, now, false) || b.down {
		t.Fatal("a successful probe must bring the engine up")
	}
	if !b.allow(now) {
		t.Fatal("calls must go through once up")
	}
	// A feed's read while down, in the cool-down: its failure changes
	// nothing, its success brings the engine up without a probe.
	for range 3 {
		call(true)
	}
	if !b.down || b.readDone(now, now, true) || !b.down {
		t.Fatal("a failed feed read while down must keep the engine down")
	}
	if !b.readDone(now, now.Add(time.Millisecond), false) || b.down || !b.allow(now.Add(time.Millisecond)) {
		t.Fatal("a feed read Redis answered must bring the engine up, in the cool-down")
	}
}

// TestEngineBreakerCountsAStallOnce: calls that were out together when
// Redis stalled (an fsync of 53 ms, measured under policybench's report
// phase) fail together, and count as one failure: a call counts only if
// it started after the last one counted failed. Three stalls in a row,
// each seen by a call sent after the one before failed, bring the
// engine down.
func TestEngineBreakerCountsAStallOnce(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	b := engineBreaker{Threshold: 3, Cooldown: time.Second}
	for i := range 64 { // 64 calls sent within the stall, each failing at its timeout
		if b.done(ms(i/2), ms(50+i/2), true) || b.down {
			t.Fatalf("call %d of one stall brings the engine down, want one failure for all", i)
		}
	}
	if b.done(ms(60), ms(61), false) || b.down || b.failures != 0 {
		t.Fatalf("a call sent after the stall succeeds: down %v, failures %d; want up, 0", b.down, b.failures)
	}
	// Redis stops: each call sent after the one before it failed fails.
	if b.done(ms(100), ms(150), true) || b.done(ms(120), ms(170), true) || b.done(ms(151), ms(201), true) {
		t.Fatal("down before three failures, each of a call sent after the last counted one failed")
	}
	if !b.done(ms(202), ms(252), true) || !b.down {
		t.Fatal("three failures of calls sent one after another's failure: the engine must be down")
	}
}

// TestEngineBreakerSuspectSendsOneCall: after a failure counted, and
// until a call succeeds, one call at a time goes to Redis and the others
// are refused at once (their requests decide without the engine, flagged
// degraded): a request whose call timed out does not wait a timeout again
// for its next one while the replica is still counting, and a stall that
// ends lets the calls through again without a degraded episode.
func TestEngineBreakerSuspectSendsOneCall(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	b := engineBreaker{Threshold: 3, Cooldown: time.Second}
	for i := range 8 { // sent together before a stall, failing at their timeout
		if !b.allow(ms(i)) {
			t.Fatalf("call %d refused while up", i)
		}
	}
	b.done(ms(0), ms(50), true)
	if !b.allow(ms(51)) {
		t.Fatal("no call let through after a failure: the engine is not down")
	}
	for i := range 5 {
		if b.allow(ms(52 + i)) {
			t.Fatalf("call %d let through while the one sent after the failure is out", i)
		}
	}
	for i := 1; i < 8; i++ { // the calls of the stall come back: one failure still
		b.done(ms(i), ms(50+i), true)
	}
	if b.allow(ms(58)) || b.down || b.failures != 1 {
		t.Fatalf("after the stall's calls: down %v, failures %d, a second call let through; want up, 1, none", b.down, b.failures)
	}
	b.done(ms(51), ms(53), false) // the call sent after the failure: Redis answers
	for i := range 5 {
		if !b.allow(ms(54)) {
			t.Fatalf("call %d refused after Redis answered", i)
		}
	}
	// Redis stops: each call let through fails; the third brings it down.
	b.done(ms(54), ms(104), true)
	for i, at := range []int{104, 154} {
		if !b.allow(ms(at)) || b.allow(ms(at)) {
			t.Fatalf("failure %d: not exactly one call let through", i+1)
		}
		if changed := b.done(ms(at), ms(at+50), true); changed != (i == 1) || b.down != (i == 1) {
			t.Fatalf("failure %d: changed %v down %v", i+2, changed, b.down)
		}
	}
}

// TestProbeShare: ceil(N / live), at least one.
func TestProbeShare(t *testing.T) {
	for _, c := range []struct{ n, live, want int }{{1, 3, 1}, {3, 3, 1}, {4, 3, 2}, {5, 2, 3}, {2, 0, 2}, {6, 1, 6}} {
		if got := probeShare(c.n, c.live); got != c.want {
			t.Errorf("probeShare(%d, %d) = %d, want %d", c.n, c.live, got, c.want)
		}
	}
}

// TestReplayedBatchAppliedOnce: policyd_outcomes applies a batch id once;
// the same batch sent again (a replay of a call that timed out but ran)
// changes nothing.
func TestReplayedBatchAppliedOnce(t *testing.T) {
	c := standalone(t)
	ctx := context.Background()
	key := policy.BreakerKey{Tenant: "acme", Target: "pay"}
	b := &outcomeBatch{id: "batch-1", tenant: "acme", deposit: 1}
	b.groups = []*outcomeGroup{{key: key, cfg: fleet.NormConfig(policy.BreakerConfig{}),
		runs: []resultRun{{result: policy.ResultSuccess, n: 1, update: 0}, {result: policy.ResultTransientFailure, n: 1, update: 1}}}}
	bg := DefaultTenantBudget()
	keys, args := b.call(&bg, 100)
	l := lib{c: c}
	first, err := l.fcall(ctx, "policyd_outcomes", keys, args...)
	if err != nil {
		t.Fatal(err)
	}
	again, err := l.fcall(ctx, "policyd_outcomes", keys, args...)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) == 1 || len(again) != 1 || toString(again[0]) != "applied" {
		t.Fatalf("first reply %v, replay %v; want a full reply, then {applied}", first, again)
	}
	st, err := readCall(ctx, l, key)
	if err != nil {
		t.Fatal(err)
	}
	if st.WindowCalls != 2 || st.WindowFailures != 1 {
		t.Errorf("after a batch and its replay the window counts %d calls, %d failures; want 2, 1", st.WindowCalls, st.WindowFailures)
	}
	b.id = "batch-2"
	keys, args = b.call(&bg, 100)
	if r, err := l.fcall(ctx, "policyd_outcomes", keys, args...); err != nil || len(r) == 1 {
		t.Fatalf("another batch id = %v, %v; want it applied", r, err)
	}
}
