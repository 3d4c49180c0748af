package policy_test

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// rfcNow is shortly before the example date of RFC 9110.
var rfcNow = time.Date(1994, time.November, 6, 8, 49, 0, 0, time.UTC)

func TestParseRetryAfter(t *testing.T) {
	tests := []struct {
		name    string
		value   string
		now     time.Time
		want    time.Duration
		wantErr error
	}{
		{"delta seconds", "120", rfcNow, 120 * time.Second, nil},
		{"delta zero", "0", rfcNow, 0, nil},
		{"delta leading zeros", "007", rfcNow, 7 * time.Second, nil},
		{"delta surrounding spaces", "  120  ", rfcNow, 120 * time.Second, nil},
		{"delta surrounding tabs", "\t5\t", rfcNow, 5 * time.Second, nil},
		{"delta at the maximum", "1000000000", rfcNow, policy.MaxHintDelay, nil},
		{"delta beyond the maximum saturates", "1000000001", rfcNow, policy.MaxHintDelay, nil},
		{"delta of 11 digits saturates", "99999999999", rfcNow, policy.MaxHintDelay, nil},
		{"delta beyond int64 saturates", "99999999999999999999999999", rfcNow, policy.MaxHintDelay, nil},
		{"delta minus zero is zero", "-0", rfcNow, 0, nil},
		{"delta minus zeros is zero", "-000", rfcNow, 0, nil},
		{"delta negative", "-5", rfcNow, 0, policy.ErrHintNegative},
		{"delta negative huge", "-99999999999999999999999", rfcNow, 0, policy.ErrHintNegative},
		{"delta plus sign", "+5", rfcNow, 0, policy.ErrHintUnparseable},
		{"delta fraction", "1.5", rfcNow, 0, policy.ErrHintUnparseable},
		{"delta with unit", "5s", rfcNow, 0, policy.ErrHintUnparseable},
		{"delta inner space", "1 2", rfcNow, 0, policy.ErrHintUnparseable},
		{"lone minus", "-", rfcNow, 0, policy.ErrHintUnparseable},
		{"empty", "", rfcNow, 0, policy.ErrHintUnparseable},
		{"spaces only", "   ", rfcNow, 0, policy.ErrHintUnparseable},
		{"garbage", "soon", rfcNow, 0, policy.ErrHintUnparseable},
		{"imf-fixdate", "Sun, 06 Nov 1994 08:49:37 GMT", rfcNow, 37 * time.Second, nil},
		{"imf-fixdate with spaces", "  Sun, 06 Nov 1994 08:49:37 GMT ", rfcNow, 37 * time.Second, nil},
		{"rfc 850", "Sunday, 06-Nov-94 08:49:37 GMT", rfcNow, 37 * time.Second, nil},
		{"asctime", "Sun Nov  6 08:49:37 1994", rfcNow, 37 * time.Second, nil},
		{"asctime two-digit day", "Sun Nov 16 08:49:37 1994", rfcNow, 10*24*time.Hour + 37*time.Second, nil},
		{"imf-fixdate in the past", "Sun, 06 Nov 1994 08:48:37 GMT", rfcNow, 0, nil},
		{"rfc 850 in the past", "Sunday, 06-Nov-94 08:48:37 GMT", rfcNow, 0, nil},
		{"asctime in the past", "Sun Nov  6 08:48:37 1994", rfcNow, 0, nil},
		{"date equal to now", "Sun, 06 Nov 1994 08:49:00 GMT", rfcNow, 0, nil},
		{"date with sub-second now", "Sun, 06 Nov 1994 08:49:37 GMT", rfcNow.Add(500 * time.Millisecond), 36500 * time.Millisecond, nil},
		{"date far in the past", "Thu, 01 Jan 1970 00:00:00 GMT", rfcNow, 0, nil},
		{"date in year 9999 saturates", "Fri, 31 Dec 9999 23:59:59 GMT", rfcNow, policy.MaxHintDelay, nil},
		{"asctime in year 9999 saturates", "Fri Dec 31 23:59:59 9999", rfcNow, policy.MaxHintDelay, nil},
		{"date in UTC not GMT", "Sun, 06 Nov 1994 08:49:37 UTC", rfcNow, 0, policy.ErrHintUnparseable},
		{"date without zone", "Sun, 06 Nov 1994 08:49:37", rfcNow, 0, policy.ErrHintUnparseable},
		{"date with bad month", "Sun, 06 Foo 1994 08:49:37 GMT", rfcNow, 0, policy.ErrHintUnparseable},
		{"date with bad day", "Sun, 32 Nov 1994 08:49:37 GMT", rfcNow, 0, policy.ErrHintUnparseable},
		{"date with bad hour", "Sun, 06 Nov 1994 25:49:37 GMT", rfcNow, 0, policy.ErrHintUnparseable},
		{"iso 8601 is not an HTTP-date", "1994-11-06T08:49:37Z", rfcNow, 0, policy.ErrHintUnparseable},
		// RFC 9110: a two-digit year more than 50 years ahead is in the past century.
		{"rfc 850 year 80 in 2026 is 1980", "Tuesday, 01-Jan-80 00:00:00 GMT", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), 0, nil},
		{"rfc 850 year 27 in 2026 is 2027", "Friday, 01-Jan-27 00:00:00 GMT", time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC), 24 * time.Hour, nil},
		{"rfc 850 year 10 in 2099 is 2110", "Wednesday, 01-Jan-10 00:00:00 GMT", time.Date(2099, 12, 31, 0, 0, 0, 0, time.UTC),
			time.Date(2110, 1, 1, 0, 0, 0, 0, time.UTC).Sub(time.Date(2099, 12, 31, 0, 0, 0, 0, time.UTC)), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := policy.ParseRetryAfter(tt.value, tt.now)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Fatalf("ParseRetryAfter(%q) error = %v, want %v", tt.value, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ParseRetryAfter(%q) = %v, want %v", tt.value, got, tt.want)
			}
		})
	}
}

