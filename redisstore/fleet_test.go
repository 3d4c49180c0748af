package redisstore

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// The tests of this file run one scenario through the library's functions
// on a real server and through package fleet's values at the same instant
// (the server's TIME each call reports), and compare every answer and the
// state after every step: fleet is the reference, the Lua its mirror.

// step is one operation of a breaker scenario.
type step struct {
	name    string
	op      string // admit, record, cooldown, reset, force, wait
	result  policy.Result
	permit  int // record: the permit handed out by that earlier step (1-based), -1 an invented one
	cfg     *policy.BreakerConfig
	until   time.Duration // cooldown: from now
	state   policy.BreakerState
	refused bool // record: want fleet.ErrPermit
}

// twin is one breaker held both ways.
type twin struct {
	t       *testing.T
	key     policy.BreakerKey
	v       fleet.Breaker
	created bool
	permits []string // per step: the permit handed out, if any
}

func (w *twin) check(name string, now int64, st state) {
	w.t.Helper()
	n := now * 1000
	calls, failures := w.v.Window(n)
	want := state{State: w.v.State, Forced: w.v.Forced, Mode: w.v.Mode, OpenUntil: w.v.OpenUntil / 1000,
		Changed: w.v.Changed / 1000, Generation: w.v.Generation, Cooldown: w.v.Cooldown.Until / 1000,
		Consecutive: w.v.Consecutive, WindowCalls: calls, WindowFailures: failures, Permits: w.v.LivePermits(n)}
	if st != want {
		w.t.Errorf("%s: redis %+v, fleet %+v", name, st, want)
	}
}

func (w *twin) begin(now int64, cfg *policy.BreakerConfig) {
	n := now * 1000
	if !w.created {
		w.v, w.created = fleet.NewBreaker(n), true
	}
	w.v.Mode = cfg.Mode
	w.v.Advance(n)
}

func runScenario(t *testing.T, key policy.BreakerKey, cfg policy.BreakerConfig, steps []step) {
	c := standalone(t)
	ctx := context.Background()
	w := &twin{t: t, key: key}
	cfg = fleet.NormConfig(cfg)
	for i, s := range steps {
		w.permits = append(w.permits, "")
		sc := &cfg
		if s.cfg != nil {
			c2 := fleet.NormConfig(*s.cfg)
			sc = &c2
		}
		switch s.op {
		case "wait":
			v, err := c.Get(ctx, keyBreaker(key.Tenant, key.Target)).Bytes()
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			r, err := decodeBreakerRecord(v)
			if err != nil {
				t.Fatalf("%s: the record %v", s.name, err)
			}
			waitServerPast(t, c, r.field("open_until"))
		case "admit":
			id := newPermitID()
			now, got, st, err := admitCall(ctx, lib{c: c}, key, sc, id, 0)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			w.begin(now, sc)
			want, _ := w.v.Admit(now*1000, sc, func() fleet.PermitID { return id })
			if got != want {
				t.Errorf("%s: redis admits %+v, fleet %+v", s.name, got, want)
			}
			w.permits[i] = got.PermitID
			w.check(s.name, now, st)
		case "record":
			permit := ""
			switch {
			case s.permit > 0:
				permit = w.permits[s.permit-1]
			case s.permit < 0:
				permit = newPermitID().String()
			}
			now, out, err := recordCall(ctx, lib{c: c}, key.Tenant, []recordGroup{{Key: key, Cfg: sc, Results: []result{{s.result, permit}}}}, 0)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			w.begin(now, sc)
			_, ferr := w.v.Record(now*1000, sc, s.result, permit)
			if out[0].Refused[0] != (ferr != nil) || out[0].Refused[0] != s.refused {
				t.Errorf("%s: redis refused %v, fleet %v, want %v", s.name, out[0].Refused[0], ferr, s.refused)
			}
			w.check(s.name, now, out[0].State)
		case "cooldown":
			tm, err := c.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			until := tm.Add(s.until).Truncate(time.Microsecond)
			now, inForce, st, err := cooldownCall(ctx, lib{c: c}, key, sc, until, 0)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			w.begin(now, sc)
			want, _ := w.v.ExtendCooldown(now*1000, until.UnixNano())
			if inForce*1000 != want {
				t.Errorf("%s: redis keeps the cool-down until %d µs, fleet %d ns", s.name, inForce, want)
			}
			w.check(s.name, now, st)
		case "reset", "force":
			now, st, err := adminCall(ctx, lib{c: c}, key, s.op, s.state, 0)
			if err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
			if !w.created {
				w.v, w.created = fleet.NewBreaker(now*1000), true
			}
			if s.op == "reset" {
				w.v.Reset(now * 1000)
			} else {
				w.v.Force(now*1000, s.state)
			}
			w.check(s.name, now, st)
		}
	}
}

