package redisstore

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// TestNextDelayMirrorsFleet runs random NextDelay steps through the
// library's policyd_nextdelay on a real server and through fleet's rules
// at the same instant (a clock the test moves, lib.clock): the breaker
// (forced OPEN or CLOSED, with or without a cool-down), the hint shared,
// fleet.GateRetry, the spend (fleet.Run's refusal, fleet.Bucket.Withdraw,
// the pool), fleet.Spent and fleet.CutRun, and compares the verdicts; then
// the attempt record: the same attempt replays the verdict, a lower one
// is refused, and so is any after a STOP.
func TestNextDelayMirrorsFleet(t *testing.T) {
	c := standalone(t)
	ctx := context.Background()
	now := time.Now().Truncate(time.Microsecond) // attempt records expire on the server's clock (PEXPIREAT)
	l := lib{c: c, clock: func() time.Time { return now }}
	rng := rand.New(rand.NewPCG(13, 17))
	dur := func(max time.Duration) time.Duration { return time.Duration(rng.Int64N(int64(max))) }
	cfg := fleet.NormConfig(policy.BreakerConfig{Mode: policy.BreakerConsecutive, ConsecutiveFailures: 1000,
		Window: time.Minute, Cooldown: time.Minute, HalfOpenProbes: 1, ProbeTimeout: time.Second})
	results := []policy.Result{policy.ResultTransientFailure, policy.ResultTerminal, policy.ResultPushback}
	stops := []policy.Decision{
		{Stop: policy.StopTerminal, Disposition: policy.DispositionFailedTerminal},
		{Stop: policy.StopAttemptsExhausted, Disposition: policy.DispositionDeadLetter},
		{Stop: policy.StopDeadline, Disposition: policy.DispositionDeadLetter},
	}
	seen := map[string]int{}
	for i := range 400 {
		now = now.Add(dur(time.Second)).Truncate(time.Microsecond)
		nowNS := now.UnixNano()
		tenant := "m" + strconv.Itoa(i)
		key := policy.BreakerKey{Tenant: tenant, Target: "api"}

		state := policy.BreakerClosed
		if rng.IntN(4) == 0 {
			if _, _, err := adminCall(ctx, l, key, "force", policy.BreakerOpen, 0); err != nil {
				t.Fatal(err)
			}
			state = policy.BreakerOpen
		}
		var coolUS int64
		if rng.IntN(2) == 0 {
			until := now.Add(dur(20 * time.Second))
			if _, _, _, err := cooldownCall(ctx, l, key, &cfg, until, 0); err != nil {
				t.Fatal(err)
			}
			coolUS = until.UnixMicro()
		}
		var run fleet.Run
		hasRun := rng.IntN(2) == 0
		var cutoff time.Time
		if hasRun {
			pool := uint64(rng.IntN(3))
			cutoff = now.Add(dur(20*time.Second) - 5*time.Second).Truncate(time.Microsecond)
			run = fleet.NewRun(pool, cutoff.UnixNano())
			run.Spent = uint64(rng.IntN(int(pool) + 1))
			if err := c.HSet(ctx, keyRun(tenant, "r"), "pool", pool, "cutoff", cutoff.UnixMicro(), "spent", run.Spent).Err(); err != nil {
				t.Fatal(err)
			}
		}
		bg := policy.TenantBudget{Tenant: tenant, Capacity: []float64{0.5, 1, 3}[rng.IntN(3)], DepositRatio: 0.2,
			MinPerSecond: 0.001, RetryCost: 1, TimeoutCost: 2}

		p := policy.Default()
		p.AttemptTimeout = dur(2 * time.Second)
		p.Pushback.SpreadRatio, p.Pushback.MinSpread = rng.Float64(), dur(500*time.Millisecond)
		p.Pushback.MaxHint = []time.Duration{0, 5 * time.Second, 30 * time.Second}[rng.IntN(3)]
		dec := stops[rng.IntN(len(stops))]
		if rng.IntN(3) > 0 {
			dec = policy.Decision{Retry: true, Delay: dur(10 * time.Second)}
		}
		if rng.IntN(2) == 0 {
			dec.Deadline = now.Add(dur(16*time.Second) - time.Second)
		}
		dec.Checks = policy.Check(rng.IntN(64)) | policy.CheckBreaker
		st := policy.NextDelayStep{
			Call: policy.CallKey{Tenant: tenant, CallID: "c"}, Attempt: uint32(1 + rng.IntN(3)),
			Key: key, Breaker: cfg, Result: results[rng.IntN(len(results))],
			Decision: dec, Policy: &p, SpreadDraw: rng.Float64(),
			Spend:     policy.SpendRequest{Tenant: tenant, Timeout: rng.IntN(4) == 0},
			RunCutoff: cutoff, CutBinds: hasRun && rng.IntN(2) == 0,
			Answer: policy.Answer{Class: "transient:503", Checks: dec.Checks, Deadline: dec.Deadline},
			Keep:   now.Add(time.Hour),
		}
		if hasRun {
			st.Spend.RunID = "r"
		}
		if rng.IntN(2) == 0 {
			st.Share = time.Duration(1 + rng.Int64N(int64(20*time.Second)))
		}

		// fleet's rules, at now.
		want := dec
		if st.Share > 0 && (!dec.Retry || state != policy.BreakerOpen) {
			coolUS = max(coolUS, now.Add(st.Share).UnixMicro())
		}
		var coolNS int64
		if coolUS != 0 {
			coolNS = coolUS * 1000
		}
		ask, spread := fleet.GateRetry(&want, &p, state, coolNS, nowNS, hasRun, st.SpreadDraw)
		var tokens float64
		var remaining uint64
		if ask {
			var sp policy.Spend
			if stop, disp := run.Refusal(nowNS); hasRun && stop != policy.StopNone {
				sp = policy.Spend{Stop: stop, Disposition: disp}
				tokens = bg.Capacity
			} else {
				k := fleet.NewBucket(&bg, nowNS)
				w := k.Withdraw(nowNS, &bg, st.Spend.Timeout)
				sp = policy.Spend{Granted: w.Granted, Stop: policy.StopBudgetExhausted, Disposition: policy.DispositionDeadLetter}
				if w.Granted && hasRun {
					run.Spend()
				}
				tokens = k.Tokens
			}
			if hasRun {
				remaining = run.Remaining()
			}
			fleet.Spent(&want, &sp)
		}
		fleet.CutRun(&want, fleet.UnixNano(cutoff), nowNS, st.CutBinds)

		// The library's, at now.
		keys, args := nextDelayCall(&st, &cfg, &bg, 0, nil, &shareArgs{replica: "r"})
		r, err := l.fcall(ctx, "policyd_nextdelay", keys, args...)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if len(r) != 12 || toString(r[1]) != "decided" {
			t.Fatalf("step %d: reply %v, want a decision", i, r)
		}
		got := st.Answer
		if err := applyVerdict(&got, toString(r[2])); err != nil {
			t.Fatalf("step %d: verdict %q: %v", i, r[2], err)
		}
		if got.Retry != want.Retry || got.Delay != want.Delay || got.Stop != want.Stop || got.Disposition != want.Disposition ||
			got.Checks != want.Checks || got.RunRemaining != remaining || math.Abs(got.TenantTokens-tokens) > 1e-9 ||
			(got.Note == "cooldown:fleet") != spread {
			t.Fatalf("step %d (%+v, breaker %v, cool-down %d µs, run %v %+v):\nlibrary %+v\nfleet   %+v tokens %v remaining %d spread %v",
				i, dec, state, coolUS, hasRun, run, got, want, tokens, remaining, spread)
		}
		seen[want.Stop.String()+"/"+want.Disposition.String()]++
		if spread {
			seen["spread"]++
		}

		// The attempt record: the same attempt again replays, a lower one
		// or any after a STOP is refused.
		again := func(attempt uint32) string {
			st2 := st
			st2.Attempt = attempt
			keys, args := nextDelayCall(&st2, &cfg, &bg, 0, nil, &shareArgs{replica: "r"})
			r, err := l.fcall(ctx, "policyd_nextdelay", keys, args...)
			if err != nil {
				t.Fatalf("step %d, attempt %d: %v", i, attempt, err)
			}
			if v := toString(r[1]); v == "replay" {
				a, err := decodeAttempt(map[string]string{"attempt": toString(r[2]), "expiry": toString(r[3]),
					"answer": toString(r[4]), "verdict": toString(r[5])})
				ra, ga := a.Answer, got
				same := ra.Deadline.Equal(ga.Deadline)
				ra.Deadline, ga.Deadline = time.Time{}, time.Time{}
				if err != nil || ra != ga || !same {
					t.Fatalf("step %d: replay %+v (%v), want %+v", i, a.Answer, err, got)
				}
			}
			return toString(r[1])
		}
		if v := again(st.Attempt); v != "replay" {
			t.Fatalf("step %d: the same attempt again: %s, want replay", i, v)
		}
		if st.Attempt > 1 {
			if v := again(st.Attempt - 1); v != "refused" {
				t.Fatalf("step %d: a lower attempt: %s, want refused", i, v)
			}
		}
		if !want.Retry {
			if v := again(st.Attempt + 1); v != "refused" {
				t.Fatalf("step %d: an attempt after a STOP: %s, want refused", i, v)
			}
		}
	}
	for _, k := range []string{"NONE/NONE", "CIRCUIT_OPEN/CIRCUIT_OPEN", "DEADLINE/DEAD_LETTER", "DEADLINE/DEADLINE_CUT",
		"BUDGET_EXHAUSTED/DEAD_LETTER", "spread"} {
		if seen[k] == 0 {
			t.Errorf("no step ended %s: the random inputs miss a rule (%v)", k, seen)
		}
	}
}
