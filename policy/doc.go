// Package policy is the pure decision math of policyd: failure
// classification, exponential backoff and jitter, server pushback hints
// (Retry-After and friends), deadlines, and retry budget planning.
//
// The package imports only the standard library and performs no I/O. It never
// reads a clock and never draws random numbers itself: callers pass the
// current time as a time.Time and every random draw as a float64 in [0, 1).
// The same inputs therefore always give the same outputs, which is what makes
// the rules testable without sleeping and lets every worker of the fleet get
// the same answer.
//
// All functions are safe for concurrent use. Policy values are read, never
// modified; callers must not mutate a Policy's slices while another goroutine
// decides with it.
//
// Durations are time.Duration values (nanoseconds); counts of attempts start
// at 1 for the first attempt, while retry indexes of the backoff schedule
// start at 0 for the first retry.
package policy
