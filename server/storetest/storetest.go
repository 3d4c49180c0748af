package storetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// Clock is the suite's fake clock: it moves only when the suite advances
// it. An engine under test tells time by it. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock stopped at a fixed instant.
func NewClock() *Clock {
	return &Clock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock d later.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Engine is one test's engine under test, as Open starts it.
type Engine struct {
	// Store is the engine over fresh, empty state that no other test sees.
	Store server.Store
	// Restart stops Store the way a crash would (nothing more is flushed;
	// the store is not used again) and returns a store over what
	// survived, as a process started after the crash would see it, telling
	// time by the same clock.
	Restart func() server.Store
	// Replica, when set, returns another replica over the same fleet
	// state (another process sharing the engine), telling time by the same
	// clock; whatever it starts ends with the test. Nil for an embedded
	// engine: Store then stands for every replica.
	Replica func() server.Store
	// Adaptive says the engine keeps adaptive concurrency ceilings
	// (server.Leases with FlowLimits.Adaptive set: fleet.AdaptiveLimit's
	// rules applied by AdmitFlow and ReleaseLease, its value and decreases
	// in Pool). The behaviour "adaptive" runs only when it is set and is
	// skipped otherwise: an engine sets it once it holds them.
	Adaptive bool
	// Settle, when set, sends on what the engine's stores hold of reported
	// outcomes for a later flush (counters and deposits: the results of
	// ApplyOutcomes without a probe permit, its deposits and attempt
	// tallies, and the call-table note and attempt tally of a NextDelay
	// decided in one step, which reach the engine, and so every replica,
	// within one flush interval) and returns once every replica reads
	// them. Nil for an engine that applies every outcome before
	// ApplyOutcomes returns. The suite calls it only right before it
	// reads what those changed.
	Settle func()
}

// Open starts the engine under test for one test, telling time by clock;
// whatever it starts ends when the test does (t.Cleanup).
type Open func(t *testing.T, clock *Clock) Engine

// replicas is how many replicas the behaviours across replicas spread
// their calls over.
const replicas = 3

// Run runs the contract suite against the engine open starts, one subtest
// per behaviour (see the package doc), each with an engine of its own.
func Run(t *testing.T, open Open) {
	tests := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"probes", testProbes},
		{"budgets", testBudgets},
		{"cooldown", testCooldown},
		{"transitions", testTransitions},
		{"order", testOrder},
		{"final", testFinal},
		{"durability", testDurability},
		{"subscriptions", testSubscriptions},
		{"attempts", testAttempts},
		{"duplicates", testDuplicates},
		{"permits", testPermits},
		{"replicas", testReplicas},
		{"escalation", testEscalation},
		{"leases", testLeases},
		{"rate", testRate},
		{"ceilings", testAdaptiveCeiling},
		{"adaptive", testAdaptive},
		{"attempt stats", testAttemptStats},
		{"nextdelays", testNextDelays},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewClock()
			en := open(t, c)
			if (tt.name == "adaptive" || tt.name == "ceilings") && !en.Adaptive {
				t.Skip("the engine does not keep adaptive ceilings (Engine.Adaptive is false)")
			}
			e := &env{clock: c, s: en.Store, restart: en.Restart, adaptive: en.Adaptive, held: en.Settle}
			e.replicas = []server.Store{en.Store}
			for len(e.replicas) < replicas {
				r := en.Store
				if en.Replica != nil {
					r = en.Replica()
				}
				e.replicas = append(e.replicas, r)
			}
			tt.run(t, e)
		})
	}
}

// env is one subtest's engine.
type env struct {
	clock    *Clock
	s        server.Store
	restart  func() server.Store
	replicas []server.Store // s first; s every time for an embedded engine
	adaptive bool           // Engine.Adaptive
	held     func()         // Engine.Settle, nil for an engine that holds no outcomes
}

// settle returns once every replica reads the counters of the outcomes
// reported so far (Engine.Settle); at once for an engine that holds none.
// A case calls it only right before it reads such counters.
func (e *env) settle() {
	if e.held != nil {
		e.held()
	}
}

// on returns the replica the i-th worker calls.
func (e *env) on(i int) server.Store { return e.replicas[i%len(e.replicas)] }

// workers is how many goroutines race in the concurrent behaviours.
const workers = 64

// breaker is the breaker configuration of the suite: CONSECUTIVE, 3 probes.
var breaker = policy.BreakerConfig{
	Mode:                policy.BreakerConsecutive,
	ConsecutiveFailures: 5,
	Cooldown:            30 * time.Second,
	HalfOpenProbes:      3,
	ProbeTimeout:        10 * time.Second,
}

// race runs fn(i) on n goroutines released together and waits for them.
func race(n int, fn func(i int)) {
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range n {
		done.Go(func() {
			start.Wait()
			fn(i)
		})
	}
	start.Done()
	done.Wait()
}

// record tells the breaker under key one result through a batch, as
// NextDelay does.
func (e *env) record(key policy.BreakerKey, r policy.Result, permit string) (policy.BreakerSnapshot, error) {
	return e.recordOn(e.s, key, r, permit)
}

// recordOn is record through replica s.
func (e *env) recordOn(s server.Store, key policy.BreakerKey, r policy.Result, permit string) (policy.BreakerSnapshot, error) {
	u := s.Begin()
	snap, err := u.Record(key, breaker, r, permit)
	if err != nil {
		return snap, err
	}
	return snap, u.Commit()
}

// trip records transient failures until the breaker under key is OPEN.
func (e *env) trip(t *testing.T, key policy.BreakerKey) policy.BreakerSnapshot {
	t.Helper()
	var snap policy.BreakerSnapshot
	for range breaker.ConsecutiveFailures {
		var err error
		if snap, err = e.record(key, policy.ResultTransientFailure, ""); err != nil {
			t.Fatalf("Record(%v, transient failure) = %v, want nil", key, err)
		}
	}
	if snap.State != policy.BreakerOpen {
		t.Fatalf("after %d failures: %v is %v, want OPEN", breaker.ConsecutiveFailures, key, snap.State)
	}
	return snap
}

// halfOpen trips the breakers under keys, lets their cool-down pass and
// takes every probe permit of each, returned in the order of keys.
func (e *env) halfOpen(t *testing.T, keys ...policy.BreakerKey) [][]string {
	t.Helper()
	for _, key := range keys {
		e.trip(t, key)
	}
	e.clock.Advance(breaker.Cooldown)
	permits := make([][]string, len(keys))
	for i, key := range keys {
		for range breaker.HalfOpenProbes {
			a := e.admit(t, key)
			if !a.Admitted || a.State != policy.BreakerHalfOpen || a.PermitID == "" {
				t.Fatalf("Admit(%v) after the cool-down = %+v, want a HALF_OPEN probe permit", key, a)
			}
			permits[i] = append(permits[i], a.PermitID)
		}
	}
	return permits
}

func (e *env) admit(t *testing.T, key policy.BreakerKey) policy.Admission {
	t.Helper()
	a, err := e.s.Admit(key, breaker)
	if err != nil {
		t.Fatalf("Admit(%v) = %v, want nil", key, err)
	}
	return a
}

func (e *env) snapshot(t *testing.T, key policy.BreakerKey) policy.BreakerSnapshot {
	t.Helper()
	snap, err := e.s.Breaker(key)
	if err != nil {
		t.Fatalf("Breaker(%v) = %v, want nil", key, err)
	}
	return snap
}

// failedPrecondition reports whether err has the class the server answers
// FAILED_PRECONDITION.
func failedPrecondition(err error) bool {
	var p interface{ FailedPrecondition() bool }
	return errors.As(err, &p) && p.FailedPrecondition()
}

// notFound reports whether err has the class the server answers NOT_FOUND.
func notFound(err error) bool {
	var n interface{ NotFound() bool }
	return errors.As(err, &n) && n.NotFound()
}

