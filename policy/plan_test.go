package policy_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

func TestPlanBudgetKnownSchedule(t *testing.T) {
	in := policy.PlanInput{
		Window:         72 * time.Hour,
		Backoff:        policy.Backoff{Base: 2 * time.Second, Factor: 2, Max: time.Hour},
		AttemptTimeout: 30 * time.Second,
		TTLMargin:      6 * time.Hour,
	}
	// Delays 2s, 4s, ..., 2048s (11 retries, 4094s in all), then 1h each.
	// 12 attempts take 12*30s + 4094s = 4454s; each further attempt adds
	// 3600s + 30s. 4454s + 70*3630s = 258554s <= 259200s = 72h, and one more
	// would reach 262184s. So 82 attempts and 81 delays.
	var want []time.Duration
	for n := range 11 {
		want = append(want, (2*time.Second)<<n)
	}
	for range 70 {
		want = append(want, time.Hour)
	}
	got, err := policy.PlanBudget(in)
	if err != nil {
		t.Fatalf("PlanBudget() error = %v, want nil", err)
	}
	if got.MaxAttempts != 82 {
		t.Errorf("MaxAttempts = %d, want 82", got.MaxAttempts)
	}
	if !slices.Equal(got.Delays, want) {
		t.Errorf("Delays = %v, want %v", got.Delays, want)
	}
	if want := 258554 * time.Second; got.WorstCase != want {
		t.Errorf("WorstCase = %v, want %v", got.WorstCase, want)
	}
	if want := 78 * time.Hour; got.IdempotencyTTL != want {
		t.Errorf("IdempotencyTTL = %v, want %v", got.IdempotencyTTL, want)
	}
	if got.Window != in.Window {
		t.Errorf("Window = %v, want %v", got.Window, in.Window)
	}
}

func TestPlanBudget(t *testing.T) {
	def := policy.Default().Backoff // 500ms, x2, 30s
	short := policy.Backoff{Base: 500 * time.Millisecond, Factor: 2, Max: 10 * time.Second}
	ms := time.Millisecond
	tests := []struct {
		name      string
		in        policy.PlanInput
		attempts  int
		delays    []time.Duration
		worstCase time.Duration
		ttl       time.Duration
	}{
		{"short window", policy.PlanInput{Window: 10 * time.Second, Backoff: short, AttemptTimeout: 2 * time.Second},
			3, []time.Duration{500 * ms, time.Second}, 7500 * ms, 12 * time.Second}, // default margin: one attempt timeout
		{"capped by max attempts", policy.PlanInput{Window: 10 * time.Second, Backoff: short, AttemptTimeout: 2 * time.Second, MaxAttempts: 2},
			2, []time.Duration{500 * ms}, 4500 * ms, 12 * time.Second},
		{"no attempt timeout", policy.PlanInput{Window: time.Second, Backoff: policy.Backoff{Base: 100 * ms, Factor: 2, Max: time.Second}},
			4, []time.Duration{100 * ms, 200 * ms, 400 * ms}, 700 * ms, 1100 * ms}, // default margin: a tenth of the window
		{"one attempt fills the window", policy.PlanInput{Window: time.Minute, Backoff: def, AttemptTimeout: time.Minute, TTLMargin: time.Hour},
			1, []time.Duration{}, time.Minute, time.Hour + time.Minute},
		{"capped at 100 attempts", policy.PlanInput{Window: 72 * time.Hour, Backoff: policy.Backoff{Base: ms, Factor: 2, Max: ms}},
			100, slices.Repeat([]time.Duration{ms}, 99), 99 * ms, 72*time.Hour + 432*time.Minute},
		{"tiny window", policy.PlanInput{Window: 5 * time.Nanosecond, Backoff: policy.Backoff{Base: 1, Factor: 2, Max: 1}, MaxAttempts: 1},
			1, []time.Duration{}, 0, 5*time.Nanosecond + ms}, // default margin: at least 1ms
		{"largest ttl", policy.PlanInput{Window: time.Hour, Backoff: def, AttemptTimeout: time.Hour, TTLMargin: maxDuration - time.Hour},
			1, []time.Duration{}, time.Hour, maxDuration},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := policy.PlanBudget(tt.in)
			if err != nil {
				t.Fatalf("PlanBudget(%+v) error = %v, want nil", tt.in, err)
			}
			if got.MaxAttempts != tt.attempts || !slices.Equal(got.Delays, tt.delays) || got.WorstCase != tt.worstCase || got.IdempotencyTTL != tt.ttl {
				t.Errorf("PlanBudget(%+v) = %+v, want %d attempts, delays %v, worst case %v, TTL %v", tt.in, got, tt.attempts, tt.delays, tt.worstCase, tt.ttl)
			}
		})
	}
}

