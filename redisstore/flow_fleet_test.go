package redisstore

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// The flow functions (policyd_admit_flow, policyd_release_lease,
// policyd_pool) run each scenario below on a real server and through
// fleet's values (fleet.Flow, fleet.AdaptiveLimit and fleet.Breaker, in
// the order AdmitFlow applies them) at the same instant, a clock the test
// moves (lib.clock), and every answer and the state after every step are
// compared, as fleet_test.go does for the breaker.

// flowStep is one operation of a flow scenario.
type flowStep struct {
	name    string
	op      string // admit, release, record, advance, pool
	lim     *policy.FlowLimits
	lease   int // release: the lease of that earlier step (1-based), -1 an invented one, -2 one that does not parse
	sig     policy.FlowSignal
	result  policy.Result
	advance time.Duration
	reason  string        // admit: the reason fleet and the library must both give
	after   time.Duration // admit: the retry after they must both give
}

// flowTwin is one key's ceilings and breaker held both ways.
type flowTwin struct {
	t         *testing.T
	key       policy.BreakerKey
	flow      fleet.Flow
	limit     fleet.AdaptiveLimit
	breaker   fleet.Breaker
	created   bool
	decreases int      // the limit's cuts so far
	leases    []string // per step: the lease handed out, if any
}

// admit is AdmitFlow by fleet's rules at now (ns).
func (w *flowTwin) admit(now int64, cfg *policy.BreakerConfig, lim policy.FlowLimits, permit, lease fleet.PermitID) policy.Admission {
	if !w.created {
		w.breaker, w.created = fleet.NewBreaker(now), true
	}
	if lim.Adaptive.Max > 0 { // the adaptive limit's ceiling, as a fixed one for this admission
		lim.Ceiling, lim.Adaptive = w.limit.Ceiling(lim.Adaptive), policy.AdaptiveBounds{}
	}
	fa, _ := w.flow.Admit(now, &lim, func() fleet.PermitID { return lease })
	if !fa.Admitted {
		return fa
	}
	w.breaker.Mode = cfg.Mode
	w.breaker.Advance(now)
	a, _ := w.breaker.Admit(now, cfg, func() fleet.PermitID { return permit })
	if !a.Admitted {
		w.flow.Undo(now, &lim, &fa)
		return a
	}
	a.LeaseID, a.LeaseExpiry = fa.LeaseID, fa.LeaseExpiry
	return a
}

// release is ReleaseLease by fleet's rules at now (ns).
func (w *flowTwin) release(now int64, id string, lim *policy.FlowLimits, sig policy.FlowSignal) bool {
	held, _ := w.flow.Pool.Release(now, id)
	if lim.Adaptive.Max > 0 {
		switch sig {
		case policy.SignalSuccess:
			w.limit.Succeeded(lim.Adaptive)
		case policy.SignalCongestion:
			if cut, _ := w.limit.Congested(now, lim.Adaptive); cut {
				w.decreases++
			}
		}
	}
	return held
}

// checkFlow compares the flow hash and leases set on the server with the
// twin's values at now (µs).
func (w *flowTwin) checkFlow(ctx context.Context, l lib, name string, now int64) {
	w.t.Helper()
	h, err := l.c.HGetAll(ctx, keyFlow(w.key.Tenant, w.key.Target)).Result()
	if err != nil {
		w.t.Fatal(err)
	}
	n := func(f string) int64 { v, _ := strconv.ParseInt(h[f], 10, 64); return v }
	alimit, _ := strconv.ParseFloat(h["alimit"], 64)
	got := [6]float64{float64(n("tat")) * 1000, float64(n("stray")), alimit, float64(n("adec")) * 1000, float64(n("asince")), float64(n("adecs"))}
	want := [6]float64{float64(w.flow.Rate.TAT), float64(w.flow.Pool.Stray), w.limit.Limit, float64(w.limit.LastDecrease),
		float64(w.limit.Since), float64(w.decreases)}
	if got != want {
		w.t.Errorf("%s: redis tat, stray, limit, last decrease, since, decreases %v; fleet %v", name, got, want)
	}
	live, err := l.c.ZCount(ctx, keyLeases(w.key.Tenant, w.key.Target), "("+strconv.FormatInt(now, 10), "+inf").Result()
	if err != nil {
		w.t.Fatal(err)
	}
	if int(live) != w.flow.Pool.Live(now*1000) {
		w.t.Errorf("%s: redis %d live leases, fleet %d", name, live, w.flow.Pool.Live(now*1000))
	}
}

func sameAdmission(a, b policy.Admission) bool {
	return a.Admitted == b.Admitted && a.State == b.State && a.PermitID == b.PermitID && a.RetryAfter == b.RetryAfter &&
		a.Reason == b.Reason && a.LeaseID == b.LeaseID && a.LeaseExpiry.Equal(b.LeaseExpiry)
}

