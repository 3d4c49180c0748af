package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// resultRuns is results added one by one to an outcome group, as
// ApplyOutcomes adds a report's: the group's runs, each run's update the
// index in results of its first.
func resultRuns(results []result) []resultRun {
	var g outcomeGroup
	for i, r := range results {
		g.add(r, i)
	}
	return g.runs
}

func TestResultRuns(t *testing.T) {
	s, f := policy.ResultSuccess, policy.ResultTransientFailure
	tests := []struct {
		name    string
		results []result
		want    []resultRun
	}{
		{"none", nil, nil},
		{"equal results are one run", []result{{s, ""}, {s, ""}, {s, ""}}, []resultRun{{s, 3, "", 0}}},
		{"a new value starts a run", []result{{s, ""}, {f, ""}, {f, ""}, {s, ""}},
			[]resultRun{{s, 1, "", 0}, {f, 2, "", 1}, {s, 1, "", 3}}},
		{"a permit is a run of its own", []result{{s, ""}, {s, "p1"}, {s, "p1"}, {s, ""}, {s, ""}},
			[]resultRun{{s, 1, "", 0}, {s, 1, "p1", 1}, {s, 1, "p1", 2}, {s, 2, "", 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := resultRuns(tt.results); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("resultRuns(%v) = %v, want %v", tt.results, got, tt.want)
			}
		})
	}
}

// TestOutcomeRunsMirrorFleet applies random outcome batches through
// ApplyOutcomes (policyd_outcomes, results sent as runs) on a real server
// and through fleet.Breaker.Record one result at a time, at one fake
// clock, between random admits (probe permits), pushback cool-downs,
// forced states, resets and clock moves: the breakers' state, counters
// and window, the refusal of every update and the finals the run's
// ledger takes are the same both ways.
func TestOutcomeRunsMirrorFleet(t *testing.T) {
	configs := []policy.BreakerConfig{
		{ConsecutiveFailures: 3, Window: 10 * time.Second, Cooldown: 200 * time.Millisecond, HalfOpenProbes: 2, ProbeTimeout: 500 * time.Millisecond},
		{ConsecutiveFailures: 1, Window: time.Second, Cooldown: 50 * time.Millisecond, HalfOpenProbes: 1, ProbeTimeout: 100 * time.Millisecond},
		{Mode: policy.BreakerFailureRate, FailureRate: 0.3, MinCalls: 6, Window: 2 * time.Second, Cooldown: 300 * time.Millisecond, HalfOpenProbes: 3, ProbeTimeout: time.Second},
		{Mode: policy.BreakerFailureRate, FailureRate: 0.25, MinCalls: 20, Window: 5 * time.Second, Cooldown: 100 * time.Millisecond, HalfOpenProbes: 2, ProbeTimeout: 200 * time.Millisecond},
	}
	var seen coverage
	for ci, cfg := range configs {
		t.Run(fmt.Sprint("config ", ci), func(t *testing.T) { mirrorOutcomeRuns(t, uint64(ci), cfg, &seen) })
	}
	t.Logf("the scenarios saw %+v", seen)
	// What the scenarios must have gone through to test the runs' rules.
	if seen.midRunTrips == 0 || seen.probesSettled == 0 || seen.refused == 0 || seen.forcedCounts == 0 || seen.longRuns == 0 {
		t.Errorf("the scenarios saw %+v, want each at least once", seen)
	}
}

// coverage counts what random scenarios went through.
type coverage struct {
	longRuns      int // runs of 8 or more equal results without a permit in one call
	midRunTrips   int // a trip by a failure followed by more of its run
	probesSettled int // HALF_OPEN results with a live permit
	refused       int // results refused (fleet.ErrPermit)
	forcedCounts  int // results counted by a forced CLOSED breaker
}

