package policy_test

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// fuzzNow maps a fuzzed number to a time between 1970 and 9999.
func fuzzNow(sec int64) time.Time {
	const span = 253402300799 // 9999-12-31T23:59:59Z
	if sec < 0 {
		sec = -(sec + 1)
	}
	return time.Unix(sec%span, 0).UTC()
}

func FuzzParseRetryAfter(f *testing.F) {
	seeds := []string{
		"120", "  120  ", "0", "-5", "+5", "1.5", "", " ", "1000000000", "1000000001",
		"99999999999999999999999999", "Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT",
		"Sun Nov  6 08:49:37 1994", "Fri, 31 Dec 9999 23:59:59 GMT", "Sun, 06 Nov 1994 08:49:37 UTC",
		"Mon, 01 Jan 0001 00:00:00 GMT", "soon", "\t7\n", "Thu, 29 Feb 2024 00:00:00 GMT",
		// The edges: huge but valid values saturate, "-0" is zero.
		"99999999999", "9223372036854775807", "9223372036854775808", "-0", "-000", "-9223372036854775808",
		"Fri Dec 31 23:59:59 9999", "Friday, 31-Dec-99 23:59:59 GMT", "1e18",
	}
	for _, s := range seeds {
		f.Add(s, rfcNow.Unix())
		f.Add(s, int64(1_800_000_000))
	}
	f.Fuzz(func(t *testing.T, v string, nowSec int64) {
		now := fuzzNow(nowSec)
		d, err := policy.ParseRetryAfter(v, now)
		if err != nil {
			neg, bad := errors.Is(err, policy.ErrHintNegative), errors.Is(err, policy.ErrHintUnparseable)
			if neg == bad || d != 0 {
				t.Fatalf("ParseRetryAfter(%q) = %v, %v; want 0 and an error wrapping exactly one sentinel", v, d, err)
			}
		} else if d < 0 || d > policy.MaxHintDelay {
			t.Fatalf("ParseRetryAfter(%q) = %v, want in [0, %v]", v, d, policy.MaxHintDelay)
		}
		s := strings.TrimSpace(v)
		// Delta-seconds agree with strconv; longer ones, of any length,
		// saturate.
		if n, e := strconv.ParseUint(s, 10, 64); e == nil && n <= 1_000_000_000 {
			if err != nil || d != time.Duration(n)*time.Second {
				t.Fatalf("ParseRetryAfter(%q) = %v, %v; want %ds", v, d, err, n)
			}
		} else if s != "" && strings.Trim(s, "0123456789") == "" && (err != nil || d != policy.MaxHintDelay) {
			t.Fatalf("ParseRetryAfter(%q) = %v, %v; want %v", v, d, err, policy.MaxHintDelay)
		}
		// IMF-fixdate and asctime agree with net/http; RFC 850 differs on
		// purpose (net/http accepts any zone and pivots two-digit years at 69).
		if c := strings.IndexByte(s, ','); c == 3 || c < 0 {
			ht, herr := http.ParseTime(s)
			if herr == nil && ht.Location() == time.UTC {
				want := min(max(ht.Sub(now), 0), policy.MaxHintDelay)
				if err != nil || d != want {
					t.Fatalf("ParseRetryAfter(%q) = %v, %v; net/http reads %v, want %v", v, d, err, ht, want)
				}
			}
			if err == nil && s != "" && s[0] != '-' && (s[0] < '0' || s[0] > '9') && herr != nil {
				t.Fatalf("ParseRetryAfter(%q) = %v, but net/http rejects it: %v", v, d, herr)
			}
		}
	})
}

