package breakerstore_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// TestFleetTripsOnceAndProbes runs 64 workers against one upstream that
// starts failing: the breaker opens exactly once, and after the cooldown
// exactly HalfOpenProbes of 64 concurrent Admits get a probe permit.
func TestFleetTripsOnceAndProbes(t *testing.T) {
	const workers = 64
	e := newEnv(t)
	s := e.open()
	key := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	sub := subscribe(t, s, "acme", 4096)
	defer sub.Close()

	run := func(fn func(i int)) {
		var start, done sync.WaitGroup
		start.Add(1)
		for i := range workers {
			done.Go(func() {
				start.Wait()
				fn(i)
			})
		}
		start.Done()
		done.Wait()
	}

	var admitted atomic.Int64
	run(func(int) {
		for range 20 {
			res, err := s.Admit(key, consecutive)
			if err != nil {
				t.Error(err)
				return
			}
			if !res.Admitted {
				continue
			}
			admitted.Add(1)
			if _, err := s.Record(key, consecutive, policy.ResultTransientFailure, res.PermitID); err != nil {
				t.Error(err)
			}
		}
	})
	if got := countStates(drain(sub)); got[policy.BreakerOpen] != 1 || len(got) != 1 {
		t.Fatalf("transitions while 64 workers fail: got %v, want exactly one to OPEN", got)
	}
	if got := must(s.Breaker(key)).get(t); got.State != policy.BreakerOpen {
		t.Fatalf("state: got %v, want OPEN", got.State)
	}
	refused := must(s.Admit(key, consecutive)).get(t)
	if refused.Admitted || refused.Reason != breakerstore.ReasonOpen || refused.RetryAfter != consecutive.Cooldown {
		t.Errorf("Admit while OPEN: got %+v, want refused %q after %v", refused, breakerstore.ReasonOpen, consecutive.Cooldown)
	}

	e.clock.Advance(consecutive.Cooldown)
	var probes atomic.Int64
	var mu sync.Mutex
	permits := map[string]bool{}
	run(func(int) {
		res, err := s.Admit(key, consecutive)
		if err != nil {
			t.Error(err)
			return
		}
		if res.Admitted {
			probes.Add(1)
			mu.Lock()
			permits[res.PermitID] = true
			mu.Unlock()
		} else if res.Reason != breakerstore.ReasonProbesTaken || res.RetryAfter != consecutive.ProbeTimeout {
			t.Errorf("refused Admit in HALF_OPEN: got %+v, want %q after %v", res, breakerstore.ReasonProbesTaken, consecutive.ProbeTimeout)
		}
	})
	if got, want := probes.Load(), int64(consecutive.HalfOpenProbes); got != want || len(permits) != int(want) {
		t.Fatalf("probes among %d concurrent Admits: got %d (%d distinct ids), want %d", workers, got, len(permits), want)
	}
	if got := countStates(drain(sub)); got[policy.BreakerHalfOpen] != 1 || len(got) != 1 {
		t.Errorf("transitions after the cooldown: got %v, want exactly one to HALF_OPEN", got)
	}
}

func countStates(evs []policy.BreakerEvent) map[policy.BreakerState]int {
	out := map[policy.BreakerState]int{}
	for _, ev := range evs {
		if !ev.Initial {
			out[ev.Snapshot.State]++
		}
	}
	return out
}

// halfOpen returns a store whose breaker under key is HALF_OPEN with every
// probe permit handed out.
func halfOpen(t *testing.T) (*env, *breakerstore.Store, policy.BreakerKey, []string) {
	t.Helper()
	e := newEnv(t)
	s := e.open()
	key := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	record(t, s, key, consecutive, policy.ResultTransientFailure, consecutive.ConsecutiveFailures)
	e.clock.Advance(consecutive.Cooldown)
	var permits []string
	for range consecutive.HalfOpenProbes {
		res := must(s.Admit(key, consecutive)).get(t)
		if !res.Admitted || res.Reason != breakerstore.ReasonProbe || res.PermitID == "" {
			t.Fatalf("Admit after cooldown: got %+v, want a probe permit", res)
		}
		permits = append(permits, res.PermitID)
	}
	return e, s, key, permits
}