// testProbes: in HALF_OPEN exactly HalfOpenProbes of 64 concurrent Admits,
// spread over the replicas, are let through, each with a permit of its
// own; the rest are refused with the time to ask again.
func testProbes(t *testing.T, e *env) {
	key := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	e.trip(t, key)
	e.clock.Advance(breaker.Cooldown)
	var (
		mu      sync.Mutex
		permits = map[string]int{}
		refused []policy.Admission
	)
	race(workers, func(i int) {
		a, err := e.on(i).Admit(key, breaker)
		if err != nil {
			t.Errorf("Admit = %v, want nil", err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if a.Admitted {
			permits[a.PermitID]++
		} else {
			refused = append(refused, a)
		}
	})
	admitted := 0
	for id, n := range permits {
		admitted += n
		if id == "" || n != 1 {
			t.Errorf("permit %q handed out %d times, want a non-empty id handed out once", id, n)
		}
	}
	if admitted != breaker.HalfOpenProbes || len(refused) != workers-breaker.HalfOpenProbes {
		t.Fatalf("of %d concurrent Admits in HALF_OPEN: got %d admitted, %d refused; want %d admitted",
			workers, admitted, len(refused), breaker.HalfOpenProbes)
	}
	for _, a := range refused {
		if a.State != policy.BreakerHalfOpen || a.Reason != fleet.ReasonProbesTaken ||
			a.RetryAfter <= 0 || a.RetryAfter > breaker.ProbeTimeout {
			t.Errorf("a refused probe: got %+v, want HALF_OPEN, %q, ask again within %v",
				a, fleet.ReasonProbesTaken, breaker.ProbeTimeout)
			break
		}
	}
	if got := e.snapshot(t, key); got.State != policy.BreakerHalfOpen || got.ProbesInFlight != breaker.HalfOpenProbes {
		t.Errorf("after the probes: got %v with %d in flight, want HALF_OPEN with %d",
			got.State, got.ProbesInFlight, breaker.HalfOpenProbes)
	}
}

// testBudgets: concurrent spends (with and without a run, some of them
// timeouts), deposits and clock moves, spread over the replicas, never spend more from a tenant's
// bucket than its capacity, its deposits and its refill allow, never take
// it below zero, and never spend a run's pool past its size; every granted
// run spend is counted in the run.
func testBudgets(t *testing.T, e *env) {
	budget := policy.TenantBudget{Tenant: "acme", Capacity: 20, DepositRatio: 0.5, MinPerSecond: 2, RetryCost: 1, TimeoutCost: 2}
	if _, err := e.s.SetBudget(budget); err != nil {
		t.Fatalf("SetBudget = %v, want nil", err)
	}
	e.everywhere(t, "the budget", func(r server.Store) bool {
		st, err := r.Budget("acme")
		return err == nil && !st.IsDefault && st.Budget.Capacity == budget.Capacity
	})
	start := e.clock.Now()
	for seed := range uint64(4) {
		const pool = 60
		run, err := e.s.OpenRun(policy.Run{Tenant: "acme", Pool: pool, Cutoff: start.Add(24 * time.Hour)})
		if err != nil {
			t.Fatalf("OpenRun = %v, want nil", err)
		}
		before, err := e.s.Budget("acme")
		if err != nil {
			t.Fatalf("Budget = %v, want nil", err)
		}
		from := e.clock.Now()
		var (
			mu                 sync.Mutex
			grantedRun, denied int
			spentCost          float64
			deposits           atomic.Int64
		)
		race(16, func(g int) {
			rng := rand.New(rand.NewPCG(seed, uint64(g)))
			for range 300 {
				switch p := rng.IntN(100); {
				case p < 60:
					req := policy.SpendRequest{Tenant: "acme", Timeout: rng.IntN(3) == 0}
					if rng.IntN(2) == 0 {
						req.RunID = run.ID
					}
					u := e.on(g).Begin()
					sp, err := u.SpendRetry(req)
					if err == nil {
						err = u.Commit()
					}
					if err != nil {
						t.Errorf("SpendRetry = %v, want nil", err)
						return
					}
					if sp.TenantTokens < 0 {
						t.Errorf("seed %d: tokens went below zero: %v", seed, sp.TenantTokens)
					}
					mu.Lock()
					switch {
					case sp.Granted && req.Timeout:
						spentCost += budget.TimeoutCost
					case sp.Granted:
						spentCost += budget.RetryCost
					default:
						denied++
					}
					if sp.Granted && req.RunID != "" {
						grantedRun++
					}
					mu.Unlock()
				case p < 85:
					n := 1 + rng.IntN(3)
					deposits.Add(int64(n))
					e.on(g).Deposit("acme", n)
				default:
					e.clock.Advance(time.Duration(rng.IntN(200)) * time.Millisecond)
				}
			}
		})
		r, err := e.s.Run(run.ID)
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
		if r.Spent > pool || r.Spent != uint64(grantedRun) {
			t.Errorf("seed %d: run spent %d, granted %d, pool %d; want spent == granted <= pool", seed, r.Spent, grantedRun, pool)
		}
		after, err := e.s.Budget("acme")
		if err != nil {
			t.Fatalf("Budget = %v, want nil", err)
		}
		elapsed := e.clock.Now().Sub(from).Seconds()
		bound := before.Tokens + budget.DepositRatio*float64(deposits.Load()) + budget.MinPerSecond*elapsed
		if after.Tokens < 0 || spentCost > bound+1e-6 {
			t.Errorf("seed %d: tokens %v, spent %v; want tokens >= 0 and spent <= %v (tokens before + deposits + refill)",
				seed, after.Tokens, spentCost, bound)
		}
		if denied == 0 {
			t.Logf("seed %d never exhausted the budget; the bound was not exercised", seed)
		}
	}
}

// testCooldown: a cool-down only moves later, one extension at a time and
// under concurrent ones, and holds Admit off until it ends.
func testCooldown(t *testing.T, e *env) {
	key := policy.BreakerKey{Tenant: "acme", Target: "rate-limited"}
	now := e.clock.Now()
	extend := func(until time.Time) time.Time {
		t.Helper()
		u := e.s.Begin()
		got, err := u.ExtendCooldown(key, breaker, until)
		if err == nil {
			err = u.Commit()
		}
		if err != nil {
			t.Fatalf("ExtendCooldown(%v) = %v, want nil", until, err)
		}
		return got
	}
	steps := []struct {
		name  string
		until time.Duration
		want  time.Duration
	}{
		{"sets it", 10 * time.Second, 10 * time.Second},
		{"an earlier end is ignored", 3 * time.Second, 10 * time.Second},
		{"the same end changes nothing", 10 * time.Second, 10 * time.Second},
		{"a later end extends it", 20 * time.Second, 20 * time.Second},
	}
	for _, st := range steps {
		if got := extend(now.Add(st.until)); !got.Equal(now.Add(st.want)) {
			t.Errorf("%s: ExtendCooldown(+%v) = %v, want +%v", st.name, st.until, got.Sub(now), st.want)
		}
	}

	var mu sync.Mutex
	latest := now.Add(20 * time.Second)
	race(workers, func(i int) {
		until := now.Add(time.Duration(1+rand.N(120)) * time.Second)
		u := e.s.Begin()
		got, err := u.ExtendCooldown(key, breaker, until)
		if err == nil {
			err = u.Commit()
		}
		if err != nil {
			t.Errorf("ExtendCooldown = %v, want nil", err)
			return
		}
		if got.Before(until) || got.Before(now.Add(20*time.Second)) {
			t.Errorf("ExtendCooldown(+%v) = +%v: the cool-down in force ends before one asked for", until.Sub(now), got.Sub(now))
		}
		mu.Lock()
		if until.After(latest) {
			latest = until
		}
		mu.Unlock()
	})
	if got := e.snapshot(t, key).CooldownUntil; !got.Equal(latest) {
		t.Errorf("after %d concurrent extensions: cool-down until +%v, want the latest asked, +%v", workers, got.Sub(now), latest.Sub(now))
	}
	e.clock.Advance(time.Second)
	if a := e.admit(t, key); a.Admitted || a.Reason != fleet.ReasonPushback || a.RetryAfter != latest.Sub(e.clock.Now()) {
		t.Errorf("Admit during the cool-down = %+v, want refused %q for %v", a, fleet.ReasonPushback, latest.Sub(e.clock.Now()))
	}
	e.clock.Advance(latest.Sub(e.clock.Now()))
	if a := e.admit(t, key); !a.Admitted {
		t.Errorf("Admit when the cool-down ends = %+v, want admitted", a)
	}
}

// testTransitions: a transition happens once per generation: 64 workers
// failing at once open the breaker once; 64 Admits after the cool-down
// move it to HALF_OPEN once; probes failing at once reopen it once, the
// calls spread over the replicas. Each shows as one generation more and one
// event.
func testTransitions(t *testing.T, e *env) {
	key := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	w := subscribe(t, e.s, "acme")
	race(workers, func(i int) {
		for range 10 {
			if _, err := e.recordOn(e.on(i), key, policy.ResultTransientFailure, ""); err != nil {
				t.Errorf("Record = %v, want nil", err)
				return
			}
		}
	})
	wantGeneration(t, e, w, key, 1, policy.BreakerOpen)

	e.clock.Advance(breaker.Cooldown)
	var mu sync.Mutex
	var permits []string
	race(workers, func(i int) {
		a, err := e.on(i).Admit(key, breaker)
		if err != nil {
			t.Errorf("Admit = %v, want nil", err)
			return
		}
		if a.Admitted {
			mu.Lock()
			permits = append(permits, a.PermitID)
			mu.Unlock()
		}
	})
	wantGeneration(t, e, w, key, 2, policy.BreakerHalfOpen)

	race(len(permits), func(i int) {
		// The first failure reopens the breaker; the others carry permits
		// of a generation that has ended, and may be refused for it.
		if _, err := e.recordOn(e.on(i), key, policy.ResultTransientFailure, permits[i]); err != nil && !failedPrecondition(err) {
			t.Errorf("Record(probe failure) = %v, want nil or a precondition failure", err)
		}
	})
	wantGeneration(t, e, w, key, 3, policy.BreakerOpen)
}

// wantGeneration checks that the breaker under key is in generation gen
// and state st, and that w got exactly one event per generation up to gen,
// the last in state st.
func wantGeneration(t *testing.T, e *env, w *watch, key policy.BreakerKey, gen uint64, st policy.BreakerState) {
	t.Helper()
	if got := e.snapshot(t, key); got.Generation != gen || got.State != st {
		t.Fatalf("breaker: generation %d %v, want generation %d %v", got.Generation, got.State, gen, st)
	}
	var seen []policy.BreakerSnapshot
	for _, snap := range w.until(t, key, gen) {
		if n := len(seen); n == 0 || seen[n-1].Generation != snap.Generation {
			seen = append(seen, snap)
		}
	}
	if n := len(seen); n == 0 || seen[n-1].Generation != gen || seen[n-1].State != st || (n > 1 && seen[n-2].Generation != gen-1) {
		t.Fatalf("events up to generation %d: got %s, want one per generation, the last %v", gen, generations(seen), st)
	}
}

// generations prints snapshots as generation:state.
func generations(snaps []policy.BreakerSnapshot) string {
	var b strings.Builder
	for _, s := range snaps {
		fmt.Fprintf(&b, " %d:%v", s.Generation, s.State)
	}
	return "[" + strings.TrimSpace(b.String()) + "]"
}

// testFinal: a call's final disposition counts once in its run's ledger,
// whether one report repeats or many race (from every replica), and the
// first final disposition
// of a call id wins: a later different one is refused (a precondition
// failure naming final_disposition and the disposition in force, also as
// an outcome batch's refused item) and leaves the ledger unchanged.
func testFinal(t *testing.T, e *env) {
	run, err := e.s.OpenRun(policy.Run{Tenant: "acme", Pool: 10, Cutoff: e.clock.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("OpenRun = %v, want nil", err)
	}
	finals := []fleet.Final{
		{Disposition: policy.DispositionSucceeded},
		{Disposition: policy.DispositionDeadLetter, Stop: policy.StopAttemptsExhausted},
		{Disposition: policy.DispositionFailedTerminal, Stop: policy.StopTerminal},
		{Disposition: policy.DispositionCircuitOpen, Stop: policy.StopCircuitOpen},
	}
	var (
		mu      sync.Mutex
		kept    = map[fleet.Final]int{} // reports of the contested call taken
		refused = map[fleet.Final]int{}
	)
	race(workers, func(i int) {
		// Seven calls get the same report eight times each; one gets every
		// disposition at once, twice each.
		call, f := fmt.Sprint("call-", i%8), finals[0]
		if i%8 == 0 {
			call, f = "contested", finals[(i/8)%len(finals)]
		}
		var err error
		if i%2 == 0 {
			err = e.on(i/2).RecordFinal(run.ID, call, f.Disposition, f.Stop)
		} else {
			ups := []policy.OutcomeUpdate{{RunID: run.ID, CallID: call, Final: f.Disposition, Stop: f.Stop}}
			if _, err = e.on(i/2).ApplyOutcomes(ups, nil); err == nil {
				err = ups[0].Refused
			}
		}
		switch {
		case call != "contested" && err != nil:
			t.Errorf("final %+v of %s = %v, want nil", f, call, err)
		case call != "contested":
		case err == nil:
			mu.Lock()
			kept[f]++
			mu.Unlock()
		case failedPrecondition(err) && strings.Contains(err.Error(), "final_disposition") &&
			strings.Contains(err.Error(), "already final as"):
			mu.Lock()
			refused[f]++
			mu.Unlock()
		default:
			t.Errorf("final %+v of the contested call = %v, want nil or a precondition failure naming final_disposition", f, err)
		}
	})
	r, err := e.s.Run(run.ID)
	if err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	l := r.Ledger
	total := l.Succeeded + l.FailedTerminal + l.DeadLetterExhausted + l.DeadLetterBudget + l.DeadLetterNotIdempotent +
		l.DeadLetterPushback + l.CircuitOpen + l.DeadlineCut
	if total != 8 || l.Succeeded < 7 {
		t.Errorf("ledger of 8 calls, 7 reported SUCCEEDED 8 times each and one 8 ways at once: got %+v (%d counted), want each call once", l, total)
	}
	if len(kept) != 1 {
		t.Fatalf("the contested call's reports taken: %v, want those of one disposition only (the first wins)", kept)
	}
	var first fleet.Final
	for f := range kept {
		first = f
	}
	if refused[first] != 0 || len(refused) != len(finals)-1 {
		t.Errorf("the contested call: refused %v with %+v kept, want every other disposition refused", refused, first)
	}

	// Once final, a call's disposition stays: a later different one is
	// refused naming the one in force, the same one is taken again.
	before := l
	for i, f := range finals[1:] {
		err := e.s.RecordFinal(run.ID, "call-1", f.Disposition, f.Stop)
		if !failedPrecondition(err) || !strings.Contains(err.Error(), "final_disposition") ||
			!strings.Contains(err.Error(), "already final as SUCCEEDED") {
			t.Errorf("RecordFinal(%+v) of a SUCCEEDED call = %v, want a precondition failure naming final_disposition, already final as SUCCEEDED", f, err)
		}
		ups := []policy.OutcomeUpdate{{RunID: run.ID, CallID: "call-1", Final: f.Disposition, Stop: f.Stop},
			{RunID: run.ID, CallID: fmt.Sprint("late-", i), Final: f.Disposition, Stop: f.Stop}}
		n, err := e.s.ApplyOutcomes(ups, nil)
		if err != nil || n != 2 || !failedPrecondition(ups[0].Refused) || ups[1].Refused != nil {
			t.Errorf("ApplyOutcomes(%+v of a SUCCEEDED call, then a new call) = %d, %v, refused %v and %v; want 2, nil, the first refused",
				f, n, err, ups[0].Refused, ups[1].Refused)
		}
	}
	if err := e.s.RecordFinal(run.ID, "call-1", policy.DispositionSucceeded, policy.StopNone); err != nil {
		t.Errorf("RecordFinal of the same disposition again = %v, want nil", err)
	}
	r, err = e.s.Run(run.ID)
	if err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	want := before
	want.DeadLetterExhausted++
	want.FailedTerminal++
	want.CircuitOpen++
	if r.Ledger != want {
		t.Errorf("after refused reports and three new calls: ledger %+v, want %+v (only the new calls counted)", r.Ledger, want)
	}
}

// testDurability: admin writes and breaker transitions are durable before
// they return: a crash right after them loses none.
func testDurability(t *testing.T, e *env) {
	s := e.s
	p := policy.Default()
	p.MaxAttempts = 7
	gone := policy.Default()
	gone.MaxAttempts = 2
	budget := policy.TenantBudget{Tenant: "acme", Capacity: 42, DepositRatio: 0.2, MinPerSecond: 1, RetryCost: 1, TimeoutCost: 1}
	k := func(target string) policy.BreakerKey { return policy.BreakerKey{Tenant: "acme", Target: target} }
	var tripped policy.BreakerSnapshot
	steps := []struct {
		name string
		do   func() error
	}{
		{"SetPolicy", func() error { _, err := s.SetPolicy("acme", "payments", p); return err }},
		{"SetPolicy of a scope to delete", func() error { _, err := s.SetPolicy("acme", "", gone); return err }},
		{"DeletePolicy", func() error { return s.DeletePolicy("acme", "") }},
		{"SetBudget", func() error { _, err := s.SetBudget(budget); return err }},
		{"SetBudget of a tenant to delete", func() error {
			b := budget
			b.Tenant = "beta"
			_, err := s.SetBudget(b)
			return err
		}},
		{"DeleteBudget", func() error { return s.DeleteBudget("beta") }},
		{"OpenRun", func() error {
			_, err := s.OpenRun(policy.Run{ID: "batch-1", Tenant: "acme", Pool: 9, Cutoff: e.clock.Now().Add(time.Hour)})
			return err
		}},
		{"ForceBreaker OPEN", func() error { _, err := s.ForceBreaker(k("forced-open"), policy.BreakerOpen); return err }},
		{"ForceBreaker DISABLED", func() error { _, err := s.ForceBreaker(k("disabled"), policy.BreakerDisabled); return err }},
		{"ForceBreaker then ResetBreaker", func() error {
			if _, err := s.ForceBreaker(k("reset"), policy.BreakerOpen); err != nil {
				return err
			}
			_, err := s.ResetBreaker(k("reset"))
			return err
		}},
		{"a move to HALF_OPEN", func() error { e.halfOpen(t, k("probing")); return nil }},
		{"a trip", func() error { tripped = e.trip(t, k("tripped")); return nil }},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s = %v, want nil", st.name, err)
		}
	}
	s = e.restart()

	if got, err := s.Policy("acme", "payments"); err != nil || got.Policy.MaxAttempts != 7 {
		t.Errorf("after a crash: Policy(acme/payments) = max attempts %d, %v; want 7", got.Policy.MaxAttempts, err)
	}
	if _, err := s.Policy("acme", ""); !notFound(err) {
		t.Errorf("after a crash: Policy of the deleted scope = %v, want not found", err)
	}
	if got, err := s.Budget("acme"); err != nil || got.IsDefault || got.Budget.Capacity != 42 {
		t.Errorf("after a crash: Budget(acme) = %+v, %v; want the explicit budget of capacity 42", got, err)
	}
	if got, err := s.Budget("beta"); !notFound(err) && (err != nil || !got.IsDefault) {
		t.Errorf("after a crash: Budget of the deleted budget = %+v, %v; want not found or the default", got, err)
	}
	if got, err := s.Run("batch-1"); err != nil || got.Pool != 9 || got.Tenant != "acme" {
		t.Errorf("after a crash: Run(batch-1) = %+v, %v; want acme's run of pool 9", got, err)
	}
	e.s = s
	for _, want := range []struct {
		target string
		state  policy.BreakerState
		forced bool
	}{
		{"forced-open", policy.BreakerOpen, true},
		{"disabled", policy.BreakerDisabled, true},
		{"reset", policy.BreakerClosed, false},
		{"tripped", policy.BreakerOpen, false},
		{"probing", policy.BreakerHalfOpen, false},
	} {
		if got := e.snapshot(t, k(want.target)); got.State != want.state || got.Forced != want.forced {
			t.Errorf("after a crash: breaker %s is %v (forced %v), want %v (forced %v)", want.target, got.State, got.Forced, want.state, want.forced)
		}
	}
	if got := e.snapshot(t, k("tripped")); !got.OpenUntil.Equal(tripped.OpenUntil) || got.Generation != tripped.Generation {
		t.Errorf("after a crash: tripped breaker open until %v in generation %d, want %v in %d",
			got.OpenUntil, got.Generation, tripped.OpenUntil, tripped.Generation)
	}
	if a := e.admit(t, k("tripped")); a.Admitted || a.Reason != fleet.ReasonOpen {
		t.Errorf("after a crash: Admit of the tripped breaker = %+v, want refused %q", a, fleet.ReasonOpen)
	}
}

// testEscalation: a run's call table keeps the target a call ended on with
// its primary (a note naming a target sets both, so a call back on its
// primary has none), on every replica; an audit record keeps its primary
// target and one without it reads back without it.
func testEscalation(t *testing.T, e *env) {
	run, err := e.s.OpenRun(policy.Run{Tenant: "acme", Pool: 10, Cutoff: e.clock.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("OpenRun = %v, want nil", err)
	}
	now := e.clock.Now()
	notes := []struct {
		call string
		n    policy.CallNote
	}{
		{"moved", policy.CallNote{Target: "geo-a", Attempt: 1, Time: now}},
		{"moved", policy.CallNote{Target: "geo-b", PrimaryTarget: "geo-a", Attempt: 2, Time: now}},
		{"moved", policy.CallNote{Attempt: 2, Disposition: policy.DispositionSucceeded, Time: now}},
		{"back", policy.CallNote{Target: "geo-b", PrimaryTarget: "geo-a", Attempt: 1, Time: now}},
		{"back", policy.CallNote{Target: "geo-a", Attempt: 2, Time: now}},
		{"stayed", policy.CallNote{Target: "geo-a", Attempt: 1, Time: now}},
	}
	for i, n := range notes {
		if err := e.on(i).NoteCall(run.ID, n.call, n.n); err != nil {
			t.Fatalf("NoteCall(%s, %+v) = %v, want nil", n.call, n.n, err)
		}
	}
	want := "[back geo-a/ moved geo-b/geo-a stayed geo-a/]"
	e.everywhere(t, "the call table's targets "+want, func(s server.Store) bool {
		calls, _, err := s.RunCalls(run.ID, policy.RunCallFilter{}, "", 0)
		var got []string
		for _, c := range calls {
			got = append(got, c.CallID+" "+c.Target+"/"+c.PrimaryTarget)
		}
		return err == nil && fmt.Sprint(got) == want
	})

	e.s.AppendAudit(
		policy.AuditRecord{Event: policy.AuditDecision, Tenant: "acme", Target: "geo-b", PrimaryTarget: "geo-a", CallID: "esc-1", Attempt: 2},
		policy.AuditRecord{Event: policy.AuditDecision, Tenant: "acme", Target: "geo-a", CallID: "esc-1", Attempt: 1},
	)
	var got []string
	eventually(t, "the audit records of esc-1", func() bool {
		recs, _, err := e.s.QueryAudit(policy.AuditQuery{CallID: "esc-1", Tenant: "acme"})
		got = got[:0]
		for _, r := range recs {
			got = append(got, fmt.Sprintf("%d %s/%s", r.Attempt, r.Target, r.PrimaryTarget))
		}
		return err == nil && len(recs) == 2
	})
	if fmt.Sprint(got) != "[2 geo-b/geo-a 1 geo-a/]" {
		t.Errorf("audit records (attempt target/primary): got %v, want [2 geo-b/geo-a 1 geo-a/]", got)
	}

	// A RETRY to a fallback replays with its target, on every replica.
	k := policy.CallKey{Tenant: "acme", CallID: "esc-2"}
	ans := policy.Answer{Retry: true, Delay: time.Second, Category: policy.CategoryTransient, Class: "transient:503",
		Breaker: policy.BreakerClosed, Target: "geo-b"}
	if _, replay, err := e.s.ClaimAttempt(k, 1); replay || err != nil {
		t.Fatalf("ClaimAttempt(esc-2, 1) = replay %v, %v; want a fresh decision", replay, err)
	}
	u := e.s.Begin()
	if err := u.RecordAttempt(k, 1, ans, e.clock.Now().Add(time.Hour)); err != nil {
		t.Fatalf("RecordAttempt = %v, want nil", err)
	}
	if err := u.Commit(); err != nil {
		t.Fatalf("Commit = %v, want nil", err)
	}
	for i := range e.replicas {
		if got, replay, err := e.on(i).ClaimAttempt(k, 1); err != nil || !replay || got.Target != "geo-b" {
			t.Errorf("replica %d: ClaimAttempt(esc-2, 1) again = %+v, replay %v, %v; want the RETRY to geo-b replayed", i, got, replay, err)
		}
	}
}

// testSubscriptions: a subscriber gets every transition of its tenant's
// breakers in the order they happened, and none of another tenant's.
func testSubscriptions(t *testing.T, e *env) {
	key := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	other := policy.BreakerKey{Tenant: "beta", Target: "payments"}
	e.admit(t, key) // a breaker before the subscription shows in its snapshot
	w, initial := subscribeSnapshot(t, e.s, "acme")
	if len(initial) != 1 || initial[0].Key != key || initial[0].State != policy.BreakerClosed {
		t.Fatalf("snapshot: got %+v, want acme/payments CLOSED", initial)
	}
	wo := subscribe(t, e.s, "beta")

	mustSnap := func(what string, _ policy.BreakerSnapshot, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s = %v, want nil", what, err)
		}
	}
	e.trip(t, key)
	e.clock.Advance(breaker.Cooldown)
	permits := make([]string, breaker.HalfOpenProbes)
	for i := range permits {
		permits[i] = e.admit(t, key).PermitID
	}
	for _, p := range permits {
		snap, err := e.record(key, policy.ResultSuccess, p)
		mustSnap("Record(probe success)", snap, err)
	}
	snap, err := e.s.ForceBreaker(key, policy.BreakerOpen)
	mustSnap("ForceBreaker(OPEN)", snap, err)
	e.trip(t, other)
	snap, err = e.s.ResetBreaker(key)
	mustSnap("ResetBreaker", snap, err)
	snap, err = e.s.ForceBreaker(key, policy.BreakerDisabled)
	mustSnap("ForceBreaker(DISABLED)", snap, err)

	want := []policy.BreakerState{policy.BreakerOpen, policy.BreakerHalfOpen, policy.BreakerClosed,
		policy.BreakerOpen, policy.BreakerClosed, policy.BreakerDisabled}
	last := e.snapshot(t, key).Generation
	var got []policy.BreakerSnapshot
	for _, s := range w.until(t, key, last) {
		if n := len(got); n == 0 || got[n-1].Generation != s.Generation {
			got = append(got, s)
		}
	}
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].State == want[i] && (i == 0 || got[i].Generation == got[i-1].Generation+1)
	}
	if !ok {
		t.Errorf("acme's subscriber saw %s, want %v, one generation each, in order", generations(got), want)
	}
	if ev := w.stray; len(ev) > 0 {
		t.Errorf("acme's subscriber saw another tenant's breaker: %+v", ev[0].Snapshot)
	}
	if got := wo.until(t, other, 1); got[len(got)-1].State != policy.BreakerOpen || len(wo.stray) > 0 {
		t.Errorf("beta's subscriber: got %s and %d of another tenant, want beta's trip alone", generations(got), len(wo.stray))
	}
}