func runFlowScenario(t *testing.T, key policy.BreakerKey, cfg policy.BreakerConfig, lim policy.FlowLimits, steps []flowStep) {
	c := standalone(t)
	ctx := context.Background()
	var mu sync.Mutex
	clock := time.Unix(1_750_000_000, 0)
	l := lib{c: c, clock: func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }}
	w := &flowTwin{t: t, key: key}
	bw := &twin{t: t, key: key}
	cfg = fleet.NormConfig(cfg)
	for i, s := range steps {
		w.leases = append(w.leases, "")
		sl := &lim
		if s.lim != nil {
			sl = s.lim
		}
		var now int64
		switch s.op {
		case "advance":
			mu.Lock()
			clock = clock.Add(s.advance)
			mu.Unlock()
			continue
		case "admit":
			permit, lease := newPermitID(), newPermitID()
			var got policy.Admission
			var st state
			var limit float64
			var err error
			now, got, st, limit, err = admitFlowCall(ctx, l, key, &cfg, sl, permit, lease, 0)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			want := w.admit(now*1000, &cfg, *sl, permit, lease)
			if !sameAdmission(got, want) {
				t.Errorf("%s: redis admits %+v, fleet %+v", s.name, got, want)
			}
			if got.Reason != s.reason || got.RetryAfter != s.after {
				t.Errorf("%s: reason %q after %v, want %q after %v", s.name, got.Reason, got.RetryAfter, s.reason, s.after)
			}
			if limit != w.limit.Limit {
				t.Errorf("%s: redis reports the adaptive limit %v, fleet %v", s.name, limit, w.limit.Limit)
			}
			w.leases[i] = got.LeaseID
			bw.v = w.breaker
			bw.check(s.name, now, st)
		case "release":
			id := ""
			switch {
			case s.lease > 0:
				id = w.leases[s.lease-1]
			case s.lease == -1:
				id = newPermitID().String()
			case s.lease == -2:
				id = "not-a-lease"
			}
			var held bool
			var err error
			now, held, _, err = releaseCall(ctx, l, key, id, &sl.Adaptive, s.sig)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			if want := w.release(now*1000, id, sl, s.sig); held != want {
				t.Errorf("%s: redis held %v, fleet %v", s.name, held, want)
			}
		case "record":
			var out []recorded
			var err error
			now, out, err = recordCall(ctx, l, key.Tenant, []recordGroup{{Key: key, Cfg: &cfg, Results: []result{{s.result, ""}}}}, 0)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			if !w.created {
				w.breaker, w.created = fleet.NewBreaker(now*1000), true
			}
			w.breaker.Mode = cfg.Mode
			w.breaker.Advance(now * 1000)
			_, _ = w.breaker.Record(now*1000, &cfg, s.result, "")
			bw.v = w.breaker
			bw.check(s.name, now, out[0].State)
			continue
		case "pool":
			var ps policy.PoolStatus
			var err error
			now, ps, err = poolCall(ctx, l, key)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			want := policy.PoolStatus{InFlight: w.flow.Pool.Live(now * 1000), Stray: w.flow.Pool.Stray, Adaptive: w.limit.Limit, Decreases: w.limit.Decreases}
			if ps != want {
				t.Errorf("%s: redis pool %+v, fleet %+v", s.name, ps, want)
			}
		}
		w.checkFlow(ctx, l, s.name, now)
	}
}