func TestPlanBudgetErrors(t *testing.T) {
	def := policy.Default().Backoff
	tests := []struct {
		name string
		in   policy.PlanInput
		want string
	}{
		{"attempt timeout beyond window", policy.PlanInput{Window: time.Minute, Backoff: def, AttemptTimeout: time.Minute + 1}, "attempt_timeout: must not exceed window"},
		{"no window", policy.PlanInput{Backoff: def}, "window: must be > 0"},
		{"max delay beyond window", policy.PlanInput{Window: 10 * time.Second, Backoff: def}, "backoff.max_delay: must not exceed window"},
		{"invalid backoff", policy.PlanInput{Window: time.Minute, Backoff: policy.Backoff{Base: time.Second, Factor: 1, Max: time.Second}}, "backoff.factor: must be > 1"},
		{"negative reserve", policy.PlanInput{Window: time.Minute, Backoff: policy.Backoff{Base: time.Second, Factor: 2, Max: time.Second}, Reserve: -0.1}, "reserve: must be in [0, 1)"},
		{"reserve of one", policy.PlanInput{Window: time.Minute, Backoff: policy.Backoff{Base: time.Second, Factor: 2, Max: time.Second}, Reserve: 1}, "reserve: must be in [0, 1)"},
		{"NaN reserve", policy.PlanInput{Window: time.Minute, Backoff: policy.Backoff{Base: time.Second, Factor: 2, Max: time.Second}, Reserve: math.NaN()}, "reserve: must be in [0, 1)"},
		{"infinite reserve", policy.PlanInput{Window: time.Minute, Backoff: policy.Backoff{Base: time.Second, Factor: 2, Max: time.Second}, Reserve: math.Inf(-1)}, "reserve: must be in [0, 1)"},
		{"no room for the default margin", policy.PlanInput{Window: maxDuration, Backoff: def}, "window: too long for window + the default ttl_margin to be a duration; give ttl_margin"},
		{"origin without now", policy.PlanInput{Window: time.Minute, Backoff: policy.Backoff{Base: time.Second, Factor: 2, Max: time.Second}, Origin: time.Unix(1, 0)},
			"origin_time: needs the time of planning (Now)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := policy.PlanBudget(tt.in)
			var fe *policy.FieldError
			if !errors.As(err, &fe) || err.Error() != tt.want {
				t.Errorf("PlanBudget(%+v) error = %v, want *FieldError %q", tt.in, err, tt.want)
			}
		})
	}
}

// randomPlanInput returns a valid plan request with random numbers.
func randomPlanInput(r *rand.Rand) policy.PlanInput {
	window := time.Duration(1 + r.Int64N(int64(100*time.Hour)))
	base := time.Duration(1 + r.Int64N(int64(window)))
	return policy.PlanInput{
		Window:         window,
		Backoff:        policy.Backoff{Base: base, Factor: 1 + 99*r.Float64() + 1e-9, Max: base + time.Duration(r.Int64N(int64(window-base)+1))},
		AttemptTimeout: time.Duration(r.Int64N(int64(window) / int64(1+r.IntN(50)))),
		TTLMargin:      time.Duration(r.Int64N(int64(24*time.Hour))) * time.Duration(r.IntN(2)),
		MaxAttempts:    r.IntN(101),
	}
}

// withRemaining gives in, half the time, an origin up to 1.2 windows before
// (or a little after) a fixed now, and a reserve.
func withRemaining(r *rand.Rand, in policy.PlanInput) policy.PlanInput {
	if r.IntN(2) == 0 {
		return in
	}
	in.Now = time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	in.Origin = in.Now.Add(-time.Duration(r.Int64N(int64(in.Window)/5*6)) + time.Duration(r.Int64N(int64(time.Minute))))
	in.Reserve = []float64{0, 0.5, 0.999, r.Float64()}[r.IntN(4)]
	return in
}

func TestPlanBudgetProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for range 20000 {
		in := withRemaining(r, randomPlanInput(r))
		got, err := policy.PlanBudget(in)
		if err != nil {
			t.Fatalf("PlanBudget(%+v) error = %v, want nil", in, err)
		}
		checkPlan(t, in, got)
	}
}

// checkPlan checks the invariants of a plan made for in.
func checkPlan(t *testing.T, in policy.PlanInput, got policy.Plan) {
	t.Helper()
	remaining := in.Window
	if elapsed := in.Now.Sub(in.Origin); !in.Origin.IsZero() && elapsed > 0 {
		remaining = max(in.Window-elapsed, 0)
	}
	if got.Remaining != remaining {
		t.Fatalf("PlanBudget(%+v).Remaining = %v, want %v", in, got.Remaining, remaining)
	}
	reserved := float64(remaining) * (1 - in.Reserve)
	if got.Usable > remaining || float64(got.Usable) > reserved || float64(got.Usable) < reserved-float64(remaining)*1e-15-1 {
		t.Fatalf("PlanBudget(%+v).Usable = %v, want remaining %v * (1 - %v) = %v", in, got.Usable, remaining, in.Reserve, reserved)
	}
	margin := in.TTLMargin
	if margin == 0 {
		margin = max(in.AttemptTimeout, in.Window/10, time.Millisecond)
	}
	if got.IdempotencyTTL != remaining+margin || got.IdempotencyTTL <= remaining {
		t.Fatalf("PlanBudget(%+v).IdempotencyTTL = %v, want remaining %v + margin %v, > remaining", in, got.IdempotencyTTL, remaining, margin)
	}
	if got.MaxAttempts == 0 {
		want := policy.PlanNoRoom
		if remaining == 0 {
			want = policy.PlanWindowSpent
		}
		if got.Reason != want || len(got.Delays) != 0 || got.WorstCase != 0 || in.AttemptTimeout <= got.Usable && remaining > 0 {
			t.Fatalf("PlanBudget(%+v) = %+v: no attempt, want reason %q, no delays, and no room for one", in, got, want)
		}
		return
	}
	if got.Reason != "" {
		t.Fatalf("PlanBudget(%+v).Reason = %q with %d attempts, want none", in, got.Reason, got.MaxAttempts)
	}
	if got.WorstCase > got.Usable {
		t.Fatalf("PlanBudget(%+v).WorstCase = %v, want <= usable %v", in, got.WorstCase, got.Usable)
	}
	if got.MaxAttempts < 1 || (in.MaxAttempts > 0 && got.MaxAttempts > in.MaxAttempts) || got.MaxAttempts > 100 {
		t.Fatalf("PlanBudget(%+v).MaxAttempts = %d, want in [1, cap]", in, got.MaxAttempts)
	}
	if len(got.Delays) != got.MaxAttempts-1 {
		t.Fatalf("PlanBudget(%+v) has %d delays, want %d", in, len(got.Delays), got.MaxAttempts-1)
	}
	sum := time.Duration(got.MaxAttempts) * in.AttemptTimeout
	for n, d := range got.Delays {
		if d != policy.Nominal(in.Backoff, n) {
			t.Fatalf("PlanBudget(%+v).Delays[%d] = %v, want nominal %v", in, n, d, policy.Nominal(in.Backoff, n))
		}
		sum += d
	}
	if sum != got.WorstCase {
		t.Fatalf("PlanBudget(%+v).WorstCase = %v, want the sum %v", in, got.WorstCase, sum)
	}
	limit := in.MaxAttempts
	if limit == 0 {
		limit = 100
	}
	// One more attempt must not fit (compared with what is left, so that sums
	// near the largest Duration do not overflow).
	left, step := got.Usable-sum, policy.Nominal(in.Backoff, got.MaxAttempts-1)
	if got.MaxAttempts < limit && step <= left && in.AttemptTimeout <= left-step {
		t.Fatalf("PlanBudget(%+v).MaxAttempts = %d, but %d attempts fit too", in, got.MaxAttempts, got.MaxAttempts+1)
	}
}