// testAttempts: attempts are never rewound: the same attempt gets its
// answer again, a lower attempt and any attempt after a STOP are refused,
// naming attempt.
func testAttempts(t *testing.T, e *env) {
	keep := e.clock.Now().Add(time.Hour)
	retry := policy.Answer{Retry: true, Delay: time.Second, AttemptTimeout: 2 * time.Second, Category: policy.CategoryTransient,
		Class: "transient:503", Breaker: policy.BreakerClosed, TenantTokens: 9, Checks: policy.CheckBreaker}
	stop := policy.Answer{Stop: policy.StopAttemptsExhausted, Disposition: policy.DispositionDeadLetter,
		Category: policy.CategoryTransient, Class: "transient:503", Breaker: policy.BreakerClosed}
	call, other := policy.CallKey{Tenant: "acme", CallID: "call-1"}, policy.CallKey{Tenant: "beta", CallID: "call-1"}
	decide := func(k policy.CallKey, attempt uint32, ans policy.Answer) {
		t.Helper()
		if _, replay, err := e.s.ClaimAttempt(k, attempt); replay || err != nil {
			t.Fatalf("ClaimAttempt(%v, %d) = replay %v, %v; want a fresh decision", k, attempt, replay, err)
		}
		u := e.s.Begin()
		if err := u.RecordAttempt(k, attempt, ans, keep); err != nil {
			t.Fatalf("RecordAttempt(%v, %d) = %v, want nil", k, attempt, err)
		}
		if err := u.Commit(); err != nil {
			t.Fatalf("Commit = %v, want nil", err)
		}
	}
	replays := func(k policy.CallKey, attempt uint32, want policy.Answer) {
		t.Helper()
		got, replay, err := e.s.ClaimAttempt(k, attempt)
		if err != nil || !replay || !sameAnswer(got, want) {
			t.Errorf("ClaimAttempt(%v, %d) again = %+v, replay %v, %v; want the answer %+v replayed", k, attempt, got, replay, err, want)
		}
	}
	refused := func(k policy.CallKey, attempt uint32) {
		t.Helper()
		_, replay, err := e.s.ClaimAttempt(k, attempt)
		if replay || !failedPrecondition(err) || !strings.Contains(err.Error(), "attempt") {
			t.Errorf("ClaimAttempt(%v, %d) = replay %v, %v; want a precondition failure naming attempt", k, attempt, replay, err)
		}
	}

	decide(call, 1, retry)
	replays(call, 1, retry)
	decide(call, 3, retry) // a lost answer to 2 does not stop the call
	refused(call, 2)
	refused(call, 1)
	decide(other, 1, stop) // another tenant's call of the same id is another call
	replays(call, 3, retry)
	decide(call, 4, stop)
	replays(call, 4, stop)
	refused(call, 5)
	refused(call, 3)
	if got, ok := e.s.LastAnswer(call); !ok || !sameAnswer(got, stop) {
		t.Errorf("LastAnswer = %+v, %v; want the STOP of attempt 4", got, ok)
	}
	replays(other, 1, stop)
	if _, ok := e.s.LastAnswer(policy.CallKey{Tenant: "acme", CallID: "never"}); ok {
		t.Errorf("LastAnswer of a call never decided: ok, want none")
	}

	// A claim let go without an answer (the decision failed) leaves the
	// attempt to the next request, also one already waiting for it.
	failed := policy.CallKey{Tenant: "acme", CallID: "call-2"}
	if _, replay, err := e.s.ClaimAttempt(failed, 1); replay || err != nil {
		t.Fatalf("ClaimAttempt(%v, 1) = replay %v, %v; want a fresh decision", failed, replay, err)
	}
	next := make(chan error, 1)
	go func() {
		_, replay, err := e.s.ClaimAttempt(failed, 1)
		if err == nil && replay {
			err = errors.New("replayed an answer never recorded")
		}
		next <- err
	}()
	e.s.ReleaseAttempt(failed)
	if err := <-next; err != nil {
		t.Errorf("ClaimAttempt after the claim was let go = %v, want a fresh decision", err)
	}
	e.s.ReleaseAttempt(failed)
	if _, ok := e.s.LastAnswer(failed); ok {
		t.Errorf("LastAnswer of a call whose claims were let go: ok, want none")
	}
	decide(failed, 1, retry)
	replays(failed, 1, retry)

	// LastAnswers reads many calls of several tenants at once, each as
	// LastAnswer does, with the attempt each answer was given to.
	keys := []policy.CallKey{call, failed, {Tenant: "acme", CallID: "never"}, other, failed}
	want := []policy.Answer{stop, retry, {}, stop, retry}
	wantAttempt := []uint32{4, 1, 0, 1, 1}
	got, attempts := make([]policy.Answer, len(keys)), make([]uint32, len(keys))
	got[2], attempts[2] = retry, 7 // left over from an earlier use: cleared
	e.s.LastAnswers(keys, got, attempts)
	for i := range keys {
		if attempts[i] != wantAttempt[i] || attempts[i] > 0 && !sameAnswer(got[i], want[i]) || attempts[i] == 0 && got[i] != (policy.Answer{}) {
			t.Errorf("LastAnswers: %v = %+v of attempt %d; want %+v of attempt %d", keys[i], got[i], attempts[i], want[i], wantAttempt[i])
		}
	}
}

