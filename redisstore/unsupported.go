package redisstore

import "github.com/policyd/policyd/policy"

// unsupported is what this engine does not hold yet: the fleet-wide
// ceilings (leases and rate accounts; SetPolicy refuses a policy with one)
// live on the bbolt engine only in this version. The server
// answers UNIMPLEMENTED, naming what is missing, rather than pretending.
type unsupported string

// Error says what the Redis engine does not support.
func (u unsupported) Error() string {
	return string(u) + " is not supported on the Redis engine yet (use the bbolt engine)"
}

// Unsupported reports that the engine does not offer the operation.
func (unsupported) Unsupported() bool { return true }

// AdmitFlow is Admit for a policy without ceilings, the only kind SetPolicy
// stores on this engine; lim with a ceiling is not supported yet.
func (s *Store) AdmitFlow(key policy.BreakerKey, cfg policy.BreakerConfig, lim policy.FlowLimits) (policy.Admission, error) {
	if lim.Ceiling > 0 || lim.Interval > 0 {
		return policy.Admission{}, unsupported("a fleet-wide ceiling (flow.max_in_flight, flow.max_rate)")
	}
	return s.Admit(key, cfg)
}

// ReleaseLease holds no leases on this engine: every release is of a lease
// not held, which is ignored, never an error.
func (s *Store) ReleaseLease(key policy.BreakerKey, id string, lim policy.FlowLimits, sig policy.FlowSignal) (bool, error) {
	return false, nil
}

// Pool is the zero status: this engine holds no leases yet.
func (s *Store) Pool(key policy.BreakerKey) (policy.PoolStatus, error) {
	return policy.PoolStatus{}, nil
}