func FuzzParseHints(f *testing.F) {
	f.Add("120", "", "", "", rfcNow.Unix())
	f.Add("5", "7000", "3", "6500", rfcNow.Unix())
	f.Add("60", "-1", "", "90000", rfcNow.Unix())
	f.Add("x", "abc", "-1", "-250", rfcNow.Unix())
	f.Add("Sun, 06 Nov 1994 08:49:37 GMT", "", strconv.FormatInt(rfcNow.Unix()+90, 10), "", rfcNow.Unix())
	f.Add("", "99999999999999999999", "99999999999", "1000000000000", int64(0))
	f.Add(" 2 ", " 2000 ", "2", "2000", int64(1_800_000_000))
	// The edges: valid but huge values are capped, "-0" is zero.
	f.Add("99999999999", "9223372036854775807", "99999999999999", "1000000000000000000", int64(1_800_000_000))
	f.Add("Fri, 31 Dec 9999 23:59:59 GMT", "-0", "", "1e18", int64(1_800_000_000))
	f.Add("", "-9223372036854775808", "", "", int64(1_800_000_000))
	f.Fuzz(func(t *testing.T, ra, grpc, reset, amz string, nowSec int64) {
		now := fuzzNow(nowSec)
		h := policy.Hints{RetryAfter: ra, GRPCPushbackMs: grpc, XRateLimitReset: reset, XAmzRetryAfter: amz}
		const maxHint = time.Hour
		got := policy.ParseHints(h, now, maxHint)
		if got.Delay < 0 || got.Delay > policy.MaxHintDelay {
			t.Fatalf("ParseHints(%+v).Delay = %v, want in [0, %v]", h, got.Delay, policy.MaxHintDelay)
		}
		if got.Capped != (got.Present && !got.DoNotRetry && got.Delay > maxHint) || got.Capped != strings.Contains(got.Note, ":used:capped") {
			t.Fatalf("ParseHints(%+v) = %+v, capped inconsistently", h, got)
		}
		if got.Present != (got.Source != "") || (got.DoNotRetry && (!got.Present || got.Delay != 0)) || (!got.Present && got.Delay != 0) {
			t.Fatalf("ParseHints(%+v) = %+v, inconsistent", h, got)
		}
		// Combining agrees with each header on its own: do-not-retry wins,
		// else the largest delay.
		singles := []policy.Hints{{RetryAfter: ra}, {GRPCPushbackMs: grpc}, {XRateLimitReset: reset}, {XAmzRetryAfter: amz}}
		given, present, dnr := 0, false, false
		var largest time.Duration
		for i, s := range singles {
			if s == (policy.Hints{}) {
				continue
			}
			given++
			one := policy.ParseHints(s, now, maxHint)
			if !strings.Contains(got.Note, one.Note[:strings.IndexByte(one.Note, ':')]) {
				t.Fatalf("ParseHints(%+v).Note = %q, missing header %d (%q)", h, got.Note, i, one.Note)
			}
			present = present || one.Present
			dnr = dnr || one.DoNotRetry
			if one.Present && !one.DoNotRetry {
				largest = max(largest, one.Delay)
			}
		}
		if present != got.Present || dnr != got.DoNotRetry || (!dnr && got.Delay != largest) {
			t.Fatalf("ParseHints(%+v) = %+v, want present %v, do-not-retry %v, delay %v", h, got, present, dnr, largest)
		}
		if n := strings.Count(got.Note, ",") + 1; (given == 0 && got.Note != "") || (given > 0 && n != given) {
			t.Fatalf("ParseHints(%+v).Note = %q, want %d entries", h, got.Note, given)
		}
	})
}

