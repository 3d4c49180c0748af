package redisstore

// CheckSlots is checkSlots, for the external tests that start a Cluster.
var CheckSlots = checkSlots

// LiveReplicas is the count of live replicas the store last read.
func (s *Store) LiveReplicas() int { return s.degraded.replicas() }
