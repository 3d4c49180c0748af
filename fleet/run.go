package fleet

import (
	"strings"

	"github.com/policyd/policyd/policy"
)

// Final is a call's final disposition as a run's ledger keeps it.
type Final struct {
	Disposition policy.Disposition
	Stop        policy.StopReason
	// Deduplicated marks a success the idempotency ledger answered; the
	// ledger counts it in Deduplicated as well as in Succeeded.
	Deduplicated bool
}

// Run is a batch run's live state: a retry pool of Pool retries its calls
// share until the wall-clock Cutoff (Unix ns), the retries Spent, and the
// Ledger of final dispositions, one per call id in Calls.
type Run struct {
	Pool   uint64
	Cutoff int64
	Spent  uint64
	Ledger policy.Ledger
	Calls  map[string]Final
}

// NewRun returns an unspent run of pool retries until cutoff.
func NewRun(pool uint64, cutoff int64) Run {
	return Run{Pool: pool, Cutoff: cutoff, Calls: map[string]Final{}}
}

// Refusal says why the run refuses a retry at now, or returns StopNone:
// past its cut-off every retry is refused with StopDeadline and
// DispositionDeadlineCut, with its pool spent with StopBudgetExhausted and
// DispositionDeadLetter.
func (r *Run) Refusal(now int64) (policy.StopReason, policy.Disposition) {
	switch {
	case now >= r.Cutoff:
		return policy.StopDeadline, policy.DispositionDeadlineCut
	case r.Spent >= r.Pool:
		return policy.StopBudgetExhausted, policy.DispositionDeadLetter
	}
	return policy.StopNone, policy.DispositionNone
}

// Spend charges one retry to the pool; the caller has checked Refusal, so
// the pool is never overspent.
func (r *Run) Spend() { r.Spent++ }

// Remaining returns the retries left in the pool.
func (r *Run) Remaining() uint64 { return r.Pool - min(r.Spent, r.Pool) }

// RecordFinal records call's final disposition f in the ledger. The first
// final disposition of a call id wins: the same report again counts once
// and changes nothing, and a different one is refused with
// AlreadyFinal(prev), the ledger unchanged. It returns the call id as the
// run keeps it (a copy when new, so the map does not pin the caller's
// buffer) and whether the ledger changed; ok is false for a disposition
// the ledger has no counter for (DispositionNone, an unknown value), which
// changes nothing.
func (r *Run) RecordFinal(call string, f Final) (kept string, changed, ok bool, refused *Refusal) {
	var probe policy.Ledger
	if LedgerSlot(&probe, f) == nil {
		return "", false, false, nil
	}
	if prev, had := r.Calls[call]; had {
		if prev != f {
			return call, false, true, AlreadyFinal(prev)
		}
		return call, false, true, nil
	}
	call = strings.Clone(call)
	r.count(f)
	r.Calls[call] = f
	return call, true, true, nil
}

// AlreadyFinal is the refusal of a final disposition for a call whose
// first one, prev, is counted already.
func AlreadyFinal(prev Final) *Refusal {
	rule := "already final as " + prev.Disposition.String()
	if prev.Stop != policy.StopNone {
		rule += " (" + prev.Stop.String() + ")"
	}
	return &Refusal{Field: "final_disposition", Rule: rule + "; the first final disposition of a call id wins"}
}

// Restore counts a final disposition read back from disk; ok is false when
// the ledger has no counter for it.
func (r *Run) Restore(call string, f Final) bool {
	slot := LedgerSlot(&r.Ledger, f)
	if slot == nil {
		return false
	}
	if prev, had := r.Calls[call]; had {
		r.uncount(prev)
	}
	r.count(f)
	r.Calls[call] = f
	return true
}

// count adds f to the ledger; uncount takes it away.
func (r *Run) count(f Final) {
	*LedgerSlot(&r.Ledger, f)++
	if f.Deduplicated {
		r.Ledger.Deduplicated++
	}
}

func (r *Run) uncount(f Final) {
	*LedgerSlot(&r.Ledger, f)--
	if f.Deduplicated {
		r.Ledger.Deduplicated--
	}
}

// LedgerSlot returns the counter of l a final disposition is counted under,
// or nil for DispositionNone and unknown values: SUCCEEDED, FAILED_TERMINAL,
// CIRCUIT_OPEN and DEADLINE_CUT have their own; DEAD_LETTER is split by stop
// reason (budget, not idempotent, pushback, the call's own deadline, and
// attempts exhausted for the rest).
func LedgerSlot(l *policy.Ledger, f Final) *uint64 {
	switch f.Disposition {
	case policy.DispositionSucceeded:
		return &l.Succeeded
	case policy.DispositionFailedTerminal:
		return &l.FailedTerminal
	case policy.DispositionDeadLetter:
		switch f.Stop {
		case policy.StopBudgetExhausted:
			return &l.DeadLetterBudget
		case policy.StopNotIdempotent:
			return &l.DeadLetterNotIdempotent
		case policy.StopServerPushback:
			return &l.DeadLetterPushback
		case policy.StopDeadline:
			return &l.DeadLetterDeadline
		}
		return &l.DeadLetterExhausted
	case policy.DispositionCircuitOpen:
		return &l.CircuitOpen
	case policy.DispositionDeadlineCut:
		return &l.DeadlineCut
	}
	return nil
}