func FuzzValidatePolicy(f *testing.F) {
	def := policy.Default()
	b := def.Breaker
	add := func(p policy.Policy, attempt int, hint string, window int64) {
		b := p.Breaker
		f.Add(int64(p.Backoff.Base), int64(p.Backoff.Max), p.Backoff.Factor, uint8(p.Backoff.Jitter),
			uint8(p.Pushback.Mode), p.Pushback.SpreadRatio, int64(p.Pushback.MinSpread), int64(p.Pushback.MaxHint),
			p.MaxAttempts, int64(p.AttemptTimeout), int64(p.CallDeadline),
			uint8(b.Mode), uint8(b.Scope), b.ConsecutiveFailures, b.FailureRate, int64(b.Window), b.MinCalls,
			int64(b.Cooldown), b.HalfOpenProbes, int64(b.ProbeTimeout),
			attempt, 0.5, 0.5, hint, int64(10*time.Second), window)
	}
	add(def, 1, "", int64(time.Minute))
	add(def, 2, "120", int64(72*time.Hour))
	withDeadline := def
	withDeadline.CallDeadline = time.Minute
	add(withDeadline, 1, "Sun, 06 Nov 1994 08:49:37 GMT", int64(time.Minute))
	nan := def
	nan.Backoff.Factor = math.NaN()
	add(nan, 1, "", 1)
	inf := def
	inf.Pushback.SpreadRatio = math.Inf(1)
	add(inf, 1, "", 1)
	edge := def
	edge.Backoff = policy.Backoff{Base: 1, Max: math.MaxInt64, Factor: 100, Jitter: policy.JitterDecorrelated}
	edge.MaxAttempts = 100
	add(edge, 99, "1000000000", math.MaxInt64)
	_ = b
	f.Fuzz(func(t *testing.T, base, maxDelay int64, factor float64, jitter, mode uint8, ratio float64, minSpread, maxHint int64,
		maxAttempts int, attemptTimeout, callDeadline int64,
		bMode, bScope uint8, consecutive int, rate float64, window int64, minCalls int, cooldown int64, probes int, probeTimeout int64,
		attempt int, jitterDraw, spreadDraw float64, hint string, originBack, planWindow int64) {
		p := policy.Policy{
			Backoff:        policy.Backoff{Base: time.Duration(base), Max: time.Duration(maxDelay), Factor: factor, Jitter: policy.Jitter(jitter)},
			Pushback:       policy.Pushback{Mode: policy.RetryAfterMode(mode), SpreadRatio: ratio, MinSpread: time.Duration(minSpread), MaxHint: time.Duration(maxHint)},
			MaxAttempts:    maxAttempts,
			AttemptTimeout: time.Duration(attemptTimeout),
			CallDeadline:   time.Duration(callDeadline),
			TransientHTTP:  policy.DefaultTransientHTTP,
			TerminalHTTP:   policy.DefaultTerminalHTTP,
			TransientGRPC:  policy.DefaultTransientGRPC,
			Breaker: policy.BreakerConfig{
				Mode: policy.BreakerMode(bMode), Scope: policy.BreakerScope(bScope), ConsecutiveFailures: consecutive,
				FailureRate: rate, Window: time.Duration(window), MinCalls: minCalls, Cooldown: time.Duration(cooldown),
				HalfOpenProbes: probes, ProbeTimeout: time.Duration(probeTimeout),
			},
		}
		err := p.Validate()
		if err != nil {
			var fe *policy.FieldError
			if !errors.As(err, &fe) || fe.Field == "" || fe.Rule == "" {
				t.Fatalf("Validate() = %v (%T), want a *FieldError", err, err)
			}
			return
		}
		for _, v := range []float64{factor, ratio, rate} {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				t.Fatalf("Validate() accepted a policy with %v", v)
			}
		}
		in := policy.Input{
			Attempt: attempt, Failure: httpF(503), Idempotent: true, Hints: policy.Hints{RetryAfter: hint},
			Now: t0, Origin: t0.Add(-time.Duration(originBack)), JitterDraw: jitterDraw, SpreadDraw: spreadDraw,
		}
		d := policy.Decide(&p, in)
		if d.Retry {
			if d.Delay < 0 || d.AttemptTimeout < 0 {
				t.Fatalf("Decide() = %+v, negative durations", d)
			}
			if !d.Deadline.IsZero() && !policy.FitsDeadline(t0, d.Deadline, d.Delay, d.AttemptTimeout) {
				t.Fatalf("Decide() = %+v: delay and attempt timeout pass the deadline %v", d, d.Deadline)
			}
			if !d.Deadline.IsZero() && !policy.FitsDeadline(t0, d.Deadline, d.Delay, p.AttemptTimeout) {
				t.Fatalf("Decide() = %+v: the policy's attempt timeout %v is not reserved", d, p.AttemptTimeout)
			}
			if d.Hint.Present && d.Hint.Delay <= p.Pushback.MaxHint && d.Delay < d.Hint.Delay {
				t.Fatalf("Decide() = %+v: delay below the server's hint", d)
			}
			if !d.Hint.Present && d.Delay > policy.Nominal(p.Backoff, max(attempt-1, 0)) {
				t.Fatalf("Decide() = %+v: delay above nominal %v", d, policy.Nominal(p.Backoff, max(attempt-1, 0)))
			}
		} else if d.Stop == policy.StopNone || d.Disposition == policy.DispositionNone {
			t.Fatalf("Decide() = %+v: a stop without a reason", d)
		}
		plan := policy.PlanInput{
			Window: time.Duration(planWindow), Backoff: p.Backoff, AttemptTimeout: p.AttemptTimeout,
			TTLMargin: time.Duration(minSpread), MaxAttempts: p.MaxAttempts,
		}
		if got, err := policy.PlanBudget(plan); err == nil {
			checkPlan(t, plan, got)
		} else if fe := (*policy.FieldError)(nil); !errors.As(err, &fe) {
			t.Fatalf("PlanBudget(%+v) error = %v (%T), want a *FieldError", plan, err, err)
		}
	})
}