// testDuplicates: 64 concurrent NextDelays of one attempt of one call (a
// client that retried the RPC while the first was in flight) are decided
// once: one of them decides and spends, the others get its answer.
func testDuplicates(t *testing.T, e *env) {
	if _, err := e.s.SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: 100, DepositRatio: 0.1, MinPerSecond: 1,
		RetryCost: 1, TimeoutCost: 1}); err != nil {
		t.Fatalf("SetBudget = %v, want nil", err)
	}
	call := policy.CallKey{Tenant: "acme", CallID: "call-1"}
	keep := e.clock.Now().Add(time.Hour)
	var decided atomic.Int64
	answers := make([]policy.Answer, workers)
	race(workers, func(i int) {
		ans, replay, err := e.s.ClaimAttempt(call, 1)
		if err != nil {
			t.Errorf("ClaimAttempt = %v, want nil", err)
			return
		}
		if !replay {
			decided.Add(1)
			runtime.Gosched() // deciding takes a while: let the duplicates in
			u := e.s.Begin()
			sp, err := u.SpendRetry(policy.SpendRequest{Tenant: "acme"})
			if err != nil {
				t.Errorf("SpendRetry = %v, want nil", err)
				return
			}
			ans = policy.Answer{Retry: sp.Granted, Delay: time.Duration(1+i) * time.Millisecond, TenantTokens: sp.TenantTokens}
			if err := u.RecordAttempt(call, 1, ans, keep); err != nil {
				t.Errorf("RecordAttempt = %v, want nil", err)
			}
			if err := u.Commit(); err != nil {
				t.Errorf("Commit = %v, want nil", err)
			}
		}
		answers[i] = ans
	})
	if n := decided.Load(); n != 1 {
		t.Errorf("of %d concurrent NextDelays of one attempt: %d decided, want 1", workers, n)
	}
	for i, ans := range answers {
		if !sameAnswer(ans, answers[0]) {
			t.Errorf("answer %d: %+v, want the same as answer 0, %+v", i, ans, answers[0])
			break
		}
	}
	if st, err := e.s.Budget("acme"); err != nil || st.Granted != 1 {
		t.Errorf("Budget = %d granted, %v; want the one retry spent once", st.Granted, err)
	}
}

