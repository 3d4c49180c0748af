package redisstore

// CheckSlots is checkSlots, for the external tests that start a Cluster.
var CheckSlots = checkSlots

// LiveReplicas is the count of live replicas the store last read.
func (s *Store) LiveReplicas() int { return s.degraded.replicas() }

// Debts is the number of degraded-mode grants not charged to the engine yet.
func (s *Store) Debts() int {
	s.degraded.mu.Lock()
	defer s.degraded.mu.Unlock()
	n := len(s.degraded.debts)
	for _, t := range s.degraded.spent {
		if t > 0 {
			n++
		}
	}
	return n
}

// FlushHeld sends the held outcome batches, as the flusher does every
// FlushInterval.
func (s *Store) FlushHeld() { s.flushHeld() }