func TestParseHints(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	unix := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	tests := []struct {
		name  string
		hints policy.Hints
		want  policy.Hint
	}{
		{"none", policy.Hints{}, policy.Hint{}},
		{"retry-after delta", policy.Hints{RetryAfter: "5"},
			policy.Hint{Present: true, Delay: 5 * time.Second, Source: "retry_after", Note: "retry_after:used"}},
		{"retry-after date", policy.Hints{RetryAfter: "Sun, 01 Mar 2026 12:01:00 GMT"},
			policy.Hint{Present: true, Delay: time.Minute, Source: "retry_after", Note: "retry_after:used"}},
		{"retry-after past date is a zero hint", policy.Hints{RetryAfter: "Sun, 01 Mar 2026 11:00:00 GMT"},
			policy.Hint{Present: true, Source: "retry_after", Note: "retry_after:used"}},
		{"retry-after garbage", policy.Hints{RetryAfter: "later"},
			policy.Hint{Note: "retry_after:ignored:unparseable"}},
		{"retry-after negative", policy.Hints{RetryAfter: "-3"},
			policy.Hint{Note: "retry_after:ignored:negative"}},
		{"retry-after huge is capped", policy.Hints{RetryAfter: "123456789012345"},
			policy.Hint{Present: true, Delay: policy.MaxHintDelay, Capped: true, Source: "retry_after", Note: "retry_after:used:capped"}},
		{"retry-after 99999999999 is capped", policy.Hints{RetryAfter: "99999999999"},
			policy.Hint{Present: true, Delay: policy.MaxHintDelay, Capped: true, Source: "retry_after", Note: "retry_after:used:capped"}},
		{"retry-after date in year 9999 is capped", policy.Hints{RetryAfter: "Fri, 31 Dec 9999 23:59:59 GMT"},
			policy.Hint{Present: true, Delay: policy.MaxHintDelay, Capped: true, Source: "retry_after", Note: "retry_after:used:capped"}},
		{"retry-after just above the cap is capped", policy.Hints{RetryAfter: "3601"},
			policy.Hint{Present: true, Delay: 3601 * time.Second, Capped: true, Source: "retry_after", Note: "retry_after:used:capped"}},
		{"retry-after at the cap is not capped", policy.Hints{RetryAfter: "3600"},
			policy.Hint{Present: true, Delay: time.Hour, Source: "retry_after", Note: "retry_after:used"}},
		{"grpc pushback", policy.Hints{GRPCPushbackMs: "1500"},
			policy.Hint{Present: true, Delay: 1500 * time.Millisecond, Source: "grpc_retry_pushback_ms", Note: "grpc_retry_pushback_ms:used"}},
		{"grpc pushback with spaces", policy.Hints{GRPCPushbackMs: " 100 "},
			policy.Hint{Present: true, Delay: 100 * time.Millisecond, Source: "grpc_retry_pushback_ms", Note: "grpc_retry_pushback_ms:used"}},
		{"grpc pushback negative means do not retry", policy.Hints{GRPCPushbackMs: "-1"},
			policy.Hint{Present: true, DoNotRetry: true, Source: "grpc_retry_pushback_ms", Note: "grpc_retry_pushback_ms:do_not_retry"}},
		{"grpc pushback minus zero is zero", policy.Hints{GRPCPushbackMs: "-0"},
			policy.Hint{Present: true, Source: "grpc_retry_pushback_ms", Note: "grpc_retry_pushback_ms:used"}},
		{"grpc pushback at int64 max is capped", policy.Hints{GRPCPushbackMs: "9223372036854775807"},
			policy.Hint{Present: true, Delay: policy.MaxHintDelay, Capped: true, Source: "grpc_retry_pushback_ms", Note: "grpc_retry_pushback_ms:used:capped"}},
		{"grpc pushback at int64 min means do not retry", policy.Hints{GRPCPushbackMs: "-9223372036854775808"},
			policy.Hint{Present: true, DoNotRetry: true, Source: "grpc_retry_pushback_ms", Note: "grpc_retry_pushback_ms:do_not_retry"}},
		{"grpc pushback garbage is ignored", policy.Hints{GRPCPushbackMs: "abc"},
			policy.Hint{Note: "grpc_retry_pushback_ms:ignored:unparseable"}},
		{"ratelimit reset seconds", policy.Hints{XRateLimitReset: "30"},
			policy.Hint{Present: true, Delay: 30 * time.Second, Source: "x_ratelimit_reset", Note: "x_ratelimit_reset:used"}},
		{"ratelimit reset 1e9 is still seconds", policy.Hints{XRateLimitReset: "1000000000"},
			policy.Hint{Present: true, Delay: policy.MaxHintDelay, Capped: true, Source: "x_ratelimit_reset", Note: "x_ratelimit_reset:used:capped"}},
		{"ratelimit reset unix time", policy.Hints{XRateLimitReset: unix(90 * time.Second)},
			policy.Hint{Present: true, Delay: 90 * time.Second, Source: "x_ratelimit_reset", Note: "x_ratelimit_reset:used"}},
		{"ratelimit reset unix time in the past", policy.Hints{XRateLimitReset: unix(-time.Hour)},
			policy.Hint{Present: true, Source: "x_ratelimit_reset", Note: "x_ratelimit_reset:used"}},
		{"ratelimit reset negative", policy.Hints{XRateLimitReset: "-30"},
			policy.Hint{Note: "x_ratelimit_reset:ignored:negative"}},
		{"ratelimit reset far in the future is capped", policy.Hints{XRateLimitReset: "99999999999999"},
			policy.Hint{Present: true, Delay: policy.MaxHintDelay, Capped: true, Source: "x_ratelimit_reset", Note: "x_ratelimit_reset:used:capped"}},
		{"ratelimit reset a day ahead is capped", policy.Hints{XRateLimitReset: unix(24 * time.Hour)},
			policy.Hint{Present: true, Delay: 24 * time.Hour, Capped: true, Source: "x_ratelimit_reset", Note: "x_ratelimit_reset:used:capped"}},
		{"amz retry after", policy.Hints{XAmzRetryAfter: "250"},
			policy.Hint{Present: true, Delay: 250 * time.Millisecond, Source: "x_amz_retry_after", Note: "x_amz_retry_after:used"}},
		{"amz retry after 10^18 is capped", policy.Hints{XAmzRetryAfter: "1000000000000000000"},
			policy.Hint{Present: true, Delay: policy.MaxHintDelay, Capped: true, Source: "x_amz_retry_after", Note: "x_amz_retry_after:used:capped"}},
		{"amz retry after in exponent form is not an integer", policy.Hints{XAmzRetryAfter: "1e18"},
			policy.Hint{Note: "x_amz_retry_after:ignored:unparseable"}},
		{"amz retry after negative", policy.Hints{XAmzRetryAfter: "-250"},
			policy.Hint{Note: "x_amz_retry_after:ignored:negative"}},
		{"largest wins", policy.Hints{RetryAfter: "5", GRPCPushbackMs: "7000", XRateLimitReset: "3", XAmzRetryAfter: "6500"},
			policy.Hint{Present: true, Delay: 7 * time.Second, Source: "grpc_retry_pushback_ms",
				Note: "retry_after:superseded,grpc_retry_pushback_ms:used,x_ratelimit_reset:superseded,x_amz_retry_after:superseded"}},
		{"largest wins last", policy.Hints{RetryAfter: "5", XAmzRetryAfter: "5001"},
			policy.Hint{Present: true, Delay: 5001 * time.Millisecond, Source: "x_amz_retry_after",
				Note: "retry_after:superseded,x_amz_retry_after:used"}},
		{"tie goes to the first", policy.Hints{RetryAfter: "2", XAmzRetryAfter: "2000"},
			policy.Hint{Present: true, Delay: 2 * time.Second, Source: "retry_after",
				Note: "retry_after:used,x_amz_retry_after:superseded"}},
		{"do not retry wins over a larger hint", policy.Hints{RetryAfter: "60", GRPCPushbackMs: "-1", XAmzRetryAfter: "90000"},
			policy.Hint{Present: true, DoNotRetry: true, Source: "grpc_retry_pushback_ms",
				Note: "retry_after:superseded,grpc_retry_pushback_ms:do_not_retry,x_amz_retry_after:superseded"}},
		{"garbage next to a valid hint", policy.Hints{RetryAfter: "x", XAmzRetryAfter: "100"},
			policy.Hint{Present: true, Delay: 100 * time.Millisecond, Source: "x_amz_retry_after",
				Note: "retry_after:ignored:unparseable,x_amz_retry_after:used"}},
		{"capped winner among several", policy.Hints{RetryAfter: "5", GRPCPushbackMs: "9223372036854775807"},
			policy.Hint{Present: true, Delay: policy.MaxHintDelay, Capped: true, Source: "grpc_retry_pushback_ms",
				Note: "retry_after:superseded,grpc_retry_pushback_ms:used:capped"}},
		{"all ignored", policy.Hints{RetryAfter: "x", XRateLimitReset: "-1"},
			policy.Hint{Note: "retry_after:ignored:unparseable,x_ratelimit_reset:ignored:negative"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := policy.ParseHints(tt.hints, now, time.Hour); got != tt.want {
				t.Errorf("ParseHints(%+v) = %+v, want %+v", tt.hints, got, tt.want)
			}
		})
	}
}