// sameAnswer compares answers, the deadline as an instant.
func sameAnswer(a, b policy.Answer) bool {
	ad, bd := a.Deadline, b.Deadline
	a.Deadline, b.Deadline = time.Time{}, time.Time{}
	return a == b && ad.Equal(bd)
}

// testPermits: a probe permit settles only its own breaker's current
// HALF_OPEN generation; any other is refused (a precondition failure
// naming permit_id) and changes nothing, also in an outcome batch, whose
// other updates still apply.
func testPermits(t *testing.T, e *env) {
	a := policy.BreakerKey{Tenant: "acme", Target: "a"}
	b := policy.BreakerKey{Tenant: "acme", Target: "b"}
	permits := e.halfOpen(t, a, b)
	pa, pb := permits[0], permits[1]
	refused := func(what string, key policy.BreakerKey, permit string) {
		t.Helper()
		before := e.snapshot(t, key)
		_, err := e.record(key, policy.ResultSuccess, permit)
		if !failedPrecondition(err) || !strings.Contains(err.Error(), "permit_id") {
			t.Errorf("%s: Record = %v, want a precondition failure naming permit_id", what, err)
		}
		if after := e.snapshot(t, key); after.State != before.State || after.Generation != before.Generation ||
			after.ProbesInFlight != before.ProbesInFlight {
			t.Errorf("%s: breaker went from %v with %d in flight to %v with %d, want unchanged",
				what, before.State, before.ProbesInFlight, after.State, after.ProbesInFlight)
		}
	}
	refused("another breaker's permit", b, pa[0])
	refused("an invented permit", a, strings.Repeat("0", len(pa[0])))
	refused("a permit with a byte more", a, pa[0]+"0")

	if snap, err := e.record(a, policy.ResultSuccess, pa[0]); err != nil || snap.ProbesInFlight != len(pa)-1 {
		t.Fatalf("Record with a's own permit = %d in flight, %v; want %d, nil", snap.ProbesInFlight, err, len(pa)-1)
	}
	refused("a permit already settled", a, pa[0])

	// b reopens and probes again: the permits of its first HALF_OPEN
	// generation are dead.
	if snap, err := e.record(b, policy.ResultTransientFailure, pb[0]); err != nil || snap.State != policy.BreakerOpen {
		t.Fatalf("a probe failure = %v, %v; want OPEN, nil", snap.State, err)
	}
	e.clock.Advance(breaker.Cooldown)
	if p := e.admit(t, b); !p.Admitted || p.State != policy.BreakerHalfOpen {
		t.Fatalf("Admit after the second cool-down = %+v, want a probe", p)
	}
	refused("a permit of an earlier generation", b, pb[1])

	e.clock.Advance(breaker.ProbeTimeout)
	refused("an expired permit", a, pa[1])

	ups := []policy.OutcomeUpdate{
		{Key: b, Breaker: breaker, Result: policy.ResultTransientFailure, PermitID: pa[2]},
		{Key: policy.BreakerKey{Tenant: "acme", Target: "c"}, Breaker: breaker, Result: policy.ResultSuccess},
	}
	n, err := e.s.ApplyOutcomes(ups, nil)
	if err != nil || n != 2 || !failedPrecondition(ups[0].Refused) || ups[1].Refused != nil {
		t.Errorf("ApplyOutcomes with a foreign permit first = %d, %v, refused %v and %v; want 2, nil, the first refused",
			n, err, ups[0].Refused, ups[1].Refused)
	}
	if got := e.snapshot(t, b); got.State != policy.BreakerHalfOpen {
		t.Errorf("b after a refused probe failure: %v, want HALF_OPEN", got.State)
	}
}