func TestHalfOpen(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, e *env, s *breakerstore.Store, key policy.BreakerKey, permits []string)
	}{
		{"probe successes close it", func(t *testing.T, e *env, s *breakerstore.Store, key policy.BreakerKey, permits []string) {
			for i, p := range permits {
				got := must(s.Record(key, consecutive, policy.ResultSuccess, p)).get(t)
				want := policy.BreakerHalfOpen
				if i == len(permits)-1 {
					want = policy.BreakerClosed
				}
				if got.State != want {
					t.Fatalf("after %d probe successes: got %v, want %v", i+1, got.State, want)
				}
			}
			if res := must(s.Admit(key, consecutive)).get(t); !res.Admitted || res.Reason != breakerstore.ReasonClosed {
				t.Errorf("Admit after closing: got %+v, want admitted %q", res, breakerstore.ReasonClosed)
			}
		}},
		{"a terminal answer counts as a probe success", func(t *testing.T, e *env, s *breakerstore.Store, key policy.BreakerKey, permits []string) {
			for _, p := range permits {
				must(s.Record(key, consecutive, policy.ResultTerminal, p)).get(t)
			}
			if got := must(s.Breaker(key)).get(t); got.State != policy.BreakerClosed {
				t.Errorf("after terminal probe answers: got %v, want CLOSED", got.State)
			}
		}},
		{"a probe failure reopens it", func(t *testing.T, e *env, s *breakerstore.Store, key policy.BreakerKey, permits []string) {
			must(s.Record(key, consecutive, policy.ResultSuccess, permits[0])).get(t)
			got := must(s.Record(key, consecutive, policy.ResultTransientFailure, permits[1])).get(t)
			if want := e.clock.Now().Add(consecutive.Cooldown); got.State != policy.BreakerOpen || !got.OpenUntil.Equal(want) {
				t.Errorf("after a probe failure: got %v until %v, want OPEN until %v", got.State, got.OpenUntil, want)
			}
			if got.ProbesInFlight != 0 {
				t.Errorf("permits after reopening: got %d in flight, want 0", got.ProbesInFlight)
			}
		}},
		{"a reported probe frees its slot", func(t *testing.T, e *env, s *breakerstore.Store, key policy.BreakerKey, permits []string) {
			must(s.Record(key, consecutive, policy.ResultSuccess, permits[0])).get(t)
			if res := must(s.Admit(key, consecutive)).get(t); !res.Admitted {
				t.Errorf("Admit after one probe reported: got %+v, want a new permit", res)
			}
		}},
		{"an unreported permit expires", func(t *testing.T, e *env, s *breakerstore.Store, key policy.BreakerKey, permits []string) {
			e.clock.Advance(consecutive.ProbeTimeout / 2)
			res := must(s.Admit(key, consecutive)).get(t)
			if res.Admitted || res.RetryAfter != consecutive.ProbeTimeout/2 {
				t.Fatalf("Admit before expiry: got %+v, want refused for %v", res, consecutive.ProbeTimeout/2)
			}
			e.clock.Advance(consecutive.ProbeTimeout / 2)
			if got := must(s.Breaker(key)).get(t); got.ProbesInFlight != 0 {
				t.Errorf("ProbesInFlight after expiry: got %d, want 0", got.ProbesInFlight)
			}
			for i := range consecutive.HalfOpenProbes {
				if res := must(s.Admit(key, consecutive)).get(t); !res.Admitted {
					t.Fatalf("Admit %d after the permits expired: got %+v, want a permit", i, res)
				}
			}
			if res := must(s.Admit(key, consecutive)).get(t); res.Admitted {
				t.Errorf("Admit past the probe count: got %+v, want refused", res)
			}
		}},
		{"permits survive a restart", func(t *testing.T, e *env, s *breakerstore.Store, key policy.BreakerKey, permits []string) {
			s = e.reopen(s)
			if res := must(s.Admit(key, consecutive)).get(t); res.Admitted {
				t.Errorf("Admit after restart with every permit out: got %+v, want refused", res)
			}
			must(s.Record(key, consecutive, policy.ResultSuccess, permits[2])).get(t)
			if got := must(s.Breaker(key)).get(t); got.ProbesInFlight != 2 {
				t.Errorf("ProbesInFlight after reporting one: got %d, want 2", got.ProbesInFlight)
			}
		}},
		{"a permit that is not live is refused and settles nothing", func(t *testing.T, e *env, s *breakerstore.Store, key policy.BreakerKey, permits []string) {
			other := policy.BreakerKey{Tenant: "acme", Target: "other"}
			for _, forged := range []string{strings.Repeat("0", 32), "7", permits[0] + "0"} {
				if _, err := s.Record(key, consecutive, policy.ResultSuccess, forged); !errors.Is(err, fleet.ErrPermit) {
					t.Fatalf("Record with permit %q: %v, want fleet.ErrPermit", forged, err)
				}
			}
			if _, err := s.Record(other, consecutive, policy.ResultSuccess, permits[0]); err != nil {
				t.Fatalf("a CLOSED breaker ignores a permit not its own: %v", err)
			}
			ups := []policy.OutcomeUpdate{
				{Key: key, Breaker: consecutive, Result: policy.ResultTransientFailure, PermitID: "ff"},
				{Key: key, Breaker: consecutive, Result: policy.ResultSuccess, PermitID: permits[0]},
			}
			n, err := s.ApplyOutcomes(ups, nil)
			if err != nil || n != 2 || !errors.Is(ups[0].Refused, fleet.ErrPermit) || ups[1].Refused != nil {
				t.Fatalf("ApplyOutcomes = %d, %v, refused %v and %v; want 2, nil, the first refused", n, err, ups[0].Refused, ups[1].Refused)
			}
			if got := must(s.Breaker(key)).get(t); got.State != policy.BreakerHalfOpen || got.ProbesInFlight != len(permits)-1 {
				t.Errorf("after a forged failure and one real probe success: %v with %d in flight, want HALF_OPEN with %d",
					got.State, got.ProbesInFlight, len(permits)-1)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, s, key, permits := halfOpen(t)
			tt.run(t, e, s, key, permits)
		})
	}
}

