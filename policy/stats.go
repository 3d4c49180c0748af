package policy

import "time"

// StatsAttempts is how many attempt numbers the attempt statistics tell
// apart: attempts 1 to 15 each, and a last bucket for 16 or more.
const StatsAttempts = 16

// StatsRetention is how far back the attempt statistics reach: hour
// buckets older than this are dropped.
const StatsRetention = 168 * time.Hour

// AttemptCounts counts calls by attempt number: [i] counts attempt i+1,
// the last attempt 16 or more.
type AttemptCounts [StatsAttempts]uint64

// Total returns the sum of the counts.
func (c *AttemptCounts) Total() uint64 {
	var n uint64
	for _, v := range c {
		n += v
	}
	return n
}

// AttemptTally is the end of one call as the attempt statistics count it:
// a success on attempt Attempt, or a final failure (any final disposition
// but SUCCEEDED) after attempt Attempt, counted for Tenant and Target, the
// target the attempt went to (a fallback's attempts count for the
// fallback). The zero value (Target empty) counts nothing.
type AttemptTally struct {
	Tenant  string
	Target  string
	Attempt uint32
	Success bool
}

// TargetStats is what the attempt statistics hold for one tenant and
// target over a window from Start to End: successes and final failures by
// attempt number.
type TargetStats struct {
	Tenant, Target string
	Start, End     time.Time
	Successes      AttemptCounts
	Failures       AttemptCounts
}