// testReplicas: what one replica writes the others see: an admin write
// (a policy, a budget) reaches every replica's answers; a breaker forced
// OPEN on one replica refuses on another that had it CLOSED; concurrent
// cool-down extensions from every replica keep the latest; a subscriber
// on one replica sees the transitions the others make, in order. For an
// embedded engine the one store is every replica.
func testReplicas(t *testing.T, e *env) {
	p := policy.Default()
	p.MaxAttempts = 7
	if _, err := e.on(0).SetPolicy("acme", "pay", p); err != nil {
		t.Fatalf("SetPolicy = %v, want nil", err)
	}
	e.everywhere(t, "the policy", func(r server.Store) bool {
		got, _ := r.Resolve("acme", "pay")
		return got.MaxAttempts == 7
	})
	budget := policy.TenantBudget{Tenant: "beta", Capacity: 5, DepositRatio: 0.1, MinPerSecond: 1, RetryCost: 1, TimeoutCost: 1}
	if _, err := e.on(0).SetBudget(budget); err != nil {
		t.Fatalf("SetBudget = %v, want nil", err)
	}
	e.everywhere(t, "the budget", func(r server.Store) bool {
		st, err := r.Budget("beta")
		return err == nil && !st.IsDefault && st.Budget.Capacity == 5
	})

	forced := policy.BreakerKey{Tenant: "acme", Target: "forced"}
	if a, err := e.on(1).Admit(forced, breaker); err != nil || !a.Admitted {
		t.Fatalf("Admit of a new breaker = %+v, %v; want admitted", a, err)
	}
	if _, err := e.on(0).ForceBreaker(forced, policy.BreakerOpen); err != nil {
		t.Fatalf("ForceBreaker(OPEN) = %v, want nil", err)
	}
	eventually(t, "the forced OPEN refusing on replica 1", func() bool {
		a, err := e.on(1).Admit(forced, breaker)
		return err == nil && !a.Admitted && a.Reason == fleet.ReasonForcedOpen
	})
	// A replica that uses the breaker knows the change with no round trip
	// (KnownBreaker), once its feed delivers it; a breaker never stored is
	// known nowhere.
	eventually(t, "the forced OPEN known on replica 1", func() bool {
		snap, ok := e.on(1).KnownBreaker(forced)
		return ok && snap.State == policy.BreakerOpen && snap.Forced && snap.Generation > 0 && !snap.Changed.IsZero()
	})
	for i := range e.replicas {
		if snap, ok := e.on(i).KnownBreaker(policy.BreakerKey{Tenant: "acme", Target: "never"}); ok {
			t.Errorf("KnownBreaker of a breaker never stored on replica %d = %+v, true; want false", i, snap)
		}
	}

	cool := policy.BreakerKey{Tenant: "acme", Target: "cool"}
	now := e.clock.Now()
	race(30, func(i int) {
		until := now.Add(time.Duration(1+(i*7)%30) * time.Second)
		u := e.on(i).Begin()
		in, err := u.ExtendCooldown(cool, breaker, until)
		if err == nil {
			err = u.Commit()
		}
		if err != nil || in.Before(until) {
			t.Errorf("ExtendCooldown(+%v) = +%v, %v; want at least that", until.Sub(now), in.Sub(now), err)
		}
	})
	if got := e.snapshot(t, cool).CooldownUntil; !got.Equal(now.Add(30 * time.Second)) {
		t.Errorf("after extensions from every replica: cool-down until +%v, want the latest, +30s", got.Sub(now))
	}
	for i := range e.replicas {
		if a, err := e.on(i).Admit(cool, breaker); err != nil || a.Admitted || a.Reason != fleet.ReasonPushback {
			t.Errorf("Admit on replica %d during the cool-down = %+v, %v; want refused %q", i, a, err, fleet.ReasonPushback)
		}
	}

	watched := policy.BreakerKey{Tenant: "gamma", Target: "x"}
	w := subscribe(t, e.on(2), "gamma")
	for range breaker.ConsecutiveFailures {
		if _, err := e.recordOn(e.on(0), watched, policy.ResultTransientFailure, ""); err != nil {
			t.Fatalf("Record(failure) on replica 0 = %v, want nil", err)
		}
	}
	e.clock.Advance(breaker.Cooldown)
	var probes []string
	for range breaker.HalfOpenProbes {
		a, err := e.on(1).Admit(watched, breaker)
		if err != nil || !a.Admitted || a.PermitID == "" {
			t.Fatalf("Admit on replica 1 after the cool-down = %+v, %v; want a probe permit", a, err)
		}
		probes = append(probes, a.PermitID)
	}
	for _, permit := range probes {
		if _, err := e.recordOn(e.on(0), watched, policy.ResultSuccess, permit); err != nil {
			t.Fatalf("Record(probe success) on replica 0 = %v, want nil", err)
		}
	}
	var got []policy.BreakerSnapshot
	for _, snap := range w.until(t, watched, 3) {
		if n := len(got); n == 0 || got[n-1].Generation != snap.Generation {
			got = append(got, snap)
		}
	}
	want := []policy.BreakerState{policy.BreakerOpen, policy.BreakerHalfOpen, policy.BreakerClosed}
	ok := len(got) == len(want)
	for i := 0; ok && i < len(got); i++ {
		ok = got[i].State == want[i] && got[i].Generation == uint64(i+1)
	}
	if !ok {
		t.Errorf("replica 2's subscriber saw %s of replicas 0 and 1, want %v, one generation each, in order", generations(got), want)
	}
}

