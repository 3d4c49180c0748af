//go:build !race

package policy_test

// raceEnabled is true under the race detector, which allocates on its own
// and so makes allocation counts meaningless.
const raceEnabled = false
