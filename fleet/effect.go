package fleet

// Effect says what a method did to its value, so the engine holding it
// knows what to persist and publish.
type Effect uint8

// Effects; a method returns their union.
const (
	// Mutated: a persisted field changed (counters, permits, tokens); the
	// engine writes the value with its next group commit.
	Mutated Effect = 1 << iota
	// Transitioned: the breaker's state changed; the durability contract
	// asks the engine to commit at once and publish the new state.
	Transitioned
	// CooldownStarted: a fleet-wide cool-down began (not merely moved
	// later); subscribers are told.
	CooldownStarted
)

// Has reports whether e includes every effect of f.
func (e Effect) Has(f Effect) bool { return e&f == f }
