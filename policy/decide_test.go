package policy_test

import (
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const stateless = policy.CheckClassification | policy.CheckIdempotency | policy.CheckAttempts | policy.CheckPushback | policy.CheckDeadline

// baseInput is the first failed attempt of an idempotent call with a 503.
func baseInput() policy.Input {
	return policy.Input{Attempt: 1, Failure: httpF(503), Idempotent: true, Now: t0, JitterDraw: 0.5, SpreadDraw: 0}
}

func TestDecide(t *testing.T) {
	def := policy.Default() // 3 attempts, attempt timeout 10s, no call deadline, base 500ms full jitter
	withDeadline := def
	withDeadline.CallDeadline = time.Minute
	noTimeout := def
	noTimeout.AttemptTimeout = 0
	override := def
	override.Pushback.Mode = policy.RetryAfterOverride
	override.MaxAttempts = 10
	many := def
	many.MaxAttempts = 10
	shortHint := def
	shortHint.Pushback.MaxHint = time.Minute

	type want struct {
		retry   bool
		delay   time.Duration
		stop    policy.StopReason
		disp    policy.Disposition
		timeout time.Duration
		checks  policy.Check
	}
	stopped := func(r policy.StopReason, d policy.Disposition, c policy.Check) want {
		return want{stop: r, disp: d, checks: c}
	}
	retried := func(delay, timeout time.Duration) want {
		return want{retry: true, delay: delay, timeout: timeout, checks: stateless}
	}
	tests := []struct {
		name string
		p    *policy.Policy
		in   func(*policy.Input)
		want want
	}{
		{"transient first attempt retries", &def, nil, retried(250*time.Millisecond, 10*time.Second)},
		{"second attempt uses retry 1", &def, func(in *policy.Input) { in.Attempt = 2 }, retried(500*time.Millisecond, 10*time.Second)},
		{"attempt 0 counts as the first", &def, func(in *policy.Input) { in.Attempt = 0 }, retried(250*time.Millisecond, 10*time.Second)},
		{"nil policy is the default", nil, nil, retried(250*time.Millisecond, 10*time.Second)},
		// 1 classification
		{"terminal stops", &def, func(in *policy.Input) { in.Failure = httpF(422) },
			stopped(policy.StopTerminal, policy.DispositionFailedTerminal, policy.CheckClassification)},
		{"unclassified stops as terminal", &def, func(in *policy.Input) { in.Failure = httpF(418) },
			stopped(policy.StopTerminal, policy.DispositionFailedTerminal, policy.CheckClassification)},
		{"terminal before exhausted attempts", &def, func(in *policy.Input) { in.Failure = grpcF(5); in.Attempt = 9 },
			stopped(policy.StopTerminal, policy.DispositionFailedTerminal, policy.CheckClassification)},
		// 2 idempotency
		{"not idempotent stops", &def, func(in *policy.Input) { in.Idempotent = false },
			stopped(policy.StopNotIdempotent, policy.DispositionDeadLetter, policy.CheckClassification|policy.CheckIdempotency)},
		{"idempotency key makes it safe", &def, func(in *policy.Input) { in.Idempotent = false; in.HasIdempotencyKey = true },
			retried(250*time.Millisecond, 10*time.Second)},
		{"refused connection is safe", &def, func(in *policy.Input) {
			in.Idempotent = false
			in.Failure = transportF(policy.TransportConnectionRefused)
		}, retried(250*time.Millisecond, 10*time.Second)},
		{"not idempotent before exhausted attempts", &def, func(in *policy.Input) { in.Idempotent = false; in.Attempt = 3 },
			stopped(policy.StopNotIdempotent, policy.DispositionDeadLetter, policy.CheckClassification|policy.CheckIdempotency)},
		// 3 attempts
		{"attempts exhausted", &def, func(in *policy.Input) { in.Attempt = 3 },
			stopped(policy.StopAttemptsExhausted, policy.DispositionDeadLetter, policy.CheckClassification|policy.CheckIdempotency|policy.CheckAttempts)},
		{"exhausted before pushback", &def, func(in *policy.Input) { in.Attempt = 3; in.Hints.GRPCPushbackMs = "-1" },
			stopped(policy.StopAttemptsExhausted, policy.DispositionDeadLetter, policy.CheckClassification|policy.CheckIdempotency|policy.CheckAttempts)},
		// 4 pushback
		{"server says do not retry", &def, func(in *policy.Input) { in.Hints.GRPCPushbackMs = "-1" },
			stopped(policy.StopServerPushback, policy.DispositionDeadLetter, policy.CheckClassification|policy.CheckIdempotency|policy.CheckAttempts|policy.CheckPushback)},
		{"do not retry before the deadline", &withDeadline, func(in *policy.Input) { in.Hints.GRPCPushbackMs = "-1"; in.Origin = t0.Add(-time.Hour) },
			stopped(policy.StopServerPushback, policy.DispositionDeadLetter, policy.CheckClassification|policy.CheckIdempotency|policy.CheckAttempts|policy.CheckPushback)},
		{"max mode: hint above jitter", &def, func(in *policy.Input) { in.Hints.RetryAfter = "20" }, retried(20*time.Second, 10*time.Second)},
		{"max mode: hint spread", &def, func(in *policy.Input) { in.Hints.RetryAfter = "20"; in.SpreadDraw = 0.5 }, retried(21*time.Second, 10*time.Second)},
		{"max mode: jitter above hint", &many, func(in *policy.Input) { in.Attempt = 6; in.Hints.RetryAfter = "1" }, retried(8*time.Second, 10*time.Second)},
		{"override mode: hint below jitter", &override, func(in *policy.Input) { in.Attempt = 6; in.Hints.RetryAfter = "1" }, retried(time.Second, 10*time.Second)},
		{"unparseable hint falls back to backoff", &def, func(in *policy.Input) { in.Hints.RetryAfter = "soon" }, retried(250*time.Millisecond, 10*time.Second)},
		{"hint capped at max hint", &def, func(in *policy.Input) { in.Hints.RetryAfter = "7200"; in.SpreadDraw = 0.5 }, retried(time.Hour+180*time.Second, 10*time.Second)},
		// 5 deadline
		{"attempt timeout reserved", &def, func(in *policy.Input) { in.Deadline = t0.Add(5 * time.Second) },
			stopped(policy.StopDeadline, policy.DispositionDeadLetter, stateless)},
		{"exactly fits", &def, func(in *policy.Input) { in.Deadline = t0.Add(10*time.Second + 250*time.Millisecond) }, retried(250*time.Millisecond, 10*time.Second)},
		{"one nanosecond short", &def, func(in *policy.Input) { in.Deadline = t0.Add(10*time.Second + 250*time.Millisecond - 1) },
			stopped(policy.StopDeadline, policy.DispositionDeadLetter, stateless)},
		{"deadline already passed", &def, func(in *policy.Input) { in.Deadline = t0.Add(-time.Second) },
			stopped(policy.StopDeadline, policy.DispositionDeadLetter, stateless)},
		{"hint would pass the deadline", &def, func(in *policy.Input) { in.Hints.RetryAfter = "60"; in.Deadline = t0.Add(65 * time.Second) },
			stopped(policy.StopDeadline, policy.DispositionDeadLetter, stateless)},
		{"capped hint fits but the server's wait does not", &shortHint, func(in *policy.Input) { in.Hints.RetryAfter = "600"; in.Deadline = t0.Add(5 * time.Minute) },
			stopped(policy.StopDeadline, policy.DispositionDeadLetter, stateless)},
		{"call deadline anchored to origin", &withDeadline, func(in *policy.Input) { in.Origin = t0.Add(-55 * time.Second) },
			stopped(policy.StopDeadline, policy.DispositionDeadLetter, stateless)},
		{"call deadline from now without origin", &withDeadline, nil, retried(250*time.Millisecond, 10*time.Second)},
		{"explicit deadline wins over call deadline", &withDeadline, func(in *policy.Input) { in.Deadline = t0.Add(time.Hour); in.Origin = t0.Add(-55 * time.Second) },
			retried(250*time.Millisecond, 10*time.Second)},
		{"no attempt timeout takes what is left", &noTimeout, func(in *policy.Input) { in.Deadline = t0.Add(5 * time.Second) },
			retried(250*time.Millisecond, 4750*time.Millisecond)},
		{"no attempt timeout and no deadline", &noTimeout, nil, retried(250*time.Millisecond, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := baseInput()
			if tt.in != nil {
				tt.in(&in)
			}
			d := policy.Decide(tt.p, in)
			got := want{retry: d.Retry, delay: d.Delay, stop: d.Stop, disp: d.Disposition, timeout: d.AttemptTimeout, checks: d.Checks}
			if got != tt.want {
				t.Errorf("Decide() = %+v (checks %v), want %+v (checks %v)", got, got.checks, tt.want, tt.want.checks)
			}
		})
	}
}

func TestDecideDetails(t *testing.T) {
	p := policy.Default()
	p.CallDeadline = time.Minute
	in := baseInput()
	in.Origin = t0.Add(-10 * time.Second)
	in.Hints.RetryAfter = "3"
	d := policy.Decide(&p, in)
	if want := t0.Add(50 * time.Second); !d.Deadline.Equal(want) {
		t.Errorf("Deadline = %v, want %v", d.Deadline, want)
	}
	if want := (policy.Classification{Retryable: true, Category: policy.CategoryTransient, Reason: "transient:503"}); d.Class != want {
		t.Errorf("Class = %+v, want %+v", d.Class, want)
	}
	if want := (policy.Hint{Present: true, Delay: 3 * time.Second, Source: "retry_after", Note: "retry_after:used"}); d.Hint != want {
		t.Errorf("Hint = %+v, want %+v", d.Hint, want)
	}
	if got, want := d.Checks.Names(), []string{"classification", "idempotency", "attempts", "pushback", "deadline"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Checks.Names() = %v, want %v", got, want)
	}
}

func TestCheckNames(t *testing.T) {
	all := policy.Check(0xffff)
	want := []string{"classification", "idempotency", "attempts", "pushback", "deadline", "breaker", "tenant_budget", "run_budget"}
	if got := all.Names(); !reflect.DeepEqual(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
	if got := (policy.CheckBreaker | policy.CheckClassification).String(); got != "classification,breaker" {
		t.Errorf("String() = %q, want %q", got, "classification,breaker")
	}
	if got := policy.Check(0).Names(); len(got) != 0 {
		t.Errorf("Check(0).Names() = %v, want none", got)
	}
}

func TestEffectiveDeadline(t *testing.T) {
	none := policy.Default()
	minute := policy.Default()
	minute.CallDeadline = time.Minute
	origin := t0.Add(-20 * time.Second)
	explicit := t0.Add(time.Hour)
	tests := []struct {
		name             string
		p                *policy.Policy
		origin, deadline time.Time
		want             time.Time
	}{
		{"explicit deadline", &minute, origin, explicit, explicit},
		{"from origin", &minute, origin, time.Time{}, origin.Add(time.Minute)},
		{"from now without origin", &minute, time.Time{}, time.Time{}, t0.Add(time.Minute)},
		{"no call deadline", &none, origin, time.Time{}, time.Time{}},
		{"explicit without call deadline", &none, time.Time{}, explicit, explicit},
		{"nil policy", nil, origin, time.Time{}, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := policy.EffectiveDeadline(tt.p, t0, tt.origin, tt.deadline); !got.Equal(tt.want) {
				t.Errorf("EffectiveDeadline() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFitsDeadline(t *testing.T) {
	tests := []struct {
		name           string
		deadline       time.Time
		delay, timeout time.Duration
		want           bool
	}{
		{"no deadline", time.Time{}, maxDuration, maxDuration, true},
		{"fits", t0.Add(time.Minute), 10 * time.Second, 10 * time.Second, true},
		{"exactly", t0.Add(time.Minute), 50 * time.Second, 10 * time.Second, true},
		{"too late", t0.Add(time.Minute), 50 * time.Second, 10*time.Second + 1, false},
		{"past deadline", t0.Add(-time.Second), 0, 0, false},
		{"now is the deadline", t0, 0, 0, true},
		{"huge durations saturate", t0.Add(time.Hour), maxDuration, maxDuration, false},
		{"negative durations count as 0", t0.Add(time.Second), -time.Hour, -time.Hour, true},
		{"deadline centuries away", time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), 100 * 365 * 24 * time.Hour, time.Hour, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := policy.FitsDeadline(t0, tt.deadline, tt.delay, tt.timeout); got != tt.want {
				t.Errorf("FitsDeadline(%v, %v, %v) = %v, want %v", tt.deadline, tt.delay, tt.timeout, got, tt.want)
			}
		})
	}
}

func TestDecideDoesNotAllocateWithoutHints(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	p := policy.Default()
	p.CallDeadline = time.Minute
	inputs := []policy.Input{baseInput(), {Attempt: 3, Failure: httpF(503), Idempotent: true, Now: t0}, {Attempt: 1, Failure: httpF(418), Now: t0}}
	for _, in := range inputs {
		got := testing.AllocsPerRun(100, func() { _ = policy.Decide(&p, in) })
		if got != 0 {
			t.Errorf("Decide(%+v) allocs = %v, want 0", in, got)
		}
	}
}

// randomPolicy returns a valid policy with random numbers.
func randomPolicy(r *rand.Rand) policy.Policy {
	p := policy.Default()
	p.Backoff = randomBackoff(r, policy.Jitter(r.IntN(5)))
	p.Backoff.Base = time.Duration(1 + r.Int64N(int64(10*time.Second)))
	p.Backoff.Max = p.Backoff.Base + time.Duration(r.Int64N(int64(5*time.Minute)))
	p.Pushback = policy.Pushback{
		Mode:        policy.RetryAfterMode(r.IntN(3)),
		SpreadRatio: r.Float64(),
		MinSpread:   time.Duration(r.Int64N(int64(time.Second))),
		MaxHint:     time.Duration(1 + r.Int64N(int64(time.Hour))),
	}
	p.MaxAttempts = 1 + r.IntN(100)
	p.AttemptTimeout = time.Duration(r.Int64N(int64(time.Minute)))
	if r.IntN(2) == 0 {
		p.CallDeadline = max(p.Backoff.Max, p.AttemptTimeout) + time.Duration(r.Int64N(int64(time.Hour)))
	}
	return p
}

// randomInput returns a transient failure with random timing and hints.
func randomInput(r *rand.Rand, p *policy.Policy) policy.Input {
	in := policy.Input{
		Attempt:    1 + r.IntN(p.MaxAttempts+1),
		Failure:    httpF(503),
		Idempotent: true,
		PrevDelay:  time.Duration(r.Int64N(int64(time.Minute))),
		Now:        t0,
		JitterDraw: r.Float64(),
		SpreadDraw: r.Float64(),
	}
	if r.IntN(2) == 0 {
		in.Origin = t0.Add(-time.Duration(r.Int64N(int64(time.Hour))))
	}
	if r.IntN(3) == 0 {
		in.Deadline = t0.Add(time.Duration(r.Int64N(int64(2*time.Hour))) - time.Minute)
	}
	switch r.IntN(4) {
	case 0:
		in.Hints.RetryAfter = strconv.Itoa(r.IntN(3600))
	case 1:
		in.Hints.RetryAfter = t0.Add(time.Duration(r.Int64N(int64(time.Hour)))).Format(time.RFC1123)
	case 2:
		in.Hints.XAmzRetryAfter = strconv.Itoa(r.IntN(100000))
	}
	return in
}

func TestDecideProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	retries, hinted := 0, 0
	for range 50000 {
		p := randomPolicy(r)
		in := randomInput(r, &p)
		d := policy.Decide(&p, in)
		if !d.Retry {
			if d.Stop == policy.StopNone || d.Disposition == policy.DispositionNone || d.Delay != 0 {
				t.Fatalf("Decide(%+v, %+v) = %+v, a stop without reason or with a delay", p, in, d)
			}
			continue
		}
		retries++
		if d.Stop != policy.StopNone || d.Disposition != policy.DispositionNone {
			t.Fatalf("Decide(%+v, %+v) = %+v, a retry with a stop reason", p, in, d)
		}
		if !d.Deadline.IsZero() && t0.Add(d.Delay).Add(d.AttemptTimeout).After(d.Deadline) {
			t.Fatalf("Decide(%+v, %+v) = %+v: now+delay+timeout %v is past the deadline %v", p, in, d, t0.Add(d.Delay+d.AttemptTimeout), d.Deadline)
		}
		if !d.Deadline.IsZero() && t0.Add(d.Delay).Add(p.AttemptTimeout).After(d.Deadline) {
			t.Fatalf("Decide(%+v, %+v) = %+v: the policy's attempt timeout was not reserved", p, in, d)
		}
		if d.Hint.Present {
			hinted++
			if d.Hint.Delay <= p.Pushback.MaxHint && d.Delay < d.Hint.Delay {
				t.Fatalf("Decide(%+v, %+v) = %+v: delay %v is below the server's hint %v", p, in, d, d.Delay, d.Hint.Delay)
			}
		} else if nominal := policy.Nominal(p.Backoff, in.Attempt-1); d.Delay > nominal {
			t.Fatalf("Decide(%+v, %+v) = %+v: delay %v is above nominal %v", p, in, d, d.Delay, nominal)
		}
	}
	if retries < 1000 || hinted < 500 {
		t.Errorf("retries = %d, hinted retries = %d, want at least 1000 and 500 to exercise the properties", retries, hinted)
	}
}

func TestSameHintDoesNotSynchronise(t *testing.T) {
	p := policy.Default()
	r := rand.New(rand.NewPCG(9, 10))
	const hint = 30 * time.Second
	seen := map[time.Duration]bool{}
	for i := range 100 {
		in := baseInput()
		in.Hints.RetryAfter = "30"
		in.JitterDraw = r.Float64()
		in.SpreadDraw = r.Float64()
		d := policy.Decide(&p, in)
		if !d.Retry || d.Delay < hint {
			t.Fatalf("caller %d: Decide() = retry %v, delay %v, want a retry of at least %v", i, d.Retry, d.Delay, hint)
		}
		seen[d.Delay] = true
	}
	if len(seen) < 90 {
		t.Errorf("100 callers got %d distinct delays, want at least 90", len(seen))
	}
}

// TestDecideHonoursHugeHintsUpToMaxHint: a valid hint longer than the
// maximum hint is honoured up to it, and the note says it was capped.
func TestDecideHonoursHugeHintsUpToMaxHint(t *testing.T) {
	p := policy.Default() // max hint 1h, spread 10%
	tests := []struct {
		name  string
		hints policy.Hints
		note  string
	}{
		{"retry-after 99999999999", policy.Hints{RetryAfter: "99999999999"}, "retry_after:used:capped"},
		{"retry-after in year 9999", policy.Hints{RetryAfter: "Fri, 31 Dec 9999 23:59:59 GMT"}, "retry_after:used:capped"},
		{"x-ratelimit-reset far ahead", policy.Hints{XRateLimitReset: "99999999999999"}, "x_ratelimit_reset:used:capped"},
		{"grpc-retry-pushback-ms at int64 max", policy.Hints{GRPCPushbackMs: "9223372036854775807"}, "grpc_retry_pushback_ms:used:capped"},
		{"x-amz-retry-after 10^18", policy.Hints{XAmzRetryAfter: "1000000000000000000"}, "x_amz_retry_after:used:capped"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := baseInput()
			in.Hints, in.SpreadDraw = tt.hints, 0.99
			d := policy.Decide(&p, in)
			if !d.Retry || d.Delay < time.Hour || d.Delay > time.Hour+6*time.Minute {
				t.Errorf("Decide = retry %v, delay %v (stop %v); want a retry after 1h to 1h6m", d.Retry, d.Delay, d.Stop)
			}
			if !d.Hint.Capped || d.Hint.Note != tt.note {
				t.Errorf("Hint = %+v, want capped with note %q", d.Hint, tt.note)
			}
		})
	}
	// grpc-retry-pushback-ms "-0" is a zero wait, not a do-not-retry.
	in := baseInput()
	in.Hints.GRPCPushbackMs = "-0"
	if d := policy.Decide(&p, in); !d.Retry || d.Hint.DoNotRetry || d.Hint.Note != "grpc_retry_pushback_ms:used" {
		t.Errorf("Decide with -0 = retry %v, stop %v, hint %+v; want a retry with the hint used", d.Retry, d.Stop, d.Hint)
	}
}
