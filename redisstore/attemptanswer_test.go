package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// sameAnswer reports whether a and b are one answer, their deadlines one
// instant (JSON keeps a zone, the packed form Unix ns).
func sameAnswer(a, b policy.Answer) bool {
	same := a.Deadline.Equal(b.Deadline)
	a.Deadline, b.Deadline = time.Time{}, time.Time{}
	return same && a == b
}

// answersToPack are answers with every field of the packed form set, with
// and without a target, decided in degraded mode or not.
func answersToPack() []policy.Answer {
	full := policy.Answer{Retry: true, Delay: 1500 * time.Millisecond, AttemptTimeout: 10 * time.Second,
		Stop: policy.StopBudgetExhausted, Disposition: policy.DispositionDeadLetter, Category: policy.CategoryTransient,
		Class: "transient:503", Note: "retry-after:2s,cooldown:fleet", Checks: policy.CheckBreaker | policy.CheckTenantBudget,
		Breaker: policy.BreakerHalfOpen, TenantTokens: 41.25, RunRemaining: 1<<40 + 3,
		Deadline: time.Unix(0, 1_800_000_000_123_456_789)}
	withTarget, degraded := full, full
	withTarget.Target = "api-fallback"
	degraded.Degraded, degraded.Retry, degraded.Delay, degraded.AttemptTimeout = true, false, 0, 0
	return []policy.Answer{{}, full, withTarget, degraded, {Stop: policy.StopTerminal, Class: "terminal:422"}}
}

// TestPackedAnswerRoundTrip packs answers and reads them back, every
// field as it was; FlowControlled is not remembered (it is set from the
// policy at each answer).
func TestPackedAnswerRoundTrip(t *testing.T) {
	for i, a := range answersToPack() {
		v := packAnswer(&a)
		if v[0] == '{' || len(v) != 2+fleet.AnswerLen(&a) {
			t.Errorf("answer %d: packed as % x (%d bytes), want a version byte and %d bytes", i, v, len(v), 2+fleet.AnswerLen(&a))
		}
		if v[1+fleet.AnswerRetryOffset] != map[bool]byte{false: 0, true: 1}[a.Retry] {
			t.Errorf("answer %d: retry flag %d at the offset the library reads, want %v", i, v[1+fleet.AnswerRetryOffset], a.Retry)
		}
		var got policy.Answer
		got.FlowControlled = true
		if err := decodeAnswer(string(v), &got); err != nil || !sameAnswer(got, a) {
			t.Errorf("answer %d: read back %+v, %v\nwant %+v", i, got, err, a)
		}
	}
}

// TestAnswerJSONStillRead reads the answer field as replicas wrote it
// before it was packed: policy.Answer's JSON.
func TestAnswerJSONStillRead(t *testing.T) {
	for i, a := range answersToPack() {
		v, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		var got policy.Answer
		if err := decodeAnswer(string(v), &got); err != nil || !sameAnswer(got, a) {
			t.Errorf("answer %d: JSON %s read as %+v, %v\nwant %+v", i, v, got, err, a)
		}
	}
}

// TestDamagedAnswerRefused refuses every answer field that is neither a
// whole packed answer nor JSON: cut short anywhere, an unknown version, a
// flag other than 0 or 1, bytes after the last field.
func TestDamagedAnswerRefused(t *testing.T) {
	full := answersToPack()[2]
	v := packAnswer(&full)
	damaged := map[string]string{"empty": "", "JSON cut short": `{"Retry":tru`, "version 0": "\x00" + string(v[1:]),
		"version 3": "\x03" + string(v[1:]), "a byte too many": string(v) + "\x00"}
	for n := 1; n < len(v); n++ {
		damaged["cut to "+strconv.Itoa(n)+" bytes"] = string(v[:n])
	}
	retry := append([]byte(nil), v...)
	retry[1+fleet.AnswerRetryOffset] = 2
	damaged["retry flag 2"] = string(retry)
	degraded := append([]byte(nil), v...)
	degraded[len(degraded)-1] = 2
	damaged["degraded flag 2"] = string(degraded)
	noTarget := append([]byte(nil), v...)
	noTarget[0] = answerPackedV1 // the target's bytes then follow the last field
	damaged["a target under version 1"] = string(noTarget)
	for name, d := range damaged {
		var a policy.Answer
		if err := decodeAnswer(d, &a); !errors.Is(err, errDamagedAttempt) {
			t.Errorf("%s (% x): %v, want errDamagedAttempt", name, d, err)
		}
	}
}

// FuzzDecodeAnswer feeds decodeAnswer arbitrary fields: it never panics,
// and what it reads packs to a field that reads the same.
func FuzzDecodeAnswer(f *testing.F) {
	for _, a := range answersToPack() {
		f.Add(string(packAnswer(&a)))
		j, _ := json.Marshal(a)
		f.Add(string(j))
	}
	f.Add("")
	f.Add("\x02")
	f.Fuzz(func(t *testing.T, v string) {
		var a policy.Answer
		if err := decodeAnswer(v, &a); err != nil {
			if !errors.Is(err, errDamagedAttempt) {
				t.Fatalf("decodeAnswer(%q) = %v, want errDamagedAttempt", v, err)
			}
			return
		}
		var again policy.Answer
		if err := decodeAnswer(string(packAnswer(&a)), &again); err != nil || !sameAnswer(again, a) {
			t.Fatalf("decodeAnswer(%q) = %+v, packed and read again %+v, %v", v, a, again, err)
		}
	})
}