func TestFailureRateWindow(t *testing.T) {
	cfg := policy.BreakerConfig{
		Mode:        policy.BreakerFailureRate,
		FailureRate: 0.5,
		Window:      10 * time.Second,
		MinCalls:    10,
		Cooldown:    time.Minute,
	}
	type step struct {
		advance time.Duration
		r       policy.Result
		n       int
	}
	S, F := policy.ResultSuccess, policy.ResultTransientFailure
	tests := []struct {
		name      string
		steps     []step
		wantState policy.BreakerState
		wantCalls uint64
	}{
		{"below min calls does not trip", []step{{0, F, 9}}, policy.BreakerClosed, 9},
		{"rate reached at min calls trips", []step{{0, S, 5}, {0, F, 5}}, policy.BreakerOpen, 0},
		{"rate below threshold stays closed", []step{{0, S, 6}, {0, F, 4}}, policy.BreakerClosed, 10},
		{"terminal answers are not failures", []step{{0, policy.ResultTerminal, 6}, {0, F, 4}}, policy.BreakerClosed, 10},
		{"failures spread inside the window trip", []step{{0, F, 4}, {4 * time.Second, S, 3}, {4 * time.Second, F, 3}}, policy.BreakerOpen, 0},
		{"old failures age out", []step{{0, F, 8}, {11 * time.Second, S, 6}, {0, F, 4}}, policy.BreakerClosed, 10},
		{"partly aged window", []step{{0, F, 8}, {5 * time.Second, S, 6}, {5 * time.Second, F, 3}}, policy.BreakerClosed, 9},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			s := e.open()
			key := policy.BreakerKey{Tenant: "t", Target: "rate"}
			var got policy.BreakerSnapshot
			for _, st := range tt.steps {
				e.clock.Advance(st.advance)
				got = record(t, s, key, cfg, st.r, st.n)
			}
			if got.State != tt.wantState || got.WindowCalls != tt.wantCalls {
				t.Errorf("got %v with %d calls in the window, want %v with %d", got.State, got.WindowCalls, tt.wantState, tt.wantCalls)
			}
		})
	}
}