func TestBreakerMirrorsFleet(t *testing.T) {
	short := &policy.BreakerConfig{ConsecutiveFailures: 2, Cooldown: time.Microsecond, HalfOpenProbes: 2, ProbeTimeout: time.Minute}
	expiring := &policy.BreakerConfig{ConsecutiveFailures: 2, Cooldown: time.Microsecond, HalfOpenProbes: 1, ProbeTimeout: time.Microsecond}
	tests := []struct {
		name  string
		key   policy.BreakerKey
		cfg   policy.BreakerConfig
		steps []step
	}{
		{"consecutive trip and OPEN refusal", policy.BreakerKey{Tenant: "acme", Target: "pay"},
			policy.BreakerConfig{ConsecutiveFailures: 3, Cooldown: time.Hour},
			[]step{
				{name: "closed admit", op: "admit"},
				{name: "failure 1", op: "record", result: policy.ResultTransientFailure},
				{name: "terminal resets the run", op: "record", result: policy.ResultTerminal},
				{name: "failure 1 again", op: "record", result: policy.ResultTransientFailure},
				{name: "failure 2", op: "record", result: policy.ResultTransientFailure},
				{name: "failure 3 trips", op: "record", result: policy.ResultTransientFailure},
				{name: "open refuses", op: "admit"},
				{name: "late result ignored", op: "record", result: policy.ResultSuccess},
			}},
		{"half-open probes, a failure reopens, successes close", policy.BreakerKey{Tenant: "a{b}c", Target: "x"}, *short,
			[]step{
				{name: "failure 1", op: "record", result: policy.ResultTransientFailure},
				{name: "failure 2 trips", op: "record", result: policy.ResultTransientFailure},
				{name: "cool-down over", op: "wait"},
				{name: "probe 1", op: "admit"},
				{name: "probe 2", op: "admit"},
				{name: "probes taken", op: "admit"},
				{name: "no permit changes nothing", op: "record", result: policy.ResultSuccess},
				{name: "invented permit refused", op: "record", result: policy.ResultSuccess, permit: -1, refused: true},
				{name: "probe 1 succeeds", op: "record", result: policy.ResultSuccess, permit: 4},
				{name: "probe 1 again refused", op: "record", result: policy.ResultSuccess, permit: 4, refused: true},
				{name: "probe 2 fails: reopen", op: "record", result: policy.ResultTransientFailure, permit: 5},
				{name: "cool-down over again", op: "wait"},
				{name: "probe 3", op: "admit"},
				{name: "probe 4", op: "admit"},
				{name: "probe 3 succeeds", op: "record", result: policy.ResultSuccess, permit: 13},
				{name: "probe 4 succeeds: closed", op: "record", result: policy.ResultSuccess, permit: 14},
				{name: "probe of the old generation ignored", op: "record", result: policy.ResultSuccess, permit: 5},
				{name: "closed again", op: "admit"},
			}},
		{"expired permit", policy.BreakerKey{Target: "target-scope"}, *expiring,
			[]step{
				{name: "failure 1", op: "record", result: policy.ResultTransientFailure},
				{name: "failure 2 trips", op: "record", result: policy.ResultTransientFailure},
				{name: "cool-down over", op: "wait"},
				{name: "probe", op: "admit"},
				{name: "expired probe refused", op: "record", result: policy.ResultSuccess, permit: 4, refused: true},
				{name: "its slot is free again", op: "admit"},
			}},
		{"failure rate", policy.BreakerKey{Tenant: "acme", Target: "rate"},
			policy.BreakerConfig{Mode: policy.BreakerFailureRate, FailureRate: 0.5, MinCalls: 4, Window: 10 * time.Second, Cooldown: time.Hour},
			[]step{
				{name: "success", op: "record", result: policy.ResultSuccess},
				{name: "failure", op: "record", result: policy.ResultTransientFailure},
				{name: "success 2", op: "record", result: policy.ResultSuccess},
				{name: "failure 2 at 4 calls trips", op: "record", result: policy.ResultTransientFailure},
				{name: "open", op: "admit"},
			}},
		{"cool-down only moves later", policy.BreakerKey{Tenant: "acme", Target: "cool"}, policy.BreakerConfig{},
			[]step{
				{name: "start", op: "cooldown", until: time.Hour},
				{name: "earlier is ignored", op: "cooldown", until: time.Minute},
				{name: "later moves it", op: "cooldown", until: 2 * time.Hour},
				{name: "pushback refusal", op: "admit"},
			}},
		{"forced states", policy.BreakerKey{Tenant: "acme", Target: "forced"}, policy.BreakerConfig{ConsecutiveFailures: 2},
			[]step{
				{name: "failure", op: "record", result: policy.ResultTransientFailure},
				{name: "force closed keeps the count", op: "force", state: policy.BreakerClosed},
				{name: "forced closed counts", op: "record", result: policy.ResultTransientFailure},
				{name: "forced closed never trips", op: "record", result: policy.ResultTransientFailure},
				{name: "forced closed admits", op: "admit"},
				{name: "force open", op: "force", state: policy.BreakerOpen},
				{name: "forced open refuses", op: "admit"},
				{name: "disable", op: "force", state: policy.BreakerDisabled},
				{name: "disabled admits", op: "admit"},
				{name: "disabled counts nothing", op: "record", result: policy.ResultTransientFailure},
				{name: "reset", op: "reset"},
				{name: "closed", op: "admit"},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runScenario(t, tt.key, tt.cfg, tt.steps) })
	}
}