// everywhere waits until cond holds on every replica.
func (e *env) everywhere(t *testing.T, what string, cond func(server.Store) bool) {
	t.Helper()
	for i, r := range e.replicas {
		eventually(t, fmt.Sprintf("%s on replica %d", what, i), func() bool { return cond(r) })
	}
}

// eventually polls cond until it holds, failing t after eventWait: what a
// replica learns from another arrives through the engine's feed, later
// than the change.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(eventWait)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, eventWait)
		}
		<-tick.C
	}
}

// watch is a subscription of a test; it ends with the test.
type watch struct {
	c      <-chan policy.BreakerEvent
	tenant string
	stray  []policy.BreakerEvent // events of breakers of another tenant
}

// eventWait bounds the wait for an event that must come; an engine that
// delivers through a network has it long before.
const eventWait = 10 * time.Second

// subscribe subscribes to tenant's breakers and reads past the snapshot.
func subscribe(t *testing.T, s server.Store, tenant string) *watch {
	t.Helper()
	w, _ := subscribeSnapshot(t, s, tenant)
	return w
}

// subscribeSnapshot subscribes to tenant's breakers and returns the
// snapshot's breakers.
func subscribeSnapshot(t *testing.T, s server.Store, tenant string) (*watch, []policy.BreakerSnapshot) {
	t.Helper()
	c, cancel := s.Subscribe(tenant, 4096)
	t.Cleanup(cancel)
	w := &watch{c: c, tenant: tenant}
	var snaps []policy.BreakerSnapshot
	for {
		ev := w.next(t)
		if ev.SnapshotDone {
			return w, snaps
		}
		if !ev.Initial {
			t.Fatalf("event before the end of the snapshot: %+v, want Initial", ev)
		}
		snaps = append(snaps, ev.Snapshot)
	}
}

func (w *watch) next(t *testing.T) policy.BreakerEvent {
	t.Helper()
	timer := time.NewTimer(eventWait)
	defer timer.Stop()
	select {
	case ev, ok := <-w.c:
		if !ok {
			t.Fatalf("subscription of %q closed, want it open", w.tenant)
		}
		return ev
	case <-timer.C:
		t.Fatalf("no event of %q within %v", w.tenant, eventWait)
	}
	return policy.BreakerEvent{}
}

// until returns the snapshots of key's changes up to the first of
// generation gen or later; changes of other breakers of the tenant are
// skipped, those of other tenants kept in stray.
func (w *watch) until(t *testing.T, key policy.BreakerKey, gen uint64) []policy.BreakerSnapshot {
	t.Helper()
	var out []policy.BreakerSnapshot
	for {
		ev := w.next(t)
		switch k := ev.Snapshot.Key; {
		case k.Tenant != w.tenant && k.Tenant != "":
			w.stray = append(w.stray, ev)
		case k == key:
			out = append(out, ev.Snapshot)
			if ev.Snapshot.Generation >= gen {
				return out
			}
		}
	}
}