func TestPlanBudgetRemaining(t *testing.T) {
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	in := policy.PlanInput{
		Window:         72 * time.Hour,
		Backoff:        policy.Backoff{Base: 2 * time.Second, Factor: 2, Max: time.Hour},
		AttemptTimeout: 30 * time.Second,
		TTLMargin:      6 * time.Hour,
		Now:            now,
	}
	// m attempts take m*30s + (2^m - 2)s while the delays double (m <= 12),
	// then 3630s more each: see TestPlanBudgetKnownSchedule.
	tests := []struct {
		name      string
		since     time.Duration // now - origin; 0 for no origin
		reserve   float64
		attempts  int
		worstCase time.Duration
		usable    time.Duration
		ttl       time.Duration
		reason    string
	}{
		{"71h into 72h", 71 * time.Hour, 0, 11, 2376 * time.Second, time.Hour, 7 * time.Hour, ""}, // 12 would take 4454s
		{"reserve half", 0, 0.5, 46, 127874 * time.Second, 36 * time.Hour, 78 * time.Hour, ""},    // 4454s + 34*3630s <= 129600s
		{"71h in, reserve half", 71 * time.Hour, 0.5, 10, 1322 * time.Second, 30 * time.Minute, 7 * time.Hour, ""},
		{"origin ahead of now", -time.Minute, 0, 82, 258554 * time.Second, 72 * time.Hour, 78 * time.Hour, ""},
		{"10s left", 72*time.Hour - 10*time.Second, 0, 0, 0, 10 * time.Second, 6*time.Hour + 10*time.Second, policy.PlanNoRoom},
		{"reserve leaves no room", 72*time.Hour - time.Minute, 0.75, 0, 0, 15 * time.Second, 6*time.Hour + time.Minute, policy.PlanNoRoom},
		{"window spent", 72 * time.Hour, 0, 0, 0, 0, 6 * time.Hour, policy.PlanWindowSpent},
		{"long spent", 100 * time.Hour, 0.5, 0, 0, 0, 6 * time.Hour, policy.PlanWindowSpent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := in
			if tt.since != 0 {
				in.Origin = now.Add(-tt.since)
			}
			in.Reserve = tt.reserve
			got, err := policy.PlanBudget(in)
			if err != nil {
				t.Fatalf("PlanBudget(%+v) error = %v, want nil", in, err)
			}
			if got.MaxAttempts != tt.attempts || got.WorstCase != tt.worstCase || got.Usable != tt.usable || got.IdempotencyTTL != tt.ttl || got.Reason != tt.reason {
				t.Errorf("PlanBudget() = %d attempts, worst case %v, usable %v, TTL %v, reason %q; want %d, %v, %v, %v, %q",
					got.MaxAttempts, got.WorstCase, got.Usable, got.IdempotencyTTL, got.Reason, tt.attempts, tt.worstCase, tt.usable, tt.ttl, tt.reason)
			}
			checkPlan(t, in, got)
		})
	}
}

func TestSplitHops(t *testing.T) {
	in := policy.PlanInput{
		Window:         10 * time.Minute,
		Backoff:        policy.Backoff{Base: 500 * time.Millisecond, Factor: 2, Max: 30 * time.Second},
		AttemptTimeout: time.Minute,
		TTLMargin:      time.Hour,
	}
	plans, err := policy.SplitHops(in, 3)
	if err != nil {
		t.Fatalf("SplitHops() error = %v, want nil", err)
	}
	// W2 = 60s - 6s = 54s; A2 = 60s*54s/600s = 5.4s; W3 = 5.4s - 540ms = 4.86s.
	wantWindows := []time.Duration{10 * time.Minute, 54 * time.Second, 4860 * time.Millisecond}
	for i, p := range plans {
		if p.Window != wantWindows[i] {
			t.Errorf("hop %d window = %v, want %v", i+1, p.Window, wantWindows[i])
		}
	}
	if len(plans) != 3 {
		t.Fatalf("SplitHops() gave %d plans, want 3", len(plans))
	}
	single, err := policy.SplitHops(in, 1)
	want, _ := policy.PlanBudget(in)
	if err != nil || len(single) != 1 || single[0].WorstCase != want.WorstCase || single[0].MaxAttempts != want.MaxAttempts {
		t.Errorf("SplitHops(in, 1) = %+v, %v, want [%+v]", single, err, want)
	}
}

