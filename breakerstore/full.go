package breakerstore

import (
	"errors"
	"fmt"
	"strings"

	berrors "go.etcd.io/bbolt/errors"
)

// reservePages is the number of free pages the store keeps for deletions
// once the file has reached Options.MaxSize; counterPages, fewer, is the
// floor for the commits of counters and audit records, which mostly
// rewrite pages in place and go on while admin writes are refused.
//
// bbolt never overwrites a page in place: every commit, a deletion too,
// needs a few free pages for the new copies of the pages it changes, and
// frees the old ones. In a file at its cap, small writes that still fit
// would use up the last free pages, and from then on no transaction could
// commit, not even the deletion meant to make room; only a restart with a
// larger cap would. So once a write has hit the cap, every write but a
// deletion first checks that enough pages are free. In a small file the
// floors shrink in proportion, to at most 1/8 of its pages.
const (
	reservePages = 32
	counterPages = 12
)

// roomLeft returns ErrDiskFull when the file has reached Options.MaxSize
// and no more than floor pages are free: those are kept for deletions
// (DeletePolicy, DeleteBudget), so that space can always be freed and writes
// resume without a restart. It is called at the start of every write
// transaction that is not a deletion, with reservePages for admin writes
// and counterPages for commits of counters and breaker transitions; a floor
// < 0 checks nothing.
func (s *Store) roomLeft(floor int) error {
	if floor < 0 || !s.capped.Load() {
		return nil
	}
	floor = min(floor, s.opts.MaxSize/s.db.Info().PageSize*floor/(8*reservePages))
	if free := s.db.Stats().FreePageN; free <= floor {
		return fmt.Errorf("%w: the file is at its size cap with %d free pages, kept for deletions", ErrDiskFull, free)
	}
	return nil
}

// writeErr is storageErr for a failed write; a write that hit
// Options.MaxSize turns on the reserve of roomLeft.
func (s *Store) writeErr(op string, err error) error {
	if errors.Is(err, berrors.ErrMaxSizeReached) || strings.Contains(err.Error(), berrors.ErrMaxSizeReached.Error()) {
		s.capped.Store(true)
	}
	return storageErr(op, err)
}
