package fleet_test

import (
	"slices"
	"testing"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

func TestAttemptSlot(t *testing.T) {
	for _, tc := range []struct {
		attempt uint32
		want    int
	}{
		{0, 0}, {1, 0}, {2, 1}, {15, 14}, {16, 15}, {17, 15}, {1000, 15},
	} {
		if got := fleet.AttemptSlot(tc.attempt); got != tc.want {
			t.Errorf("AttemptSlot(%d) = %d, want %d", tc.attempt, got, tc.want)
		}
	}
}

func TestHourOf(t *testing.T) {
	h := int64(time.Hour)
	for _, tc := range []struct {
		now, want int64
	}{
		{0, 0}, {h - 1, 0}, {h, 1}, {5*h + 7, 5}, {-1, -1}, {-h, -1}, {-h - 1, -2},
	} {
		if got := fleet.HourOf(tc.now); got != tc.want {
			t.Errorf("HourOf(%d) = %d, want %d", tc.now, got, tc.want)
		}
	}
}

func TestAttemptStatsBuckets(t *testing.T) {
	base := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC).UnixNano()
	h := int64(time.Hour)
	var s fleet.AttemptStats
	s.Count(base+5*int64(time.Minute), 1, true)
	s.Count(base+59*int64(time.Minute), 1, true) // same hour
	s.Count(base+h, 2, true)                     // next hour
	s.Count(base+h+1, 3, false)
	s.Count(base+h+2, 16, false)
	s.Count(base+h+3, 40, false) // 16 or more
	s.Count(base+h+4, 0, true)   // no attempt given: the first

	if len(s.Hours) != 2 {
		t.Fatalf("got %d hour buckets, want 2: %+v", len(s.Hours), s.Hours)
	}
	b0, ok := s.Bucket(fleet.HourOf(base))
	if !ok || b0.Successes[0] != 2 || b0.Failures.Total() != 0 {
		t.Errorf("first hour = %+v, want 2 successes on attempt 1", b0)
	}
	b1, _ := s.Bucket(fleet.HourOf(base + h))
	if b1.Successes[0] != 1 || b1.Successes[1] != 1 || b1.Failures[2] != 1 || b1.Failures[15] != 2 {
		t.Errorf("second hour = %+v, want successes 1 on attempt 1 and 2, failures 1 on 3 and 2 on 16+", b1)
	}

	succ, fail, start := s.Sum(base, base+h+5)
	if succ[0] != 3 || succ[1] != 1 || fail[2] != 1 || fail[15] != 2 || succ.Total() != 4 || fail.Total() != 3 {
		t.Errorf("Sum = %v %v, want 4 successes (3 on attempt 1) and 3 failures", succ, fail)
	}
	if start != base {
		t.Errorf("Sum start = %d, want %d (the first hour's start)", start, base)
	}
	// A window starting within the second hour covers that hour whole.
	succ, _, start = s.Sum(base+h+30*int64(time.Minute), base+h+40*int64(time.Minute))
	if succ.Total() != 2 || start != base+h {
		t.Errorf("Sum of the second hour = %v from %d, want 2 successes from %d", succ, start, base+h)
	}
}

func TestAttemptStatsRetention(t *testing.T) {
	h := int64(time.Hour)
	base := 1000 * h
	var s fleet.AttemptStats
	for i := range int64(200) {
		_, dropped := s.Count(base+i*h, 1, true)
		want := []int64(nil)
		if i >= fleet.StatsHours {
			want = []int64{1000 + i - fleet.StatsHours}
		}
		if !slices.Equal(dropped, want) {
			t.Fatalf("hour %d: dropped %v, want %v", i, dropped, want)
		}
	}
	if int64(len(s.Hours)) != fleet.StatsHours {
		t.Fatalf("kept %d buckets, want %d", len(s.Hours), fleet.StatsHours)
	}
	now := base + 199*h
	if s.Hours[0].Hour != fleet.HourOf(now)-fleet.StatsHours+1 {
		t.Errorf("oldest bucket hour %d, want %d", s.Hours[0].Hour, fleet.HourOf(now)-fleet.StatsHours+1)
	}
	// A window reaching further back than the retention covers the
	// retention only.
	succ, _, start := s.Sum(0, now)
	if int64(succ[0]) != fleet.StatsHours || start != (fleet.HourOf(now)-fleet.StatsHours+1)*h {
		t.Errorf("Sum(0) = %d successes from %d, want %d from the retention's start", succ[0], start, fleet.StatsHours)
	}
	// Read later without a Count: buckets past the retention are not summed.
	later := now + 100*h
	succ, _, _ = s.Sum(0, later)
	if int64(succ[0]) != fleet.StatsHours-100 {
		t.Errorf("Sum 100 h later = %d, want %d", succ[0], fleet.StatsHours-100)
	}
	if dropped := s.Expire(later); len(dropped) != 100 || int64(len(s.Hours)) != fleet.StatsHours-100 {
		t.Errorf("Expire dropped %d, kept %d; want 100 and %d", len(dropped), len(s.Hours), fleet.StatsHours-100)
	}
	if dropped := s.Expire(later); dropped != nil {
		t.Errorf("Expire again dropped %v, want nothing", dropped)
	}
}

func TestAttemptStatsAdd(t *testing.T) {
	var s fleet.AttemptStats
	var a, b fleet.AttemptHour
	a.Hour, b.Hour = 7, 3
	a.Successes[0], b.Failures[1] = 2, 5
	s.Add(a)
	s.Add(b)
	s.Add(a)
	if len(s.Hours) != 2 || s.Hours[0].Hour != 3 || s.Hours[1].Hour != 7 {
		t.Fatalf("hours = %+v, want 3 then 7", s.Hours)
	}
	if s.Hours[1].Successes[0] != 4 || s.Hours[0].Failures[1] != 5 {
		t.Errorf("counts = %+v, want 4 successes in hour 7 and 5 failures in hour 3", s.Hours)
	}
}

func TestAttemptCountsTotal(t *testing.T) {
	var c policy.AttemptCounts
	c[0], c[15] = 3, 4
	if got := c.Total(); got != 7 {
		t.Errorf("Total = %d, want 7", got)
	}
}
