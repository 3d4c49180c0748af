package policyclient

import (
	"sync"
	"time"
)

// maxRunCutoffs bounds runCutoffs; beyond it the map starts over, and a
// run forgotten costs one Admit more.
const maxRunCutoffs = 1024

// runCutoffs remembers the cut-off of each run the client's calls named,
// as Admit told it (AdmitResponse.run_cutoff_time), so that the client
// holds a run's cut-off with its own clock before every attempt and still
// skips Admit while a breaker is CLOSED: one Admit per run tells it. Its
// zero value is empty; it is safe for concurrent use.
type runCutoffs struct {
	mu sync.RWMutex
	m  map[string]time.Time
}

// lookup returns run's cut-off, when Admit told it.
func (r *runCutoffs) lookup(run string) (time.Time, bool) {
	r.mu.RLock()
	cut, ok := r.m[run]
	r.mu.RUnlock()
	return cut, ok
}

// learn remembers run's cut-off.
func (r *runCutoffs) learn(run string, cut time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[run]; !ok && (r.m == nil || len(r.m) >= maxRunCutoffs) {
		r.m = make(map[string]time.Time)
	}
	r.m[run] = cut
}

// cutoffBinds returns the deadline a local decision of the loop holds to:
// the call's, or its run's cut-off when that comes first (cut true).
func (l *loop) cutoffBinds() (deadline time.Time, cut bool) {
	deadline = l.call.deadline
	if !l.cutoff.IsZero() && (deadline.IsZero() || l.cutoff.Before(deadline)) {
		return l.cutoff, true
	}
	return deadline, false
}

// runCut reports whether the call's run is past its cut-off by the
// client's clock, learning the cut-off from the client's memory of runs
// first; known says whether the cut-off is known at all (else Admit must
// be asked, even while the breaker is CLOSED). A call of no run is never
// cut and its run is known.
func (l *loop) runCut() (cut, known bool) {
	if l.call.runID == "" {
		return false, true
	}
	if l.cutoff.IsZero() {
		l.cutoff, _ = l.c.runs.lookup(l.call.runID)
		if l.cutoff.IsZero() {
			return false, false
		}
	}
	return !l.c.cfg.Now().Before(l.cutoff), true
}