func TestConsecutive(t *testing.T) {
	S, F, T := policy.ResultSuccess, policy.ResultTransientFailure, policy.ResultTerminal
	tests := []struct {
		name    string
		results []policy.Result
		want    policy.BreakerState
		wantRow int
	}{
		{"four failures stay closed", []policy.Result{F, F, F, F}, policy.BreakerClosed, 4},
		{"five failures trip", []policy.Result{F, F, F, F, F}, policy.BreakerOpen, 0},
		{"a success resets the count", []policy.Result{F, F, F, F, S, F, F, F, F}, policy.BreakerClosed, 4},
		{"a terminal answer resets the count", []policy.Result{F, F, F, F, T, F}, policy.BreakerClosed, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newEnv(t).open()
			key := policy.BreakerKey{Tenant: "t", Target: "x"}
			var got policy.BreakerSnapshot
			for _, r := range tt.results {
				got = must(s.Record(key, consecutive, r, "")).get(t)
			}
			if got.State != tt.want || got.ConsecutiveFailures != tt.wantRow {
				t.Errorf("got %v with %d in a row, want %v with %d", got.State, got.ConsecutiveFailures, tt.want, tt.wantRow)
			}
		})
	}
}

func TestForceAndReset(t *testing.T) {
	tests := []struct {
		name        string
		state       policy.BreakerState
		wantAdmit   bool
		wantReason  string
		wantRow     int // consecutive failures after 10 transient failures
		wantStateAf policy.BreakerState
	}{
		{"forced open refuses", policy.BreakerOpen, false, breakerstore.ReasonForcedOpen, 0, policy.BreakerOpen},
		{"forced closed admits and never trips", policy.BreakerClosed, true, breakerstore.ReasonClosed, 10, policy.BreakerClosed},
		{"disabled admits and counts nothing", policy.BreakerDisabled, true, breakerstore.ReasonDisabled, 0, policy.BreakerDisabled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			s := e.open()
			key := policy.BreakerKey{Tenant: "t", Target: "x"}
			sub := subscribe(t, s, "t", 16)
			defer sub.Close()
			got := must(s.ForceBreaker(key, tt.state)).get(t)
			if got.State != tt.state || !got.Forced {
				t.Fatalf("ForceBreaker: got %v forced=%v, want %v forced", got.State, got.Forced, tt.state)
			}
			after := record(t, s, key, consecutive, policy.ResultTransientFailure, 10)
			if after.State != tt.wantStateAf || after.ConsecutiveFailures != tt.wantRow {
				t.Errorf("after 10 failures: got %v with %d in a row, want %v with %d", after.State, after.ConsecutiveFailures, tt.wantStateAf, tt.wantRow)
			}
			e.clock.Advance(24 * time.Hour) // forced OPEN does not time out
			if res := must(s.Admit(key, consecutive)).get(t); res.Admitted != tt.wantAdmit || res.Reason != tt.wantReason {
				t.Errorf("Admit: got %+v, want admitted=%v %q", res, tt.wantAdmit, tt.wantReason)
			}

			s = e.reopen(s)
			if got := must(s.Breaker(key)).get(t); got.State != tt.state || !got.Forced {
				t.Errorf("after reopen: got %v forced=%v, want %v forced", got.State, got.Forced, tt.state)
			}
			got = must(s.ResetBreaker(key)).get(t)
			if got.State != policy.BreakerClosed || got.Forced || got.ConsecutiveFailures != 0 || got.WindowCalls != 0 {
				t.Errorf("ResetBreaker: got %+v, want CLOSED, unforced, counters cleared", got)
			}
			if evs := drain(sub); len(evs) != 1 || evs[0].Snapshot.State != tt.state || !evs[0].Snapshot.Forced {
				t.Errorf("events: got %+v, want one forced %v change", evs, tt.state)
			}
		})
	}
}

func TestBreakerAdminErrors(t *testing.T) {
	s := newEnv(t).open()
	key := policy.BreakerKey{Tenant: "t", Target: "x"}
	_, err := s.ForceBreaker(key, policy.BreakerHalfOpen)
	wantErr(t, "ForceBreaker(HALF_OPEN)", err, breakerstore.ErrInvalid)
	_, err = s.ResetBreaker(key)
	wantErr(t, "ResetBreaker of an unknown breaker", err, breakerstore.ErrNotFound)
	_, err = s.Breaker(key)
	wantErr(t, "Breaker of an unknown breaker", err, breakerstore.ErrNotFound)
	_, err = s.Record(key, consecutive, policy.Result(0), "")
	wantErr(t, "Record(ResultUnspecified)", err, breakerstore.ErrInvalid)
	for _, k := range []policy.BreakerKey{{Tenant: "a\x00b", Target: "x"}, {Tenant: "t", Target: "x\x00"}, {Tenant: "t"}} {
		_, err := s.Admit(k, consecutive)
		wantErr(t, fmt.Sprintf("Admit(%q)", k), err, breakerstore.ErrInvalid)
	}
}