func mirrorOutcomeRuns(t *testing.T, seed uint64, cfg policy.BreakerConfig, seen *coverage) {
	c := standalone(t)
	ctx := context.Background()
	var clockNs atomic.Int64
	clockNs.Store(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, clockNs.Load()) }
	s, err := Open(ctx, Options{Client: c, Timeout: 5 * time.Second, Clock: clock})
	if err != nil {
		t.Fatalf("Open = %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	run, err := s.OpenRun(policy.Run{Tenant: "acme", Pool: 10, Cutoff: clock().Add(24 * time.Hour)})
	if err != nil {
		t.Fatalf("OpenRun = %v", err)
	}
	norm := fleet.NormConfig(cfg)
	twins := []*twin{{t: t, key: policy.BreakerKey{Tenant: "acme", Target: "pay"}}, {t: t, key: policy.BreakerKey{Tenant: "acme", Target: "ship"}}}
	permits := make([][]string, len(twins)) // per twin: every permit handed out
	rng := rand.New(rand.NewPCG(seed, 13))
	nowUs := func() int64 { return clockNs.Load() / 1000 }
	var calls, taken uint64 // finals sent, finals fleet takes
	for step := range 400 {
		name := fmt.Sprint("step ", step)
		wi := rng.IntN(len(twins))
		w := twins[wi]
		switch r := rng.IntN(100); {
		case r < 12: // the clock moves: within the window, past a cool-down or a probe's timeout
			var d time.Duration
			switch rng.IntN(3) {
			case 0:
				d = time.Duration(rng.IntN(int(norm.Window/time.Microsecond)/4)) * time.Microsecond
			case 1:
				d = norm.Cooldown + time.Duration(rng.IntN(1000))*time.Microsecond
			default:
				d = norm.ProbeTimeout + time.Microsecond
			}
			clockNs.Add(int64(d))
		case r < 30: // admits: probe permits in HALF_OPEN
			for range 1 + rng.IntN(3) {
				id := newPermitID()
				now, got, st, err := admitCall(ctx, s.lib, w.key, &norm, id, 0)
				if err != nil {
					t.Fatalf("%s: admit: %v", name, err)
				}
				w.begin(now, &norm)
				want, _ := w.v.Admit(now*1000, &norm, func() fleet.PermitID { return id })
				if got != want {
					t.Fatalf("%s: redis admits %+v, fleet %+v", name, got, want)
				}
				if got.PermitID != "" {
					permits[wi] = append(permits[wi], got.PermitID)
				}
				w.check(name+" admit", now, st)
			}
		case r < 33: // a pushback cool-down
			until := clock().Add(time.Duration(rng.IntN(int(norm.Cooldown/time.Microsecond))) * time.Microsecond)
			now, _, st, err := cooldownCall(ctx, s.lib, w.key, &norm, until, 0)
			if err != nil {
				t.Fatalf("%s: cooldown: %v", name, err)
			}
			w.begin(now, &norm)
			w.v.ExtendCooldown(now*1000, until.UnixNano())
			w.check(name+" cooldown", now, st)
		case r < 37: // forced states, then a reset
			op, st := "force", []policy.BreakerState{policy.BreakerClosed, policy.BreakerOpen, policy.BreakerDisabled}[rng.IntN(3)]
			if w.v.Forced && rng.IntN(2) == 0 {
				op = "reset"
			}
			now, got, err := adminCall(ctx, s.lib, w.key, op, st, 0)
			if err != nil {
				t.Fatalf("%s: %s: %v", name, op, err)
			}
			if !w.created {
				w.v, w.created = fleet.NewBreaker(now*1000), true
			}
			if op == "reset" {
				w.v.Reset(now * 1000)
			} else {
				w.v.Force(now*1000, st)
			}
			w.check(name+" "+op, now, got)
		default: // a batch of outcomes over both breakers, in stretches of one result
			ups := randomOutcomes(rng, twins, permits, norm, run.ID, &calls)
			if n, err := s.ApplyOutcomes(ups, nil); err != nil || n != len(ups) {
				t.Fatalf("%s: ApplyOutcomes(%d updates) = %d, %v", name, len(ups), n, err)
			}
			now := nowUs()
			for _, w := range twins {
				// Only a breaker of the batch is loaded (and advanced).
				if slices.ContainsFunc(ups, func(u policy.OutcomeUpdate) bool { return u.Key == w.key }) {
					w.begin(now, &norm)
				}
			}
			for _, w := range twins {
				var rs []result
				for _, u := range ups {
					if u.Key == w.key {
						rs = append(rs, result{u.Result, u.PermitID})
					}
				}
				for _, r := range resultRuns(rs) {
					if r.permit == "" && r.n >= 8 {
						seen.longRuns++
					}
				}
			}
			for i := range ups {
				u := &ups[i]
				w := twins[0]
				if u.Key == twins[1].key {
					w = twins[1]
				}
				before := w.v
				_, ferr := w.v.Record(now*1000, &norm, u.Result, u.PermitID)
				switch {
				case ferr != nil:
					seen.refused++
				case before.State == policy.BreakerHalfOpen && u.PermitID != "" && u.Result != policy.ResultPushback:
					seen.probesSettled++
				case before.Forced && before.State == policy.BreakerClosed:
					seen.forcedCounts++
				case w.v.Generation != before.Generation && u.PermitID == "" && i+1 < len(ups) &&
					ups[i+1].Key == u.Key && ups[i+1].Result == u.Result && ups[i+1].PermitID == "":
					seen.midRunTrips++
				}
				if (u.Refused != nil) != (ferr != nil) {
					t.Fatalf("%s: update %d (%v on %s, permit %q): redis refused %v, fleet %v", name, i, u.Result, u.Key.Target, u.PermitID, u.Refused, ferr)
				}
				if ferr == nil && u.RunID != "" {
					taken++
				}
			}
			for _, w := range twins {
				w.compare(t, ctx, s, name, now)
			}
			r, err := s.Run(run.ID)
			if err != nil {
				t.Fatalf("%s: Run = %v", name, err)
			}
			if r.Ledger.Succeeded != taken {
				t.Fatalf("%s: the ledger took %d finals of %d, fleet %d", name, r.Ledger.Succeeded, calls, taken)
			}
		}
	}
}

// randomOutcomes returns a batch of stretches of equal results on the
// twins' breakers, interleaved, some with a permit (one handed out, used
// or not, or an invented one), some with a final of run.
func randomOutcomes(rng *rand.Rand, twins []*twin, permits [][]string, cfg policy.BreakerConfig, run string, calls *uint64) []policy.OutcomeUpdate {
	results := []policy.Result{policy.ResultSuccess, policy.ResultSuccess, policy.ResultSuccess,
		policy.ResultTransientFailure, policy.ResultTransientFailure, policy.ResultTerminal, policy.ResultPushback}
	var ups []policy.OutcomeUpdate
	for range 1 + rng.IntN(8) {
		wi := rng.IntN(len(twins))
		r := results[rng.IntN(len(results))]
		for range 1 + rng.IntN(12) {
			u := policy.OutcomeUpdate{Key: twins[wi].key, Breaker: cfg, Result: r}
			switch p := rng.IntN(10); {
			case p < 2 && len(permits[wi]) > 0:
				u.PermitID = permits[wi][rng.IntN(len(permits[wi]))]
			case p < 3:
				u.PermitID = newPermitID().String()
			}
			if rng.IntN(4) == 0 {
				*calls++
				u.RunID, u.CallID, u.Final = run, "call-"+strconv.FormatUint(*calls, 10), policy.DispositionSucceeded
			}
			ups = append(ups, u)
		}
	}
	return ups
}

// compare checks the breaker on the server against w's at now (Unix µs):
// its snapshot, and the fields it leaves out (HALF_OPEN successes, last
// failure, the window's slots).
func (w *twin) compare(t *testing.T, ctx context.Context, s *Store, name string, now int64) {
	t.Helper()
	if !w.created {
		return
	}
	st, err := readCall(ctx, s.lib, w.key)
	if err != nil {
		t.Fatalf("%s: read %s: %v", name, w.key.Target, err)
	}
	w.check(name+" "+w.key.Target, now, st)
	v, err := s.c.Get(ctx, keyBreaker(w.key.Tenant, w.key.Target)).Bytes()
	if err != nil {
		t.Fatalf("%s: GET: %v", name, err)
	}
	r, err := decodeBreakerRecord(v)
	if err != nil {
		t.Fatalf("%s: %s's record %v", name, w.key.Target, err)
	}
	type pair struct {
		what      string
		got, want int64
	}
	pairs := []pair{
		{"half_open_ok", r.field("half_open_ok"), int64(w.v.HalfOpenOK)},
		{"last_failure", r.field("last_failure"), w.v.LastFailure / 1000},
		{"slot_width", r.field("slot_width"), w.v.SlotWidth / 1000},
	}
	for i, sl := range w.v.Slots {
		n := r.n[len(breakerFields)+3*i:]
		pairs = append(pairs, pair{fmt.Sprintf("slot %d epoch", i), n[0], sl.Epoch},
			pair{fmt.Sprintf("slot %d calls", i), n[1], int64(sl.Calls)},
			pair{fmt.Sprintf("slot %d failures", i), n[2], int64(sl.Failures)})
	}
	for _, p := range pairs {
		if p.got != p.want {
			t.Errorf("%s: %s's %s: redis %d, fleet %d", name, w.key.Target, p.what, p.got, p.want)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}