func TestFlowMirrorsFleet(t *testing.T) {
	leases := policy.FlowLimits{Ceiling: 3, LeaseTTL: 10 * time.Second, FullWait: time.Second}
	shortWait := leases
	shortWait.FullWait = 5 * time.Second
	rate := policy.FlowLimits{Interval: 500 * time.Millisecond, Burst: 3}
	both := policy.FlowLimits{Ceiling: 1, LeaseTTL: 10 * time.Second, FullWait: time.Second, Interval: 250 * time.Millisecond, Burst: 2}
	adaptive := policy.FlowLimits{Ceiling: 4, LeaseTTL: 10 * time.Second, FullWait: time.Second,
		Adaptive: policy.AdaptiveBounds{Min: 1, Max: 4, Decrease: 0.5, Increase: 1, Hold: time.Second}}
	const closed = fleet.ReasonClosed
	trip := policy.BreakerConfig{ConsecutiveFailures: 1, Cooldown: time.Minute, HalfOpenProbes: 1, ProbeTimeout: 5 * time.Second}
	tests := []struct {
		name  string
		cfg   policy.BreakerConfig
		lim   policy.FlowLimits
		steps []flowStep
	}{
		{"leases keep the ceiling and expire", policy.BreakerConfig{}, leases, []flowStep{
			{name: "lease 1", op: "admit", reason: closed}, {name: "lease 2", op: "admit", reason: closed},
			{name: "lease 3", op: "admit", reason: closed},
			{name: "full", op: "admit", reason: fleet.ReasonFull, after: time.Second},
			{op: "advance", advance: 2 * time.Second},
			{name: "full later", op: "admit", reason: fleet.ReasonFull, after: time.Second},
			{name: "release lease 1", op: "release", lease: 1},
			{name: "release lease 1 again: stray", op: "release", lease: 1},
			{name: "invented lease: stray", op: "release", lease: -1},
			{name: "unparseable lease: stray", op: "release", lease: -2},
			{name: "the freed slot", op: "admit", reason: closed},
			{name: "pool", op: "pool"},
			{op: "advance", advance: 6 * time.Second},
			{name: "full, a lease expires before the wait", op: "admit", lim: &shortWait, reason: fleet.ReasonFull, after: 2 * time.Second},
			{op: "advance", advance: 2 * time.Second},
			{name: "two expired: lease", op: "admit", reason: closed},
			{name: "release an expired lease: stray", op: "release", lease: 2},
			{name: "pool after expiry", op: "pool"},
		}},
		{"rate is GCRA with a burst", policy.BreakerConfig{}, rate, []flowStep{
			{name: "burst 1", op: "admit", reason: closed}, {name: "burst 2", op: "admit", reason: closed},
			{name: "burst 3", op: "admit", reason: closed},
			{name: "past the burst", op: "admit", reason: fleet.ReasonRate, after: 500 * time.Millisecond},
			{op: "advance", advance: 200 * time.Millisecond},
			{name: "300ms to wait", op: "admit", reason: fleet.ReasonRate, after: 300 * time.Millisecond},
			{op: "advance", advance: 300 * time.Millisecond},
			{name: "one slot", op: "admit", reason: closed},
			{name: "none again", op: "admit", reason: fleet.ReasonRate, after: 500 * time.Millisecond},
			{op: "advance", advance: time.Hour},
			{name: "idle: the burst again", op: "admit", reason: closed}, {name: "burst 2 again", op: "admit", reason: closed},
		}},
		{"a refusal gives back what was taken", trip, both, []flowStep{
			{name: "lease and slot", op: "admit", reason: closed},
			{name: "full: slot given back", op: "admit", reason: fleet.ReasonFull, after: time.Second},
			{name: "return", op: "release", lease: 1},
			{name: "failure trips", op: "record", result: policy.ResultTransientFailure},
			{op: "advance", advance: time.Second},
			{name: "open: nothing held", op: "admit", reason: fleet.ReasonOpen, after: 59 * time.Second},
			{name: "open again", op: "admit", reason: fleet.ReasonOpen, after: 59 * time.Second},
			{name: "pool while open", op: "pool"},
			{op: "advance", advance: time.Minute},
			{name: "probe with a lease", op: "admit", reason: fleet.ReasonProbe},
			{name: "full before the breaker", op: "admit", reason: fleet.ReasonFull, after: time.Second},
			{name: "probe's lease back", op: "release", lease: 10},
			{name: "probes taken: lease given back", op: "admit", reason: fleet.ReasonProbesTaken, after: 5 * time.Second},
			{op: "advance", advance: time.Second},
			{name: "probes taken after a slot", op: "admit", reason: fleet.ReasonProbesTaken, after: 4 * time.Second},
		}},
		{"adaptive ceiling", policy.BreakerConfig{}, adaptive, []flowStep{
			{name: "lease 1", op: "admit", reason: closed}, {name: "lease 2", op: "admit", reason: closed},
			{name: "lease 3", op: "admit", reason: closed}, {name: "lease 4", op: "admit", reason: closed},
			{name: "full at the maximum", op: "admit", reason: fleet.ReasonFull, after: time.Second},
			{name: "congestion halves it to 2", op: "release", lease: 1, sig: policy.SignalCongestion},
			{name: "full at 2", op: "admit", reason: fleet.ReasonFull, after: time.Second},
			{name: "congestion within the window: no cut", op: "release", lease: 2, sig: policy.SignalCongestion},
			{name: "success: 2.5", op: "release", lease: 3, sig: policy.SignalSuccess},
			{name: "second of 2", op: "admit", reason: closed},
			{name: "full at 2.5", op: "admit", reason: fleet.ReasonFull, after: time.Second},
			{name: "success: 2.9", op: "release", lease: 4, sig: policy.SignalSuccess},
			{name: "second of 2 again", op: "admit", reason: closed},
			{name: "full at 2.9", op: "admit", reason: fleet.ReasonFull, after: time.Second},
			{name: "congestion within hold: no cut", op: "release", lease: 10, sig: policy.SignalCongestion},
			{op: "advance", advance: 2 * time.Second},
			{name: "congestion after a window and hold: 1.45", op: "release", lease: 13, sig: policy.SignalCongestion},
			{name: "no signal", op: "release", lease: -1},
			{name: "one at 1.45", op: "admit", reason: closed},
			{name: "full at 1.45", op: "admit", reason: fleet.ReasonFull, after: time.Second},
			{name: "pool at 1.45", op: "pool"},
			{op: "advance", advance: 11 * time.Second},
			{name: "success after the lease expired counts", op: "release", lease: 19, sig: policy.SignalSuccess},
			{name: "pool after", op: "pool"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runFlowScenario(t, policy.BreakerKey{Tenant: "acme", Target: "portal"}, tt.cfg, tt.lim, tt.steps)
		})
	}
}
