package breakerstore

import (
	"errors"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// ApplyOutcomes applies a batch of reported outcomes in order: each one's
// Result to its breaker as Record does, its Audit records as AppendAudit
// does, and its final disposition to its run's ledger as RecordFinal does;
// then deposits[tenant] successes as Deposit does. Its Tally is counted in
// the attempt statistics when it applies, and with a final disposition of
// a run only when the ledger took it as the call's first. An update the state's
// rules refuse (fleet.ErrPermit, fleet.AlreadyFinal) gets the refusal in its Refused field and
// only its audit records applied; the rest of the batch goes on. It stops at
// the first other error and returns the number of updates applied in full (the audit
// records of those, and of the one that failed after its result was
// recorded, are kept); the deposits are made only when every update was.
//
// With SyncAlways everything the batch changed is committed in one
// transaction (shared with concurrent callers through bbolt's Batch) before
// ApplyOutcomes returns, where calling Record, RecordFinal, Deposit and
// AppendAudit one by one commits once each: a batch of 100 outcomes waits for
// one commit instead of 100. A breaker state transition is still committed
// on its own, at once, as Record does. If the final commit fails, the
// changes stay in memory, the flusher retries them, and the error is
// returned. ApplyOutcomes is safe for concurrent use.
func (s *Store) ApplyOutcomes(ups []policy.OutcomeUpdate, deposits map[string]int) (int, error) {
	var p *pending
	if s.opts.Sync == SyncAlways {
		p = shared()
	}
	now := s.now() // one reading of the clock for the batch
	trail := make([][]policy.AuditRecord, 0, len(ups))
	var tallies tallyTable
	n, err := func() (int, error) {
		for i := range ups {
			u := &ups[i]
			u.Refused = nil
			var b *breaker // the outcome's, whose attempt statistics the tally may share
			if u.Result != 0 {
				var err error
				if b, err = s.record(u.Key, u.Breaker, u.Result, u.PermitID, p, now, nil); err != nil {
					if !refusal(err) {
						return i, err
					}
					u.Refused = err
				}
			}
			trail = append(trail, u.Audit)
			if u.Refused != nil {
				continue
			}
			count := u.Tally.Target != ""
			if u.RunID != "" && u.Final != policy.DispositionNone {
				first, err := s.recordFinal(u.RunID, u.CallID, fleet.Final{Disposition: u.Final, Stop: u.Stop,
					Deduplicated: u.Deduplicated}, p)
				if err != nil {
					if !refusal(err) {
						return i, err
					}
					u.Refused = err
				}
				count = count && first
			}
			if count {
				ts := s.statsOf(b, u.Tally)
				if ts == nil {
					ts = s.targetStats(u.Tally) // nil beyond the tenant's cap
				}
				if ts == nil || !tallies.add(u.Tally, ts) {
					s.countAttemptsN(ts, u.Tally, 1, now, p)
				}
			}
			if u.RunID != "" && u.Note != (policy.CallNote{}) {
				if err := s.noteCall(u.RunID, u.CallID, u.Note, p); err != nil && !errors.Is(err, ErrNotFound) {
					return i, err
				}
			}
		}
		for tenant, k := range deposits {
			s.deposit(tenant, k, p)
		}
		return len(ups), nil
	}()
	tallies.count(s, now, p) // those of the updates applied
	s.appendAudit(p, trail...)
	if p != nil {
		if cerr := s.commit(p); err == nil {
			err = cerr
		}
	}
	return n, err
}

// refusal reports whether err is the state's rules refusing a request (a
// *fleet.Refusal) rather than a failure of the store.
func refusal(err error) bool {
	var r *fleet.Refusal
	return errors.As(err, &r)
}