func TestSplitHopsErrors(t *testing.T) {
	base := policy.PlanInput{Window: time.Minute, Backoff: policy.Default().Backoff, AttemptTimeout: 10 * time.Second}
	tests := []struct {
		name string
		in   policy.PlanInput
		hops int
		want string
	}{
		{"zero hops", base, 0, "hops: must be between 1 and 16"},
		{"17 hops", base, 17, "hops: must be between 1 and 16"},
		{"no attempt timeout", policy.PlanInput{Window: time.Minute, Backoff: base.Backoff}, 2, "attempt_timeout: must be > 0 when hops > 1"},
		{"attempt timeout too short", policy.PlanInput{Window: time.Minute, Backoff: policy.Backoff{Base: time.Millisecond, Factor: 2, Max: time.Second}, AttemptTimeout: time.Millisecond}, 2,
			"attempt_timeout: too short to leave hop 2 a window"},
		{"invalid outer hop", policy.PlanInput{Window: time.Minute, Backoff: base.Backoff, AttemptTimeout: 2 * time.Minute}, 2, "attempt_timeout: must not exceed window"},
		// W2 = 9s, A2 = 1.5s, W3 = 1.35s, A3 = 225ms, ... A6 = 677µs leaves
		// no room after the 1ms margin.
		{"chain too deep", base, 16, "attempt_timeout: too short to leave hop 7 a window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := policy.SplitHops(tt.in, tt.hops)
			var fe *policy.FieldError
			if !errors.As(err, &fe) || err.Error() != tt.want {
				t.Errorf("SplitHops(%+v, %d) error = %v, want *FieldError %q", tt.in, tt.hops, err, tt.want)
			}
		})
	}
}

func TestSplitHopsProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	planned := 0
	for range 5000 {
		in := withRemaining(r, randomPlanInput(r))
		in.AttemptTimeout = in.Window/time.Duration(1+r.IntN(4)) - time.Duration(r.Int64N(int64(in.Window/10)))
		hops := 1 + r.IntN(16)
		plans, err := policy.SplitHops(in, hops)
		if err != nil {
			var fe *policy.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("SplitHops(%+v, %d) error = %v, want a *FieldError", in, hops, err)
			}
			continue
		}
		planned++
		if len(plans) != hops {
			t.Fatalf("SplitHops(%+v, %d) gave %d plans", in, hops, len(plans))
		}
		for i, p := range plans {
			hop := in
			if i > 0 {
				hop.Origin, hop.Reserve = time.Time{}, 0
			}
			hop.Window = p.Window
			hop.AttemptTimeout = p.AttemptTimeout
			hop.Backoff.Base = min(hop.Backoff.Base, p.Window)
			hop.Backoff.Max = min(hop.Backoff.Max, p.Window)
			checkPlan(t, hop, p)
			if i == 0 {
				if p.Window != in.Window || p.AttemptTimeout != in.AttemptTimeout {
					t.Fatalf("SplitHops(%+v, %d): hop 1 = %+v, want the input's window and attempt timeout", in, hops, p)
				}
				continue
			}
			prev := plans[i-1]
			if p.Window >= prev.AttemptTimeout || p.Window >= prev.Window {
				t.Fatalf("SplitHops(%+v, %d): hop %d window %v, want < hop %d attempt timeout %v and window %v",
					in, hops, i+1, p.Window, i, prev.AttemptTimeout, prev.Window)
			}
			if p.AttemptTimeout <= 0 || p.AttemptTimeout > p.Window {
				t.Fatalf("SplitHops(%+v, %d): hop %d attempt timeout %v, want in (0, %v]", in, hops, i+1, p.AttemptTimeout, p.Window)
			}
			// A(i+1) = floor(A(i) * W(i+1) / W(i)): the proportion holds up to
			// one nanosecond of A(i+1).
			got, want := float64(p.AttemptTimeout)/float64(p.Window), float64(prev.AttemptTimeout)/float64(prev.Window)
			if d := want - got; d < -1e-12 || d > 1/float64(p.Window)+1e-12 {
				t.Fatalf("SplitHops(%+v, %d): hop %d timeout/window = %v, want %v as for hop %d", in, hops, i+1, got, want, i)
			}
		}
	}
	if planned < 1000 {
		t.Errorf("planned %d chains, want at least 1000 to exercise the properties", planned)
	}
}