func TestBreakerCap(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.MaxBreakersPerTenant = 3; o.IdleTTL = time.Hour })
	s := e.open()
	for i := range 3 {
		must(s.Admit(policy.BreakerKey{Tenant: "t", Target: fmt.Sprint("target-", i)}, consecutive)).get(t)
	}
	_, err := s.Admit(policy.BreakerKey{Tenant: "t", Target: "one-too-many"}, consecutive)
	wantErr(t, "Admit of a 4th breaker", err, breakerstore.ErrTooManyBreakers)
	if !strings.Contains(err.Error(), "cap 3") {
		t.Errorf("error %q does not state the cap", err)
	}
	if _, err := s.ForceBreaker(policy.BreakerKey{Tenant: "t", Target: "forced"}, policy.BreakerOpen); !errors.Is(err, breakerstore.ErrTooManyBreakers) {
		t.Errorf("ForceBreaker of a 4th breaker: got %v, want ErrTooManyBreakers", err)
	}
	must(s.Admit(policy.BreakerKey{Tenant: "other", Target: "x"}, consecutive)).get(t)
	must(s.Admit(policy.BreakerKey{Tenant: "t", Target: "target-0"}, consecutive)).get(t) // existing ones still work

	e.clock.Advance(2 * time.Hour)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	must(s.Admit(policy.BreakerKey{Tenant: "t", Target: "after-expiry"}, consecutive)).get(t)
}

