package main

import (
	"fmt"
	"slices"
)

// upstreamRecord is what the once command's fake upstream holds for one
// idempotency key: the record its first write created and how many
// writes with that key it received in all (1 when there was no
// duplicate).
type upstreamRecord struct {
	ID     string `json:"id"`
	Writes int    `json:"writes"`
}

// submission is how one worker's call for one document ended, as the
// worker saw it (policyclient.Result).
type submission struct {
	Doc         string `json:"doc"`
	CallID      string `json:"call_id"`
	Worker      int    `json:"worker"`
	Disposition string `json:"disposition"`
	StopReason  string `json:"stop_reason,omitempty"`
	Reason      string `json:"reason,omitempty"`
	Attempts    int    `json:"attempts"`
	Local       bool   `json:"local,omitempty"`
	Dedup       bool   `json:"deduplicated,omitempty"`
	ResultRef   string `json:"result_ref,omitempty"`
	Err         string `json:"err,omitempty"`
}

// ledgerCall is one call of the run's call table (ListRunCalls): its
// disposition and stop reason as the API names them ("" while not final),
// and the document it is for (its triage reference).
type ledgerCall struct {
	CallID      string
	Doc         string
	Disposition string
	StopReason  string
	Detail      string
}

// onceReport is the reconciliation of one once run.
type onceReport struct {
	Documents   int // documents the workers were given
	Submissions int // calls the workers made (more than Documents with overlap)
	Records     int // distinct records the upstream created, for the documents
	// Duplicates counts writes the upstream received for a key it already
	// had a record of: each would have been a second record.
	Duplicates int
	// DuplicateDocs are the documents written more than once.
	DuplicateDocs []string
	// Unwritten are the documents without an upstream record, each with
	// the dead letter of its calls in the run's ledger ("" when none).
	Unwritten []unwrittenDoc
	// Unaccounted are the unwritten documents none of whose calls the
	// ledger holds as a dead letter: neither written nor dead-lettered.
	Unaccounted []string
	// WrittenNotSucceeded are documents the upstream has a record of
	// whose every call the workers saw end otherwise than in success
	// (the lost answers): written once, reported as not done.
	WrittenNotSucceeded []string
	// SucceededUnwritten are documents a worker saw succeed without an
	// upstream record: a success reported for nothing.
	SucceededUnwritten []string
	// Deduplicated counts calls the idempotency ledger answered with an
	// earlier success, the upstream not called (the calls saved).
	Deduplicated int
	// Foreign counts upstream records of keys that are no document's.
	Foreign int
	// LedgerMissing are the calls the workers ended whose final
	// disposition the run's call table does not hold; LedgerDiffers those
	// it holds with another disposition than the worker's.
	LedgerMissing, LedgerDiffers []string
}

// unwrittenDoc is a document without an upstream record and the dead
// letter the ledger holds for it.
type unwrittenDoc struct {
	Doc        string
	DeadLetter string // "dead_letter (NOT_IDEMPOTENT): detail", "" for none
	Worker     string // how the workers' calls ended, for the record
}

// OK reports whether the run was exactly once: no duplicate write, every
// document written or dead-lettered in the ledger, and no success without
// a record.
func (r *onceReport) OK() bool {
	return r.Duplicates == 0 && len(r.Unaccounted) == 0 && len(r.SucceededUnwritten) == 0
}

// reconcileOnce checks the upstream's records (by idempotency key, which
// is the document id) against the documents, the workers' results and the
// run's call table. It is a pure function of its inputs.
func reconcileOnce(docs []string, records map[string]upstreamRecord, subs []submission, calls []ledgerCall) onceReport {
	r := onceReport{Documents: len(docs), Submissions: len(subs)}
	isDoc := make(map[string]bool, len(docs))
	for _, d := range docs {
		isDoc[d] = true
	}
	for k := range records {
		if !isDoc[k] {
			r.Foreign++
		}
	}
	byDoc := map[string][]submission{}
	for _, s := range subs {
		byDoc[s.Doc] = append(byDoc[s.Doc], s)
		if s.Dedup {
			r.Deduplicated++
		}
	}
	dead := map[string]ledgerCall{}
	final := map[string]string{}
	listed := map[string]bool{}
	for _, c := range calls {
		listed[c.CallID] = true
		if c.Disposition != "" {
			final[c.CallID] = c.Disposition
		}
		if c.Disposition == "dead_letter" {
			if _, ok := dead[c.Doc]; !ok {
				dead[c.Doc] = c
			}
		}
	}
	for _, d := range docs {
		rec, written := records[d]
		succeeded := false
		var ends []string
		for _, s := range byDoc[d] {
			succeeded = succeeded || s.Disposition == "succeeded"
			e := s.Disposition
			if s.StopReason != "" {
				e += " (" + s.StopReason + ")"
			}
			if s.Reason != "" {
				e += ": " + s.Reason
			}
			ends = append(ends, e)
		}
		switch {
		case written:
			r.Records++
			if rec.Writes > 1 {
				r.Duplicates += rec.Writes - 1
				r.DuplicateDocs = append(r.DuplicateDocs, d)
			}
			if !succeeded {
				r.WrittenNotSucceeded = append(r.WrittenNotSucceeded, d)
			}
		default:
			u := unwrittenDoc{Doc: d, Worker: fmt.Sprint(ends)}
			if c, ok := dead[d]; ok {
				u.DeadLetter = c.Disposition
				if c.StopReason != "" {
					u.DeadLetter += " (" + c.StopReason + ")"
				}
				if c.Detail != "" {
					u.DeadLetter += ": " + c.Detail
				}
			} else {
				r.Unaccounted = append(r.Unaccounted, d)
			}
			r.Unwritten = append(r.Unwritten, u)
			if succeeded {
				r.SucceededUnwritten = append(r.SucceededUnwritten, d)
			}
		}
	}
	for _, s := range subs {
		switch d, ok := final[s.CallID]; {
		case !ok && listed[s.CallID]:
			r.LedgerMissing = append(r.LedgerMissing, s.CallID+" (listed, not final)")
		case !ok:
			r.LedgerMissing = append(r.LedgerMissing, s.CallID+" (not listed)")
		case d != s.Disposition:
			r.LedgerDiffers = append(r.LedgerDiffers, s.CallID+": ledger "+d+", worker "+s.Disposition)
		}
	}
	slices.Sort(r.LedgerMissing)
	slices.Sort(r.LedgerDiffers)
	slices.Sort(r.DuplicateDocs)
	return r
}