func TestBucketMirrorsFleet(t *testing.T) {
	c := standalone(t)
	ctx := context.Background()
	b := policy.TenantBudget{Tenant: "acme", Capacity: 3, DepositRatio: 0.5, MinPerSecond: 0.001, RetryCost: 1, TimeoutCost: 2}
	var v fleet.Bucket
	created := false
	ops := []struct {
		name    string
		deposit int
		timeout bool
		dry     bool
	}{
		{name: "spend 1"}, {name: "timeout costs 2", timeout: true}, {name: "empty: refused"},
		{name: "deposit 3", deposit: 3}, {name: "spend after deposit"},
		{name: "deposit past capacity", deposit: 100}, {name: "spend 1 of full"},
		{name: "spend"}, {name: "spend"}, {name: "dry run grants at zero", dry: true},
	}
	for _, op := range ops {
		bg := b
		bg.DryRun = op.dry
		if op.deposit > 0 {
			now, tokens, err := depositCall(ctx, lib{c: c}, "acme", &bg, op.deposit)
			if err != nil {
				t.Fatalf("%s: %v", op.name, err)
			}
			if !created {
				v, created = fleet.NewBucket(&bg, now*1000), true
			}
			v.Deposit(now*1000, &bg, op.deposit)
			if math.Abs(tokens-v.Tokens) > 1e-9 {
				t.Errorf("%s: redis %v tokens, fleet %v", op.name, tokens, v.Tokens)
			}
			continue
		}
		now, sp, _, err := spendCall(ctx, lib{c: c}, "acme", &bg, op.timeout, "", &shareArgs{replica: "r"})
		if err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
		if !created {
			v, created = fleet.NewBucket(&bg, now*1000), true
		}
		w := v.Withdraw(now*1000, &bg, op.timeout)
		if sp.Granted != w.Granted || sp.DryRunRefused != w.DryRunRefused || math.Abs(sp.TenantTokens-v.Tokens) > 1e-9 {
			t.Errorf("%s: redis %+v, fleet %+v with %v tokens", op.name, sp, w, v.Tokens)
		}
		if sp.TenantTokens < 0 {
			t.Errorf("%s: tokens %v below zero", op.name, sp.TenantTokens)
		}
	}
}