func TestIdleExpiry(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.IdleTTL = time.Hour })
	s := e.open()
	idle := policy.BreakerKey{Tenant: "t", Target: "idle"}
	busy := policy.BreakerKey{Tenant: "t", Target: "busy"}
	open := policy.BreakerKey{Tenant: "t", Target: "open"}
	forced := policy.BreakerKey{Tenant: "t", Target: "forced"}
	pushback := policy.BreakerKey{Tenant: "t", Target: "pushback"}
	record(t, s, idle, consecutive, policy.ResultTransientFailure, 2)
	record(t, s, busy, consecutive, policy.ResultSuccess, 1)
	record(t, s, open, policy.BreakerConfig{ConsecutiveFailures: 1, Cooldown: 48 * time.Hour}, policy.ResultTransientFailure, 1)
	must(s.ForceBreaker(forced, policy.BreakerClosed)).get(t)
	must(s.ExtendCooldown(pushback, consecutive, e.clock.Now().Add(3*time.Hour))).get(t)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}

	e.clock.Advance(59 * time.Minute)
	must(s.Admit(busy, consecutive)).get(t)
	e.clock.Advance(2 * time.Minute)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		key  policy.BreakerKey
		want error
	}{
		{idle, breakerstore.ErrNotFound},
		{busy, nil},
		{open, nil},
		{forced, nil},
		{pushback, nil},
	}
	check := func(s *breakerstore.Store, when string) {
		for _, tt := range tests {
			if _, err := s.Breaker(tt.key); !errors.Is(err, tt.want) {
				t.Errorf("%s: Breaker(%s) = %v, want %v", when, tt.key.Target, err, tt.want)
			}
		}
	}
	check(s, "in memory")
	err := s.View(func(tx *bbolt.Tx) error {
		if tx.Bucket([]byte("breakers")).Get([]byte("t\x00idle")) != nil {
			return errors.New("idle breaker still on disk")
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	check(e.crashAndReopen(s), "after reopen")
}

func TestCooldown(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	key := policy.BreakerKey{Tenant: "t", Target: "rate-limited"}
	sub := subscribe(t, s, "", 16)
	defer sub.Close()
	now := e.clock.Now()

	steps := []struct {
		name    string
		advance time.Duration
		extend  time.Duration // 0: no ExtendCooldown call
		wantIn  time.Duration // cool-down end in force, from the start
		admit   bool
		retry   time.Duration
	}{
		{"sets a cool-down", 0, 10 * time.Second, 10 * time.Second, false, 10 * time.Second},
		{"an earlier end is ignored", time.Second, 3 * time.Second, 10 * time.Second, false, 9 * time.Second},
		{"a later end extends it", time.Second, 20 * time.Second, 20 * time.Second, false, 18 * time.Second},
		{"admits after it ends", 18 * time.Second, 0, 20 * time.Second, true, 0},
	}
	for _, st := range steps {
		e.clock.Advance(st.advance)
		if st.extend > 0 {
			got := must(s.ExtendCooldown(key, consecutive, now.Add(st.extend))).get(t)
			if !got.Equal(now.Add(st.wantIn)) {
				t.Errorf("%s: ExtendCooldown = %v, want %v", st.name, got, now.Add(st.wantIn))
			}
		}
		res := must(s.Admit(key, consecutive)).get(t)
		if res.Admitted != st.admit || res.RetryAfter != st.retry || (!st.admit && res.Reason != breakerstore.ReasonPushback) {
			t.Errorf("%s: Admit = %+v, want admitted=%v retry after %v", st.name, res, st.admit, st.retry)
		}
	}
	if evs := drain(sub); len(evs) != 1 || !evs[0].Snapshot.CooldownUntil.Equal(now.Add(10*time.Second)) {
		t.Errorf("events: got %+v, want one, when the cool-down started", evs)
	}
}

func TestSubscribe(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	keys := []policy.BreakerKey{{Tenant: "a", Target: "y"}, {Tenant: "a", Target: "x"}, {Tenant: "b", Target: "x"}, {Target: "dns"}}
	for _, k := range keys {
		must(s.Admit(k, consecutive)).get(t)
	}
	tests := []struct {
		name   string
		tenant string
		want   []string
	}{
		{"one tenant and the shared breakers", "a", []string{"/dns", "a/x", "a/y"}},
		{"every breaker", "", []string{"/dns", "a/x", "a/y", "b/x"}},
		{"a tenant without breakers", "c", []string{"/dns"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sub := subscribe(t, s, tt.tenant, 4)
			defer sub.Close()
			evs := drainAll(sub)
			if n := len(evs); n == 0 || !evs[n-1].SnapshotDone || evs[n-1].Initial {
				t.Fatalf("events: got %+v, want the snapshot then one SnapshotDone marker", evs)
			}
			var got []string
			for _, ev := range evs[:len(evs)-1] {
				if !ev.Initial || ev.SnapshotDone || ev.Snapshot.State != policy.BreakerClosed {
					t.Errorf("initial event %+v: want Initial CLOSED", ev)
				}
				got = append(got, ev.Snapshot.Key.Tenant+"/"+ev.Snapshot.Key.Target)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("snapshot: got %v, want %v", got, tt.want)
			}
		})
	}

	t.Run("changes follow the snapshot", func(t *testing.T) {
		sub := subscribe(t, s, "b", 4)
		defer sub.Close()
		record(t, s, policy.BreakerKey{Tenant: "a", Target: "x"}, consecutive, policy.ResultTransientFailure, 5)
		record(t, s, policy.BreakerKey{Tenant: "b", Target: "x"}, consecutive, policy.ResultTransientFailure, 5)
		evs := drain(sub)
		if len(evs) != 3 || evs[2].Initial || evs[2].Snapshot.State != policy.BreakerOpen || evs[2].Snapshot.Key.Tenant != "b" {
			t.Errorf("events: got %+v, want 2 initial then b/x OPEN", evs)
		}
	})

	t.Run("a slow subscriber is dropped", func(t *testing.T) {
		live := s.Subscribers()
		sub := subscribe(t, s, "", 1)
		defer sub.Close()
		if got := s.Subscribers(); got != live+1 {
			t.Fatalf("subscribers after Subscribe: got %d, want %d", got, live+1)
		}
		for i := range 3 {
			k := policy.BreakerKey{Tenant: "slow", Target: fmt.Sprint(i)}
			must(s.ForceBreaker(k, policy.BreakerOpen)).get(t)
		}
		// Forgotten when dropped, not at the next Subscribe or cancel.
		if got := s.Subscribers(); got != live {
			t.Errorf("subscribers after the drop: got %d, want %d", got, live)
		}
		var changes, initial int
		for ev := range sub.C { // ends: the channel is closed
			switch {
			case ev.Initial:
				initial++
			case !ev.SnapshotDone:
				changes++
			}
		}
		if initial == 0 || changes != 1 {
			t.Errorf("events before the drop: got %d initial and %d changes, want the snapshot and 1 change (the buffer)", initial, changes)
		}
	})
}

func TestBreakersPaging(t *testing.T) {
	s := newEnv(t).open()
	for _, k := range []policy.BreakerKey{{Tenant: "b", Target: "2"}, {Tenant: "a", Target: "1"}, {Tenant: "b", Target: "1"}, {Target: "z"}} {
		must(s.Admit(k, consecutive)).get(t)
	}
	must(s.ForceBreaker(policy.BreakerKey{Tenant: "b", Target: "1"}, policy.BreakerOpen)).get(t)
	tests := []struct {
		name   string
		tenant string
		state  policy.BreakerState
		after  policy.BreakerKey
		limit  int
		want   string
	}{
		{"all", "", 0, policy.BreakerKey{}, 0, "[/z a/1 b/1 b/2]"},
		{"first page", "", 0, policy.BreakerKey{}, 2, "[/z a/1]"},
		{"second page", "", 0, policy.BreakerKey{Tenant: "a", Target: "1"}, 2, "[b/1 b/2]"},
		{"one tenant", "b", 0, policy.BreakerKey{}, 0, "[b/1 b/2]"},
		{"by state", "", policy.BreakerOpen, policy.BreakerKey{}, 0, "[b/1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, b := range must(s.Breakers(tt.tenant, tt.state, tt.after, tt.limit)).get(t) {
				got = append(got, b.Key.Tenant+"/"+b.Key.Target)
			}
			if fmt.Sprint(got) != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestStateString(t *testing.T) {
	tests := []struct {
		s    policy.BreakerState
		want string
	}{
		{policy.BreakerClosed, "CLOSED"},
		{policy.BreakerOpen, "OPEN"},
		{policy.BreakerHalfOpen, "HALF_OPEN"},
		{policy.BreakerDisabled, "DISABLED"},
		{policy.BreakerStateUnspecified, "UNSPECIFIED"},
	}
	for _, tt := range tests {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("State(%d).String() = %q, want %q", tt.s, got, tt.want)
		}
	}
}

func TestKeyFor(t *testing.T) {
	tests := []struct {
		name  string
		scope policy.BreakerScope
		want  policy.BreakerKey
	}{
		{"tenant and target by default", policy.ScopeUnspecified, policy.BreakerKey{Tenant: "t", Target: "x"}},
		{"tenant and target", policy.ScopeTenantTarget, policy.BreakerKey{Tenant: "t", Target: "x"}},
		{"target only", policy.ScopeTarget, policy.BreakerKey{Target: "x"}},
	}
	for _, tt := range tests {
		if got := policy.KeyFor(policy.BreakerConfig{Scope: tt.scope}, "t", "x"); got != tt.want {
			t.Errorf("%s: got %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestConsecutiveFailuresFarApartDoNotTrip(t *testing.T) {
	e := newEnv(t)
	s, clk := e.open(), e.clock
	key := policy.BreakerKey{Tenant: "acme", Target: "quiet"}
	cfg := policy.Default().Breaker // 5 in a row, window 60s
	for i := range 10 {
		snap, err := s.Record(key, cfg, policy.ResultTransientFailure, "")
		if err != nil {
			t.Fatal(err)
		}
		if snap.State != policy.BreakerClosed {
			t.Fatalf("failure %d, each 61s after the last: got %v, want CLOSED", i+1, snap.State)
		}
		clk.Advance(61 * time.Second)
	}
	for range 5 {
		if _, err := s.Record(key, cfg, policy.ResultTransientFailure, ""); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
	}
	if snap, _ := s.Breaker(key); snap.State != policy.BreakerOpen {
		t.Errorf("5 failures a second apart: got %v, want OPEN", snap.State)
	}
}
