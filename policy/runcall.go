package policy

import "time"

// MaxTriageRefLen is the longest triage reference a call may carry, in
// bytes.
const MaxTriageRefLen = 1024

// CallNote is what one NextDelay decision or one final disposition tells a
// run's call table about a call. Zero fields tell nothing: an empty
// Target, TriageRef, Classification or Detail leaves the one kept, a zero
// Attempt or Time moves no count or time, DispositionNone is not final.
// PrimaryTarget is the call's primary when Target is a fallback; it goes
// with Target (a note with a Target sets both).
type CallNote struct {
	Target         string
	PrimaryTarget  string
	TriageRef      string
	Attempt        uint32
	Classification string // of the attempt's failure
	Detail         string // the decision's or the final disposition's explanation
	Disposition    Disposition
	Stop           StopReason
	Time           time.Time // when policyd heard of the attempt
}

// RunCall is one call of a run as its call table keeps it, for triage.
type RunCall struct {
	CallID         string
	Disposition    Disposition // DispositionNone while the call is not final
	Stop           StopReason
	Attempts       uint32
	Classification string
	Detail         string
	First, Last    time.Time // the first and last attempt policyd heard of
	Target         string    // the target the call ended on
	TriageRef      string
	PrimaryTarget  string // the call's primary when Target is a fallback; empty otherwise
}

// RunCallFilter selects calls of a run: with Dispositions set, only those
// with one of them; with Stops set, only those with one of them.
type RunCallFilter struct {
	Dispositions []Disposition
	Stops        []StopReason
}

// Matches reports whether c passes f.
func (f *RunCallFilter) Matches(c *RunCall) bool {
	return (len(f.Dispositions) == 0 || contains(f.Dispositions, c.Disposition)) &&
		(len(f.Stops) == 0 || contains(f.Stops, c.Stop))
}

func contains[T comparable](s []T, v T) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
