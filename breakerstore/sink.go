package breakerstore

import (
	"errors"
	"fmt"

	"github.com/policyd/policyd/policy"
)

// AuditSink is a long-term tier of the audit trail (package auditsink
// writes one to files). The store hands it every audit record it commits,
// in commit order, from within the commit's transaction, before the
// records are written to bbolt: the group commit's, a SyncAlways batch's.
// Append must make the records durable before it returns, and must not
// keep recs after (the store reuses its buffer). It may be handed
// records again when a commit is retried (bbolt's Batch may run a commit
// twice, and a commit that failed after Append is retried later), and
// should skip sequence numbers it has appended.
//
// When Append fails the store refuses the commit: the transaction is
// rolled back, the records stay pending in the write-behind buffer (the
// entities of a group commit stay dirty) and go to the next commit, the
// failure is logged and counted in Stats.AuditSinkErrors. Records are
// dropped, and counted, only when the buffer fills, as for any failed
// commit.
type AuditSink interface {
	Append(recs []policy.AuditRecord) error
}

// ErrAuditSink wraps the error of an AuditSink that refused records.
var ErrAuditSink = errors.New("breakerstore: audit sink refused the records")

// sinkAudit hands recs to the audit sink, when there is one.
func (s *Store) sinkAudit(recs []policy.AuditRecord) error {
	if s.opts.AuditSink == nil || len(recs) == 0 {
		return nil
	}
	if err := s.opts.AuditSink.Append(recs); err != nil {
		s.trail.sinkErrors.Add(1)
		return fmt.Errorf("%w: %w", ErrAuditSink, err)
	}
	return nil
}
