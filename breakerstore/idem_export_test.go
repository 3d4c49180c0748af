package breakerstore

import "go.etcd.io/bbolt"

// KeyRecordsOnDisk counts the idempotency records in s's file.
func KeyRecordsOnDisk(s *Store) (n int, err error) {
	err = s.db.View(func(tx *bbolt.Tx) error {
		n = tx.Bucket(bucketIdemKeys).Stats().KeyN
		return nil
	})
	return n, err
}
