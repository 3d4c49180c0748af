package redisstore

import (
	"errors"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// TestDecodeAttempt reads the attempt record's layouts: the answer alone
// (policyd_attempt), the answer with policyd_nextdelay's verdict laid over
// it, and damaged ones, from a hash and from HGETALL's reply alike.
func TestDecodeAttempt(t *testing.T) {
	base := `{"Retry":true,"Delay":1000000000,"AttemptTimeout":10000000000,"Category":1,"Class":"transient:503","Note":"retry-after:2s","Checks":32}`
	packed := string(packAnswer(&policy.Answer{Retry: true, Delay: time.Second, AttemptTimeout: 10 * time.Second,
		Category: policy.CategoryTransient, Class: "transient:503", Note: "retry-after:2s", Checks: policy.CheckBreaker}))
	tests := []struct {
		name string
		h    map[string]string
		want policy.Answer
		err  bool
	}{
		{name: "no record", h: map[string]string{}},
		{name: "the answer alone", h: map[string]string{"attempt": "2", "expiry": "1000", "answer": base},
			want: policy.Answer{Retry: true, Delay: time.Second, AttemptTimeout: 10 * time.Second, Category: policy.CategoryTransient,
				Class: "transient:503", Note: "retry-after:2s", Checks: policy.CheckBreaker}},
		{name: "a retry spread over the cool-down", h: map[string]string{"attempt": "2", "expiry": "1000", "answer": base,
			"verdict": "1 7500000000 0 0 1 96 41.5 3 1"},
			want: policy.Answer{Retry: true, Delay: 7500 * time.Millisecond, AttemptTimeout: 10 * time.Second, Category: policy.CategoryTransient,
				Class: "transient:503", Note: "retry-after:2s,cooldown:fleet", Checks: policy.CheckBreaker | policy.CheckTenantBudget,
				Breaker: policy.BreakerClosed, TenantTokens: 41.5, RunRemaining: 3}},
		{name: "a stop: no delay, no attempt timeout", h: map[string]string{"attempt": "2", "expiry": "1000", "answer": base,
			"verdict": "0 0 6 5 2 32 0 0 0"},
			want: policy.Answer{Stop: policy.StopCircuitOpen, Disposition: policy.DispositionCircuitOpen, Category: policy.CategoryTransient,
				Class: "transient:503", Note: "retry-after:2s", Checks: policy.CheckBreaker, Breaker: policy.BreakerOpen}},
		{name: "a verdict cut short", h: map[string]string{"attempt": "2", "expiry": "1000", "answer": base, "verdict": "1 2 3"}, err: true},
		{name: "a verdict with garbage", h: map[string]string{"attempt": "2", "expiry": "1000", "answer": base, "verdict": "1 x 0 0 1 96 1 0 0"}, err: true},
		{name: "an answer that is not JSON", h: map[string]string{"attempt": "2", "expiry": "1000", "answer": "{"}, err: true},
		{name: "a packed answer with a verdict", h: map[string]string{"attempt": "2", "expiry": "1000", "answer": packed,
			"verdict": "0 0 6 5 2 32 0 0 0"},
			want: policy.Answer{Stop: policy.StopCircuitOpen, Disposition: policy.DispositionCircuitOpen, Category: policy.CategoryTransient,
				Class: "transient:503", Note: "retry-after:2s", Checks: policy.CheckBreaker, Breaker: policy.BreakerOpen}},
		{name: "a verdict of 10 numbers", h: map[string]string{"attempt": "2", "expiry": "1000", "answer": packed,
			"verdict": "0 0 6 5 2 32 0 0 0 0"}, err: true},
		{name: "an attempt that is not a number", h: map[string]string{"attempt": "two", "expiry": "1000", "answer": packed}, err: true},
	}
	for _, tt := range tests {
		a, err := decodeAttempt(tt.h)
		// The same record as HGETALL's reply reads the same.
		var flat []any
		for k, v := range tt.h {
			flat = append(flat, k, v)
		}
		f := attemptFieldsOf(flat)
		if fa, ferr := f.decode(); fa != a || !errors.Is(ferr, err) {
			t.Errorf("%s: as HGETALL's reply %+v, %v; as a hash %+v, %v", tt.name, fa, ferr, a, err)
		}
		switch {
		case tt.err:
			if !errors.Is(err, errDamagedAttempt) {
				t.Errorf("%s: %v, want errDamagedAttempt", tt.name, err)
			}
		case err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case a.Answer != tt.want:
			t.Errorf("%s:\ngot  %+v\nwant %+v", tt.name, a.Answer, tt.want)
		}
	}
}