func TestRunLedgerMirrorsFleet(t *testing.T) {
	c := standalone(t)
	ctx := context.Background()
	if err := c.HSet(ctx, keyRun("acme", "r1"), "pool", 10, "cutoff", time.Now().Add(time.Hour).UnixMicro(), "spent", 0).Err(); err != nil {
		t.Fatal(err)
	}
	v := fleet.NewRun(10, 0)
	succeeded := fleet.Final{Disposition: policy.DispositionSucceeded}
	budget := fleet.Final{Disposition: policy.DispositionDeadLetter, Stop: policy.StopBudgetExhausted}
	deduplicated := fleet.Final{Disposition: policy.DispositionSucceeded, Deduplicated: true}
	steps := []struct {
		call string
		f    fleet.Final
	}{
		{"a", succeeded}, {"a", succeeded}, {"b", budget}, {"b", succeeded}, {"a", budget},
		{"d", fleet.Final{Disposition: policy.DispositionDeadLetter}},
		{"e", fleet.Final{Disposition: policy.DispositionDeadLetter, Stop: policy.StopDeadline}},
		{"f", deduplicated}, {"f", deduplicated}, {"f", succeeded},
		{"g", deduplicated}, {"g", budget}, {"a", deduplicated},
	}
	for i, s := range steps {
		got, err := finalCall(ctx, lib{c: c}, "acme", "r1", s.call, s.f)
		_, want, _, refused := v.RecordFinal(s.call, s.f)
		switch {
		case refused != nil && (err == nil || err.Error() != refused.Error()):
			t.Errorf("step %d: redis %v, fleet refused %v", i, err, refused)
		case refused == nil && err != nil:
			t.Fatalf("step %d: %v", i, err)
		}
		if got != want {
			t.Errorf("step %d: redis changed %v, fleet %v", i, got, want)
		}
		h, err := c.HGetAll(ctx, keyRun("acme", "r1")).Result()
		if err != nil {
			t.Fatal(err)
		}
		var l policy.Ledger
		for j, p := range ledgerCounters(&l) {
			if s, ok := h[ledgerFields[j]]; ok {
				n, _ := toInt(s)
				*p = uint64(n)
			}
		}
		if l != v.Ledger {
			t.Errorf("step %d: redis ledger %+v, fleet %+v", i, l, v.Ledger)
		}
	}
	if _, err := finalCall(ctx, lib{c: c}, "acme", "nope", "a", succeeded); err == nil {
		t.Errorf("final of an unknown run = nil, want ErrNotFound")
	}
}

func TestRunPoolNeverOverspent(t *testing.T) {
	c := standalone(t)
	ctx := context.Background()
	if err := c.HSet(ctx, keyRun("acme", "r1"), "pool", 2, "cutoff", time.Now().Add(time.Hour).UnixMicro(), "spent", 0).Err(); err != nil {
		t.Fatal(err)
	}
	b := policy.TenantBudget{Capacity: 100, RetryCost: 1, TimeoutCost: 1}
	for i, want := range []policy.Spend{
		{Granted: true, RunRemaining: 1, HasRun: true},
		{Granted: true, RunRemaining: 0, HasRun: true},
		{Stop: policy.StopBudgetExhausted, Disposition: policy.DispositionDeadLetter, RunRemaining: 0, HasRun: true},
	} {
		_, got, _, err := spendCall(ctx, lib{c: c}, "acme", &b, false, "r1", &shareArgs{replica: "r"})
		if err != nil {
			t.Fatal(err)
		}
		got.TenantTokens = 0
		if got != want {
			t.Errorf("spend %d: %+v, want %+v", i, got, want)
		}
	}
	if err := c.HSet(ctx, keyRun("acme", "r2"), "pool", 2, "cutoff", 1, "spent", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, got, _, err := spendCall(ctx, lib{c: c}, "acme", &b, false, "r2", &shareArgs{replica: "r"})
	if err != nil || got.Stop != policy.StopDeadline || got.Disposition != policy.DispositionDeadlineCut {
		t.Errorf("spend past the cut-off: %+v %v, want DEADLINE DEADLINE_CUT", got, err)
	}
}
