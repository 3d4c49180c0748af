package fleet_test

import (
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

const sec = int64(time.Second)

// seq hands out distinct permit ids, as crypto/rand would.
func seq() func() fleet.PermitID {
	var n byte
	return func() fleet.PermitID { n++; return fleet.PermitID{n} }
}

func consecutive(n int) policy.BreakerConfig {
	return fleet.NormConfig(policy.BreakerConfig{Mode: policy.BreakerConsecutive, ConsecutiveFailures: n,
		Cooldown: 10 * time.Second, HalfOpenProbes: 2, ProbeTimeout: 5 * time.Second, Window: time.Minute})
}

// step is one call on a breaker at a time, with what must come of it.
type step struct {
	at     int64 // seconds
	op     string
	r      policy.Result
	permit int // index of a permit handed out earlier, or -1
	want   policy.BreakerState
	effect fleet.Effect // checked when set
	admit  bool
	reason string
}

func run(t *testing.T, cfg policy.BreakerConfig, steps []step) {
	t.Helper()
	b := fleet.NewBreaker(0)
	ids := seq()
	var permits []string
	for i, s := range steps {
		now := s.at * sec
		e := b.Advance(now)
		switch s.op {
		case "admit":
			a, e2 := b.Admit(now, &cfg, ids)
			e |= e2
			if a.Admitted != s.admit || a.Reason != s.reason {
				t.Fatalf("step %d: Admit = %+v, want admitted %v reason %s", i, a, s.admit, s.reason)
			}
			if a.PermitID != "" {
				permits = append(permits, a.PermitID)
			}
		case "record":
			p := ""
			if s.permit >= 0 {
				p = permits[s.permit]
			}
			e2, err := b.Record(now, &cfg, s.r, p)
			if err != nil {
				t.Fatalf("step %d: Record: %v", i, err)
			}
			e |= e2
		case "force":
			e |= b.Force(now, s.want)
		case "reset":
			e |= b.Reset(now)
		}
		if b.State != s.want {
			t.Fatalf("step %d (%s at %ds): state %v, want %v", i, s.op, s.at, b.State, s.want)
		}
		if s.effect != 0 && e != s.effect {
			t.Fatalf("step %d: effect %b, want %b", i, e, s.effect)
		}
	}
}

func TestBreakerRules(t *testing.T) {
	fail, ok, term := policy.ResultTransientFailure, policy.ResultSuccess, policy.ResultTerminal
	cons := consecutive(3)
	closed, open, half := policy.BreakerClosed, policy.BreakerOpen, policy.BreakerHalfOpen
	tests := []struct {
		name  string
		cfg   policy.BreakerConfig
		steps []step
	}{
		{"three failures in a row trip it", cons, []step{
			{at: 1, op: "record", r: fail, permit: -1, want: closed, effect: fleet.Mutated},
			{at: 2, op: "record", r: fail, permit: -1, want: closed},
			{at: 3, op: "record", r: fail, permit: -1, want: open, effect: fleet.Transitioned | fleet.Mutated},
			{at: 4, op: "admit", want: open, reason: fleet.ReasonOpen},
		}},
		{"a success or a terminal answer breaks the chain", cons, []step{
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 2, op: "record", r: fail, permit: -1, want: closed},
			{at: 3, op: "record", r: term, permit: -1, want: closed},
			{at: 4, op: "record", r: fail, permit: -1, want: closed},
			{at: 5, op: "record", r: ok, permit: -1, want: closed},
			{at: 6, op: "record", r: fail, permit: -1, want: closed},
		}},
		{"failures further apart than the window are not in a row", cons, []step{
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 100, op: "record", r: fail, permit: -1, want: closed},
			{at: 200, op: "record", r: fail, permit: -1, want: closed},
		}},
		{"after the cooldown N probes, whose successes close it", cons, []step{
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 1, op: "record", r: fail, permit: -1, want: open},
			{at: 11, op: "admit", want: half, admit: true, reason: fleet.ReasonProbe, effect: fleet.Transitioned | fleet.Mutated},
			{at: 11, op: "admit", want: half, admit: true, reason: fleet.ReasonProbe},
			{at: 11, op: "admit", want: half, reason: fleet.ReasonProbesTaken, effect: 0},
			{at: 12, op: "record", r: ok, permit: 0, want: half, effect: fleet.Mutated},
			{at: 12, op: "record", r: ok, permit: 1, want: closed, effect: fleet.Transitioned | fleet.Mutated},
		}},
		{"a probe failure reopens it", cons, []step{
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 1, op: "record", r: fail, permit: -1, want: open},
			{at: 11, op: "admit", want: half, admit: true, reason: fleet.ReasonProbe},
			{at: 12, op: "record", r: fail, permit: 0, want: open},
			{at: 13, op: "admit", want: open, reason: fleet.ReasonOpen},
		}},
		{"unreported permits expire and free their slots", cons, []step{
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 1, op: "record", r: fail, permit: -1, want: open},
			{at: 11, op: "admit", want: half, admit: true, reason: fleet.ReasonProbe},
			{at: 11, op: "admit", want: half, admit: true, reason: fleet.ReasonProbe},
			{at: 15, op: "admit", want: half, reason: fleet.ReasonProbesTaken},
			{at: 16, op: "admit", want: half, admit: true, reason: fleet.ReasonProbe},
		}},
		{"forced OPEN refuses until reset, forced CLOSED never trips", cons, []step{
			{at: 1, op: "force", want: open},
			{at: 1000, op: "admit", want: open, reason: fleet.ReasonForcedOpen},
			{at: 1001, op: "force", want: closed},
			{at: 1002, op: "record", r: fail, permit: -1, want: closed},
			{at: 1002, op: "record", r: fail, permit: -1, want: closed},
			{at: 1002, op: "record", r: fail, permit: -1, want: closed},
			{at: 1002, op: "record", r: fail, permit: -1, want: closed},
			{at: 1003, op: "reset", want: closed},
			{at: 1004, op: "record", r: fail, permit: -1, want: closed},
			{at: 1004, op: "record", r: fail, permit: -1, want: closed},
			{at: 1004, op: "record", r: fail, permit: -1, want: open},
		}},
		{"DISABLED admits and counts nothing", cons, []step{
			{at: 1, op: "force", want: policy.BreakerDisabled},
			{at: 2, op: "record", r: fail, permit: -1, want: policy.BreakerDisabled, effect: 0},
			{at: 2, op: "admit", want: policy.BreakerDisabled, admit: true, reason: fleet.ReasonDisabled},
		}},
		{"FAILURE_RATE trips at the rate once the window holds MinCalls", fleet.NormConfig(policy.BreakerConfig{
			Mode: policy.BreakerFailureRate, FailureRate: 0.5, MinCalls: 4, Window: 10 * time.Second}), []step{
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 2, op: "record", r: ok, permit: -1, want: closed},
			{at: 2, op: "record", r: fail, permit: -1, want: open},
		}},
		{"FAILURE_RATE forgets calls older than the window", fleet.NormConfig(policy.BreakerConfig{
			Mode: policy.BreakerFailureRate, FailureRate: 0.5, MinCalls: 4, Window: 10 * time.Second}), []step{
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 1, op: "record", r: fail, permit: -1, want: closed},
			{at: 30, op: "record", r: fail, permit: -1, want: closed},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { run(t, tt.cfg, tt.steps) })
	}
}