// TestRecordsOfBeforeReplayAsBefore writes attempt records as replicas
// wrote them before the answer was packed (policy.Answer's JSON, with and
// without policyd_nextdelay's verdict) and packed, and asks
// NextDelayInOneCall for the attempt recorded (a replay of its answer),
// a lower one (refused) and the next (refused after a STOP, else
// decided): each form answers alike, and as the record says.
func TestRecordsOfBeforeReplayAsBefore(t *testing.T) {
	c := standalone(t)
	ctx := context.Background()
	s, err := Open(ctx, Options{Client: c, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	retry := policy.Answer{Retry: true, Delay: time.Second, AttemptTimeout: 10 * time.Second, Category: policy.CategoryTransient,
		Class: "transient:503", Note: "retry-after:2s", Checks: policy.CheckBreaker, Deadline: time.Now().Add(time.Hour).Truncate(time.Second)}
	stopped := policy.Answer{Stop: policy.StopAttemptsExhausted, Disposition: policy.DispositionDeadLetter,
		Category: policy.CategoryTransient, Class: "transient:503", Checks: policy.CheckBreaker}
	retrySpread := retry
	retrySpread.Delay, retrySpread.Note, retrySpread.Breaker = 7500*time.Millisecond, "retry-after:2s,cooldown:fleet", policy.BreakerClosed
	retrySpread.Checks, retrySpread.TenantTokens = policy.CheckBreaker|policy.CheckTenantBudget, 41.5
	cutOff := retry
	cutOff.Retry, cutOff.Delay, cutOff.AttemptTimeout = false, 0, 0
	cutOff.Stop, cutOff.Disposition, cutOff.Breaker = policy.StopCircuitOpen, policy.DispositionCircuitOpen, policy.BreakerOpen
	tests := []struct {
		name    string
		answer  policy.Answer // as stored
		verdict string        // policyd_nextdelay's, "" for a record of policyd_attempt
		want    policy.Answer // as replayed
		stop    bool
	}{
		{name: "a retry, no verdict", answer: retry, want: retry},
		{name: "a stop, no verdict", answer: stopped, want: stopped, stop: true},
		{name: "a retry the verdict spread", answer: retry, verdict: "1 7500000000 0 0 1 96 41.5 0 1", want: retrySpread},
		{name: "a retry the verdict stopped", answer: retry, verdict: "0 0 6 5 2 32 0 0 0", want: cutOff, stop: true},
	}
	p := policy.Default()
	expiry := time.Now().Add(time.Hour).UnixMilli()
	for i, tt := range tests {
		var outcomes [2]string
		for j, form := range []string{"JSON", "packed"} {
			var v []byte
			if form == "JSON" {
				v, _ = json.Marshal(tt.answer)
			} else {
				v = packAnswer(&tt.answer)
			}
			call := policy.CallKey{Tenant: "acme", CallID: "c" + strconv.Itoa(i) + form}
			key := keyAttempt(call.Tenant, call.CallID)
			c.HSet(ctx, key, "attempt", 2, "expiry", expiry, "answer", v)
			if tt.verdict != "" {
				c.HSet(ctx, key, "verdict", tt.verdict)
			}
			c.PExpireAt(ctx, key, time.UnixMilli(expiry))
			ask := func(attempt uint32) (policy.NextDelayResult, error) {
				st := policy.NextDelayStep{Call: call, Attempt: attempt,
					Key: policy.BreakerKey{Tenant: "acme", Target: "pay"}, Breaker: p.Breaker, Result: policy.ResultTransientFailure,
					Decision: policy.Decision{Retry: true, Delay: time.Second}, Policy: &p,
					Spend: policy.SpendRequest{Tenant: "acme"}, Keep: time.Now().Add(time.Hour)}
				res, ok, err := s.NextDelayInOneCall(s.Begin(), &st)
				if !ok {
					t.Fatalf("%s, %s: NextDelayInOneCall of attempt %d not taken in one call", tt.name, form, attempt)
				}
				return res, err
			}
			res, err := ask(2)
			if err != nil || !res.Replay || !sameAnswer(res.Answer, tt.want) {
				t.Errorf("%s, %s: attempt 2 again = %+v, %v\nwant the replay of %+v", tt.name, form, res, err, tt.want)
			}
			_, lower := ask(1)
			var r *fleet.Refusal
			if !errors.As(lower, &r) {
				t.Errorf("%s, %s: attempt 1 after 2 = %v, want a refusal", tt.name, form, lower)
			}
			res, next := ask(3)
			switch {
			case tt.stop && !errors.As(next, &r):
				t.Errorf("%s, %s: attempt 3 after a STOP = %+v, %v; want a refusal", tt.name, form, res, next)
			case !tt.stop && (next != nil || res.Replay):
				t.Errorf("%s, %s: attempt 3 after a retry = %+v, %v; want it decided", tt.name, form, res, next)
			}
			outcomes[j] = errString(lower) + " | " + errString(next)
		}
		if outcomes[0] != outcomes[1] {
			t.Errorf("%s: the JSON record answers %q, the packed one %q", tt.name, outcomes[0], outcomes[1])
		}
	}
}

// errString is err's message, "" for nil.
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
