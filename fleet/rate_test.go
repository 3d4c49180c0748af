package fleet_test

import (
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// TestRateNeverExceedsRateTimesTimePlusBurst: requests arriving at every
// spacing, admitted by GCRA, never number more than t/interval + burst in
// any span from the start, and each refusal's wait is exact: asking again
// after it is admitted.
func TestRateNeverExceedsRateTimesTimePlusBurst(t *testing.T) {
	const interval = sec / 4 // 4 per second
	for _, burst := range []int{1, 3, 10} {
		for _, gap := range []int64{sec / 100, sec / 7, sec / 4, sec} {
			var r fleet.Rate
			admitted := 0
			for now := int64(0); now < 30*sec; now += gap {
				ok, wait, _ := r.Take(now, interval, burst)
				if ok {
					admitted++
				} else {
					probe := r
					if ok, _, _ := probe.Take(now+wait, interval, burst); !ok {
						t.Fatalf("burst %d gap %d: refused at %d with wait %d, refused again after it", burst, gap, now, wait)
					}
					early := r
					if ok, _, _ := early.Take(now+wait-1, interval, burst); ok {
						t.Fatalf("burst %d gap %d: admitted 1ns before the wait ran out", burst, gap)
					}
				}
				if limit := int(now/interval) + burst; admitted > limit {
					t.Fatalf("burst %d gap %d: %d admitted by %dns, limit %d", burst, gap, admitted, now, limit)
				}
			}
		}
	}
}

func TestFlowGivesBackWhatARefusalTook(t *testing.T) {
	lim := policy.FlowLimits{Ceiling: 1, LeaseTTL: 10 * time.Second, FullWait: time.Second, Interval: time.Second, Burst: 2}
	var f fleet.Flow
	ids := seq()
	a, _ := f.Admit(0, &lim, ids)
	if !a.Admitted || a.LeaseID == "" {
		t.Fatalf("first: %+v, want admitted with a lease", a)
	}
	// The ceiling is full: the rate slot this took is given back.
	if a, _ := f.Admit(0, &lim, ids); a.Admitted || a.Reason != fleet.ReasonFull {
		t.Fatalf("second: %+v, want refused %s", a, fleet.ReasonFull)
	}
	// The breaker refused the first: Undo returns its lease and slot.
	f.Undo(0, &lim, &a)
	for i := range 2 {
		b, _ := f.Admit(0, &lim, ids)
		if !b.Admitted {
			t.Fatalf("after Undo, %d: %+v, want admitted (burst 2, nothing spent)", i, b)
		}
		f.Undo(0, &lim, &b)
	}
}
