package breakerstore

import "go.etcd.io/bbolt"

// Crash closes the database the way a crash would: the flusher stops
// without the final flush, so only what was committed survives.
func (s *Store) Crash() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		close(s.stop)
		<-s.done
		s.closeSubs()
		s.closeErr = s.db.Close()
	})
	return s.closeErr
}

// View runs fn in a read transaction on the store's own database.
func (s *Store) View(fn func(tx *bbolt.Tx) error) error { return s.db.View(fn) }
