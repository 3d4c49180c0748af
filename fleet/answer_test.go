package fleet_test

import (
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// TestPackedAnswer packs answers and reads them back from bytes and from
// a string alike, every field as it was, the bytes after the answer left
// to the record; the target is read only when the record says it is
// there, and a cut answer is refused.
func TestPackedAnswer(t *testing.T) {
	full := policy.Answer{Retry: true, Delay: 1500 * time.Millisecond, AttemptTimeout: 10 * time.Second,
		Stop: policy.StopBudgetExhausted, Disposition: policy.DispositionDeadLetter, Category: policy.CategoryTransient,
		Class: "transient:503", Note: "retry-after:2s", Checks: policy.CheckBreaker | policy.CheckTenantBudget,
		Breaker: policy.BreakerHalfOpen, TenantTokens: 41.25, RunRemaining: 1<<40 + 7, Deadline: time.Unix(0, 1_800_000_000_123_456_789)}
	fallback := full
	fallback.Target = "api-b"
	for _, a := range []policy.Answer{{}, full, fallback} {
		v := append(fleet.AppendAnswer(nil, &a), "tail"...)
		if len(v) != fleet.AnswerLen(&a)+4 {
			t.Errorf("%+v: %d bytes packed, AnswerLen says %d", a, len(v)-4, fleet.AnswerLen(&a))
		}
		var fromBytes, fromString policy.Answer
		restB, errB := fleet.ReadAnswer(v, &fromBytes, a.Target != "")
		restS, errS := fleet.ReadAnswer(string(v), &fromString, a.Target != "")
		if errB != nil || errS != nil || string(restB) != "tail" || restS != "tail" || fromBytes != a || fromString != a {
			t.Errorf("read back\ngot  %+v (rest %q, %v) and %+v (rest %q, %v)\nwant %+v", fromBytes, restB, errB,
				fromString, restS, errS, a)
		}
		for n := range fleet.AnswerLen(&a) {
			if _, err := fleet.ReadAnswer(v[:n], new(policy.Answer), a.Target != ""); err == nil {
				t.Errorf("%+v cut to %d bytes read without an error", a, n)
			}
		}
	}
}
