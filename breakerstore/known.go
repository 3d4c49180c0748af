package breakerstore

import "github.com/policyd/policyd/policy"

// LastAnswers is LastAnswer of every call of keys, into out[i], with the
// attempt it answered in attempts[i] (0: none; out and attempts at least
// as long as keys). It is safe for concurrent use.
func (s *Store) LastAnswers(keys []policy.CallKey, out []policy.Answer, attempts []uint32) {
	for i, k := range keys {
		out[i], attempts[i] = s.lastAnswer(k)
	}
}

// KnownBreaker is Breaker without the error: the store holds every
// breaker in memory, so what it knows is the fleet's state. ok is false
// for a breaker never stored (or after Close).
func (s *Store) KnownBreaker(key policy.BreakerKey) (policy.BreakerSnapshot, bool) {
	snap, err := s.Breaker(key)
	return snap, err == nil
}