func TestParseHintsDoesNotAllocateForOneHint(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, h := range []policy.Hints{{}, {RetryAfter: "120"}, {GRPCPushbackMs: "-1"}, {XAmzRetryAfter: "abc"}, {RetryAfter: "99999999999"}, {RetryAfter: "Sun, 06 Nov 1994 08:49:37 GMT"}} {
		got := testing.AllocsPerRun(100, func() { _ = policy.ParseHints(h, rfcNow, time.Hour) })
		if got != 0 {
			t.Errorf("ParseHints(%+v) allocs = %v, want 0", h, got)
		}
	}
}

func TestSpreadHint(t *testing.T) {
	def := policy.Default().Pushback // ratio 0.1, min spread 250ms, max hint 1h
	tests := []struct {
		name string
		p    policy.Pushback
		h    time.Duration
		u    float64
		want time.Duration
	}{
		{"u=0 is the hint", def, 10 * time.Second, 0, 10 * time.Second},
		{"ratio spread", def, 10 * time.Second, 0.5, 10500 * time.Millisecond},
		{"min spread for short hints", def, time.Second, 0.5, 1125 * time.Millisecond},
		{"zero hint still spreads", def, 0, 0.5, 125 * time.Millisecond},
		{"negative hint counts as 0", def, -time.Second, 0, 0},
		{"capped at max hint", def, 2 * time.Hour, 0, time.Hour},
		{"capped then spread", def, 2 * time.Hour, 0.5, time.Hour + 180*time.Second},
		{"no spread configured", policy.Pushback{MaxHint: time.Hour}, 7 * time.Second, 0.9, 7 * time.Second},
		{"no cap configured", policy.Pushback{SpreadRatio: 0.5}, 100 * time.Hour, 1, 150 * time.Hour},
		{"saturates", policy.Pushback{SpreadRatio: 1}, maxDuration - 1, 0.99, maxDuration},
		{"NaN draw counts as 0", def, time.Second, nan(), time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := policy.SpreadHint(tt.p, tt.h, tt.u); got != tt.want {
				t.Errorf("SpreadHint(%+v, %v, %v) = %v, want %v", tt.p, tt.h, tt.u, got, tt.want)
			}
		})
	}
}

func TestSpreadHintBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		p := policy.Pushback{
			SpreadRatio: r.Float64(),
			MinSpread:   time.Duration(r.Int64N(int64(time.Minute))),
			MaxHint:     time.Duration(1 + r.Int64N(int64(24*time.Hour))),
		}
		h := time.Duration(r.Int64N(int64(48 * time.Hour)))
		u := r.Float64()
		got := policy.SpreadHint(p, h, u)
		capped := min(h, p.MaxHint)
		spread := max(time.Duration(p.SpreadRatio*float64(capped)), p.MinSpread)
		if got < capped || got > capped+spread {
			t.Fatalf("SpreadHint(%+v, %v, %v) = %v, want in [%v, %v]", p, h, u, got, capped, capped+spread)
		}
	}
}
