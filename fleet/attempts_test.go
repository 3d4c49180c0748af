package fleet_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

func TestAttemptsNeverRewind(t *testing.T) {
	retry := policy.Answer{Retry: true, Delay: time.Second}
	stop := policy.Answer{Stop: policy.StopAttemptsExhausted, Disposition: policy.DispositionDeadLetter}
	tests := []struct {
		name    string
		rec     fleet.Attempts
		attempt uint32
		now     int64
		replay  bool
		refused string // a part of the rule, when refused
	}{
		{"a call never seen", fleet.Attempts{}, 1, 0, false, ""},
		{"the same attempt replays", fleet.Attempts{Attempt: 2, Answer: retry, Expiry: 100}, 2, 10, true, ""},
		{"the next attempt is decided", fleet.Attempts{Attempt: 2, Answer: retry, Expiry: 100}, 3, 10, false, ""},
		{"a lower attempt is refused", fleet.Attempts{Attempt: 2, Answer: retry, Expiry: 100}, 1, 10, false, "must be 3"},
		{"the stopped attempt replays its STOP", fleet.Attempts{Attempt: 3, Answer: stop, Expiry: 100}, 3, 10, true, ""},
		{"any attempt after a STOP is refused", fleet.Attempts{Attempt: 3, Answer: stop, Expiry: 100}, 4, 10, false, "no attempt follows a STOP"},
		{"a lower one after a STOP too", fleet.Attempts{Attempt: 3, Answer: stop, Expiry: 100}, 1, 10, false, "ATTEMPTS_EXHAUSTED"},
		{"an expired record is forgotten", fleet.Attempts{Attempt: 3, Answer: stop, Expiry: 100}, 1, 100, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			replay, err := tt.rec.Check(tt.now, tt.attempt)
			var r *fleet.Refusal
			switch {
			case replay != tt.replay:
				t.Errorf("replay %v, want %v", replay, tt.replay)
			case tt.refused == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.refused != "" && (!errors.As(err, &r) || r.Field != "attempt" || !strings.Contains(r.Rule, tt.refused)):
				t.Errorf("err %v, want a refusal naming attempt with %q", err, tt.refused)
			}
		})
	}
}

func TestAttemptsDecidedKeepsTheHighest(t *testing.T) {
	var a fleet.Attempts
	a.Decided(2, policy.Answer{Retry: true}, 100)
	if e := a.Decided(1, policy.Answer{}, 50); e != 0 || a.Attempt != 2 || a.Expiry != 100 {
		t.Fatalf("a lower attempt rewound the record: %+v", a)
	}
	a.Decided(3, policy.Answer{Stop: policy.StopDeadline}, 80)
	if a.Attempt != 3 || a.Expiry != 100 || a.Answer.Stop != policy.StopDeadline {
		t.Fatalf("attempt 3: %+v, want attempt 3 kept until 100", a)
	}
}

func TestKeepOutlivesTheCall(t *testing.T) {
	p := policy.Default()
	h := fleet.Horizon(&p)
	var nominal time.Duration
	for n := range p.MaxAttempts {
		nominal += policy.Nominal(p.Backoff, n) + p.AttemptTimeout
	}
	if h < nominal || h < p.Pushback.MaxHint {
		t.Fatalf("Horizon %v shorter than the schedule %v or the longest hint %v", h, nominal, p.Pushback.MaxHint)
	}
	deadline := time.Unix(0, int64(h)*10)
	if got := fleet.Keep(&p, 0, deadline); got != deadline.UnixNano() {
		t.Errorf("Keep with a later deadline: %d, want the deadline %d", got, deadline.UnixNano())
	}
	if got := fleet.Keep(&p, 5, time.Time{}); got != 5+int64(h) {
		t.Errorf("Keep without a deadline: %d, want now + horizon", got)
	}
}
