package redisstore

import (
	"errors"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// TestDecodeAttempt reads the attempt record's layouts: the answer alone
// (policyd_attempt), the answer with policyd_nextdelay's verdict laid over
// it, and damaged ones.
func TestDecodeAttempt(t *testing.T) {
	base := `{"Retry":true,"Delay":1000000000,"AttemptTimeout":10000000000,"Category":1,"Class":"transient:503","Note":"retry-after:2s","Checks":32}`
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
	}
	for _, tt := range tests {
		a, err := decodeAttempt(tt.h)
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