func TestBreakerGenerationCountsTransitions(t *testing.T) {
	cfg := consecutive(1)
	b := fleet.NewBreaker(0)
	_, _ = b.Record(sec, &cfg, policy.ResultTransientFailure, "")
	if b.Generation != 1 {
		t.Fatalf("generation after a trip: %d, want 1", b.Generation)
	}
	b.Advance(20 * sec)
	if b.Generation != 2 || b.State != policy.BreakerHalfOpen {
		t.Fatalf("after the cooldown: %v generation %d, want HALF_OPEN generation 2", b.State, b.Generation)
	}
	if e := b.Advance(21 * sec); e != 0 || b.Generation != 2 {
		t.Fatalf("a second Advance: effect %b generation %d, want nothing", e, b.Generation)
	}
}

func TestCooldownOnlyMovesLater(t *testing.T) {
	var c fleet.Cooldown
	steps := []struct {
		now, until, want int64
		effect           fleet.Effect
	}{
		{now: 0, until: 10, want: 10, effect: fleet.Mutated | fleet.CooldownStarted},
		{now: 1, until: 5, want: 10, effect: 0},
		{now: 2, until: 20, want: 20, effect: fleet.Mutated},
		{now: 30, until: 40, want: 40, effect: fleet.Mutated | fleet.CooldownStarted},
		{now: 31, until: 40, want: 40, effect: 0},
	}
	for i, s := range steps {
		got, e := c.Extend(s.now, s.until)
		if got != s.want || e != s.effect {
			t.Errorf("step %d: Extend(%d, %d) = %d, %b; want %d, %b", i, s.now, s.until, got, e, s.want, s.effect)
		}
	}
	if on, left := c.Active(35); !on || left != 5 {
		t.Errorf("Active(35) = %v, %d; want true, 5", on, left)
	}
}

