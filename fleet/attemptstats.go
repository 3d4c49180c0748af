package fleet

import (
	"cmp"
	"slices"
	"time"

	"github.com/policyd/policyd/policy"
)

// StatsHours is how many hour buckets AttemptStats keeps: the hour of now
// and the 167 before it, policy.StatsRetention.
const StatsHours = int64(policy.StatsRetention / time.Hour)

// AttemptHour is one hour bucket of AttemptStats: the calls that ended
// within the hour that starts at Hour hours after the Unix epoch.
type AttemptHour struct {
	Hour      int64
	Successes policy.AttemptCounts
	Failures  policy.AttemptCounts
}

// AttemptStats is the attempt statistics of one tenant and target: per
// hour, successes by attempt number and final failures by attempt number
// (policy.AttemptCounts), kept for StatsHours hours, rolling. Hours holds
// the buckets in ascending order, none older than the retention at the
// last Count. Count and Expire keep the rules; Sum reads a window.
type AttemptStats struct {
	Hours []AttemptHour
}

// HourOf returns the hour bucket of now (Unix ns): whole hours since the
// Unix epoch, rounded down (also before the epoch).
func HourOf(now int64) int64 {
	h := now / int64(time.Hour)
	if now%int64(time.Hour) < 0 {
		h--
	}
	return h
}

// AttemptSlot returns the index of attempt in policy.AttemptCounts:
// attempt-1, attempts of 16 or more in the last slot; attempt 0 (not
// given) counts as the first.
func AttemptSlot(attempt uint32) int {
	return int(min(max(attempt, 1), policy.StatsAttempts)) - 1
}

// Count counts a call that ended at now (Unix ns) on attempt: a success,
// or a final failure. It returns the hour counted, and the buckets beyond
// the retention it dropped (Expire), so an engine that stores a bucket a
// record can write the one and delete the others. It allocates only for a
// new hour bucket.
func (s *AttemptStats) Count(now int64, attempt uint32, success bool) (hour int64, dropped []int64) {
	return s.CountN(now, attempt, success, 1)
}

// CountN is Count for n calls that ended alike.
func (s *AttemptStats) CountN(now int64, attempt uint32, success bool, n uint64) (hour int64, dropped []int64) {
	hour = HourOf(now)
	i, found := slices.BinarySearchFunc(s.Hours, hour, byHour)
	if !found {
		dropped = s.Expire(now)
		i, _ = slices.BinarySearchFunc(s.Hours, hour, byHour)
		s.Hours = slices.Insert(s.Hours, i, AttemptHour{Hour: hour})
	}
	slot := AttemptSlot(attempt)
	if success {
		s.Hours[i].Successes[slot] += n
	} else {
		s.Hours[i].Failures[slot] += n
	}
	return hour, dropped
}

// Expire drops the hour buckets older than the retention at now (an hour
// h is kept while h > HourOf(now) - StatsHours) and returns their hours,
// nil when none.
func (s *AttemptStats) Expire(now int64) []int64 {
	oldest := HourOf(now) - StatsHours + 1
	n := 0
	for n < len(s.Hours) && s.Hours[n].Hour < oldest {
		n++
	}
	if n == 0 {
		return nil
	}
	dropped := make([]int64, n)
	for i := range n {
		dropped[i] = s.Hours[i].Hour
	}
	s.Hours = slices.Delete(s.Hours, 0, n)
	return dropped
}

// Sum adds up the buckets of the window from since to now (Unix ns):
// every hour bucket that ends after since, none beyond the retention at
// now. It returns the counts and the window's start, the start of its
// first hour (at most since, at least the retention's start), so a
// reader knows what the figures cover; the window ends at now.
func (s *AttemptStats) Sum(since, now int64) (successes, failures policy.AttemptCounts, start int64) {
	first := max(HourOf(since), HourOf(now)-StatsHours+1)
	for i := range s.Hours {
		b := &s.Hours[i]
		if b.Hour < first || b.Hour > HourOf(now) {
			continue
		}
		for j := range b.Successes {
			successes[j] += b.Successes[j]
			failures[j] += b.Failures[j]
		}
	}
	return successes, failures, first * int64(time.Hour)
}

// Add adds the counts of b into the bucket of its hour, creating it in
// order: an engine that reads buckets back (from disk, or one record per
// hour) rebuilds the value with it.
func (s *AttemptStats) Add(b AttemptHour) {
	i, found := slices.BinarySearchFunc(s.Hours, b.Hour, byHour)
	if !found {
		s.Hours = slices.Insert(s.Hours, i, b)
		return
	}
	for j := range b.Successes {
		s.Hours[i].Successes[j] += b.Successes[j]
		s.Hours[i].Failures[j] += b.Failures[j]
	}
}

// Bucket returns the bucket of hour, and false when there is none.
func (s *AttemptStats) Bucket(hour int64) (AttemptHour, bool) {
	i, found := slices.BinarySearchFunc(s.Hours, hour, byHour)
	if !found {
		return AttemptHour{}, false
	}
	return s.Hours[i], true
}

// byHour orders a bucket against an hour, for slices.BinarySearchFunc.
func byHour(b AttemptHour, h int64) int { return cmp.Compare(b.Hour, h) }