// testAttemptStats: the attempt statistics count each call's end once,
// by tenant, attempt target, hour and attempt number (16 or more in the
// last slot), through both write paths (a batch's CountAttempts and an
// outcome's Tally), on every replica alike; a run's final disposition
// reported again, or refused, counts nothing; a window selects hours;
// buckets past the retention are not read.
func testAttemptStats(t *testing.T, e *env) {
	run, err := e.s.OpenRun(policy.Run{Tenant: "acme", Pool: 10, Cutoff: e.clock.Now().Add(time.Hour)})
	if err != nil {
		t.Fatalf("OpenRun = %v, want nil", err)
	}
	start := e.clock.Now()
	geo := policy.BreakerKey{Tenant: "acme", Target: "geocoder"}
	race(workers, func(i int) {
		s := e.on(i)
		switch i % 4 {
		case 0: // a success on attempt 1, with its breaker result
			ups := []policy.OutcomeUpdate{{Key: geo, Breaker: breaker, Result: policy.ResultSuccess,
				Tally: policy.AttemptTally{Tenant: "acme", Target: "geocoder", Attempt: 1, Success: true}}}
			if _, err := s.ApplyOutcomes(ups, nil); err != nil {
				t.Errorf("ApplyOutcomes = %v, want nil", err)
			}
		case 1: // a success on attempt 2 on the fallback
			ups := []policy.OutcomeUpdate{{Tally: policy.AttemptTally{Tenant: "acme", Target: "geocoder-b", Attempt: 2, Success: true}}}
			if _, err := s.ApplyOutcomes(ups, nil); err != nil {
				t.Errorf("ApplyOutcomes = %v, want nil", err)
			}
		case 2: // NextDelay's STOP after attempt 3
			u := s.Begin()
			if _, err := u.Record(geo, breaker, policy.ResultTerminal, ""); err != nil {
				t.Errorf("Record = %v, want nil", err)
			}
			u.CountAttempts(policy.AttemptTally{Tenant: "acme", Target: "geocoder", Attempt: 3})
			if err := u.Commit(); err != nil {
				t.Errorf("Commit = %v, want nil", err)
			}
		case 3: // a final failure after attempt 20 (16 or more), another tenant
			ups := []policy.OutcomeUpdate{{Tally: policy.AttemptTally{Tenant: "beta", Target: "geocoder", Attempt: 20}}}
			if _, err := s.ApplyOutcomes(ups, nil); err != nil {
				t.Errorf("ApplyOutcomes = %v, want nil", err)
			}
		}
	})
	// A run's call: its SUCCEEDED reported three times counts once, and a
	// different final disposition after it (refused) not at all.
	success := policy.OutcomeUpdate{RunID: run.ID, CallID: "doc-1", Final: policy.DispositionSucceeded,
		Tally: policy.AttemptTally{Tenant: "acme", Target: "geocoder", Attempt: 2, Success: true}}
	for i := range 3 {
		ups := []policy.OutcomeUpdate{success}
		if _, err := e.on(i).ApplyOutcomes(ups, nil); err != nil || ups[0].Refused != nil {
			t.Fatalf("ApplyOutcomes(SUCCEEDED of doc-1, report %d) = %v, refused %v; want nil", i+1, err, ups[0].Refused)
		}
	}
	late := []policy.OutcomeUpdate{{RunID: run.ID, CallID: "doc-1", Final: policy.DispositionDeadLetter, Stop: policy.StopAttemptsExhausted,
		Tally: policy.AttemptTally{Tenant: "acme", Target: "geocoder", Attempt: 3}}}
	if _, err := e.s.ApplyOutcomes(late, nil); err != nil || !failedPrecondition(late[0].Refused) {
		t.Fatalf("ApplyOutcomes(DEAD_LETTER of a SUCCEEDED call) = %v, refused %v; want the report refused", err, late[0].Refused)
	}

	n := uint64(workers / 4)
	var geoWant, fallbackWant, betaWant policy.TargetStats
	geoWant.Successes[0], geoWant.Successes[1], geoWant.Failures[2] = n, 1, n
	fallbackWant.Successes[1] = n
	betaWant.Failures[policy.StatsAttempts-1] = n
	check := func(what string, s server.Store, tenant, target string, since time.Time, want ...policy.TargetStats) {
		t.Helper()
		got, err := s.AttemptStats(tenant, target, since)
		if err != nil {
			t.Fatalf("%s: AttemptStats(%q, %q) = %v, want nil", what, tenant, target, err)
		}
		if len(got) != len(want) {
			t.Fatalf("%s: AttemptStats(%q, %q) = %+v, want %d entries", what, tenant, target, got, len(want))
		}
		for i := range want {
			g, w := got[i], want[i]
			if g.Tenant != w.Tenant || g.Target != w.Target || g.Successes != w.Successes || g.Failures != w.Failures {
				t.Errorf("%s: AttemptStats(%q, %q)[%d] = %s/%s %v %v, want %s/%s %v %v", what, tenant, target, i,
					g.Tenant, g.Target, g.Successes, g.Failures, w.Tenant, w.Target, w.Successes, w.Failures)
			}
			// The window starts at the hour of since, or of the retention's
			// start when since is before it.
			wantStart := since.Truncate(time.Hour)
			if oldest := e.clock.Now().Truncate(time.Hour).Add(time.Hour - policy.StatsRetention); wantStart.Before(oldest) {
				wantStart = oldest
			}
			if !g.Start.Equal(wantStart) || !g.End.Equal(e.clock.Now()) {
				t.Errorf("%s: window of %s/%s is %v to %v, want %v to %v", what, g.Tenant, g.Target, g.Start, g.End, wantStart, e.clock.Now())
			}
		}
	}
	with := func(ts policy.TargetStats, tenant, target string) policy.TargetStats {
		ts.Tenant, ts.Target = tenant, target
		return ts
	}
	geoWant, fallbackWant, betaWant = with(geoWant, "acme", "geocoder"), with(fallbackWant, "acme", "geocoder-b"), with(betaWant, "beta", "geocoder")
	e.settle()
	for i := range replicas {
		what := fmt.Sprint("replica ", i)
		check(what, e.on(i), "", "", start.Add(-time.Hour), geoWant, fallbackWant, betaWant)
		check(what, e.on(i), "acme", "", start, geoWant, fallbackWant)
		check(what, e.on(i), "", "geocoder", start, geoWant, betaWant)
		check(what, e.on(i), "acme", "geocoder", start.Add(-time.Minute), geoWant)
	}

	// Three hours later: a new hour's bucket, and a window of one hour
	// that sees it only.
	e.clock.Advance(3 * time.Hour)
	later := []policy.OutcomeUpdate{{Tally: policy.AttemptTally{Tenant: "acme", Target: "geocoder", Attempt: 1, Success: true}}}
	if _, err := e.s.ApplyOutcomes(later, nil); err != nil {
		t.Fatalf("ApplyOutcomes = %v, want nil", err)
	}
	e.settle()
	var recent policy.TargetStats
	recent.Successes[0] = 1
	recent = with(recent, "acme", "geocoder")
	check("3 h later, the last hour", e.s, "acme", "geocoder", e.clock.Now().Add(-time.Minute), recent)
	all := geoWant
	all.Successes[0]++
	check("3 h later, the whole retention", e.s, "acme", "geocoder", e.clock.Now().Add(-policy.StatsRetention), all)

	// Past the retention the first hour is no longer read.
	e.clock.Advance(policy.StatsRetention - 3*time.Hour)
	check("168 h later", e.s, "acme", "geocoder", e.clock.Now().Add(-policy.StatsRetention), recent)
}