func TestPermitIDRoundTrip(t *testing.T) {
	id := fleet.PermitID{0xde, 0xad, 15: 0xff}
	got, ok := fleet.ParsePermitID(id.String())
	if !ok || got != id || len(id.String()) != 32 {
		t.Fatalf("ParsePermitID(%q) = %v, %v", id.String(), got, ok)
	}
	for _, bad := range []string{"", "1", "zz" + id.String()[2:], id.String() + "0"} {
		if _, ok := fleet.ParsePermitID(bad); ok {
			t.Errorf("ParsePermitID(%q) accepted", bad)
		}
	}
}

// TestOnlyALivePermitSettlesAProbe: in HALF_OPEN a result without a permit,
// with an invented one, an expired one, one of an earlier generation or of
// another breaker neither closes nor reopens the breaker; the invented,
// expired and foreign ones are refused with ErrPermit. (Before permits were
// checked, any success closed the breaker and any failure reopened it.)
func TestOnlyALivePermitSettlesAProbe(t *testing.T) {
	cfg := fleet.NormConfig(policy.BreakerConfig{ConsecutiveFailures: 1, Cooldown: 10 * time.Second,
		HalfOpenProbes: 1, ProbeTimeout: 5 * time.Second})
	halfOpen := func() (fleet.Breaker, string) {
		b := fleet.NewBreaker(0)
		_, _ = b.Record(0, &cfg, policy.ResultTransientFailure, "")
		b.Advance(10 * sec)
		a, _ := b.Admit(10*sec, &cfg, seq())
		if b.State != policy.BreakerHalfOpen || a.PermitID == "" {
			t.Fatalf("setup: %v, %+v", b.State, a)
		}
		return b, a.PermitID
	}
	other, otherPermit := halfOpen() // another breaker, its own permit
	_ = other
	// An earlier generation's permit: probe, reopen, wait, probe again.
	old, oldPermit := halfOpen()
	_, _ = old.Record(11*sec, &cfg, policy.ResultTransientFailure, oldPermit)
	old.Advance(21 * sec)
	_, _ = old.Admit(21*sec, &cfg, func() fleet.PermitID { return fleet.PermitID{0xee} })

	tests := []struct {
		name    string
		b       func() (fleet.Breaker, string)
		at      int64
		permit  func(own string) string
		refused bool
	}{
		{"no permit", halfOpen, 11, func(string) string { return "" }, false},
		{"an invented permit", halfOpen, 11, func(string) string { return fleet.PermitID{0x42}.String() }, true},
		{"garbage", halfOpen, 11, func(string) string { return "1" }, true},
		{"another breaker's permit", func() (fleet.Breaker, string) {
			b, _ := halfOpen()
			b.Permits[0].ID = fleet.PermitID{0x99} // its own permit differs from the other breaker's
			return b, ""
		}, 11, func(string) string { return otherPermit }, true},
		{"an expired permit", halfOpen, 15, func(own string) string { return own }, true},
		{"an earlier generation's permit", func() (fleet.Breaker, string) { return old, "" }, 22,
			func(string) string { return oldPermit }, true},
	}
	for _, tt := range tests {
		for _, r := range []policy.Result{policy.ResultSuccess, policy.ResultTransientFailure} {
			t.Run(tt.name+"/"+map[policy.Result]string{policy.ResultSuccess: "success", policy.ResultTransientFailure: "failure"}[r], func(t *testing.T) {
				b, own := tt.b()
				gen := b.Generation
				e, err := b.Record(tt.at*sec, &cfg, r, tt.permit(own))
				if (err == fleet.ErrPermit) != tt.refused || (err != nil && err != fleet.ErrPermit) {
					t.Fatalf("Record: err %v, want refused %v", err, tt.refused)
				}
				if e != 0 || b.State != policy.BreakerHalfOpen || b.Generation != gen {
					t.Fatalf("Record: effect %b, state %v, generation %d -> %d; want nothing changed", e, b.State, gen, b.Generation)
				}
			})
		}
	}
	// The live permit settles it.
	b, own := halfOpen()
	if e, err := b.Record(11*sec, &cfg, policy.ResultSuccess, own); err != nil || !e.Has(fleet.Transitioned) || b.State != policy.BreakerClosed {
		t.Fatalf("the live permit: %b, %v, %v; want CLOSED", e, err, b.State)
	}
}
