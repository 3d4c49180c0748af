package statuspage

import (
	"sync"
	"time"

	"github.com/policyd/policyd/policy"
)

// history keeps the last n samples of each listed breaker's failure count,
// and when the store's flush errors last rose. It is safe for concurrent
// use.
type history struct {
	n int

	mu          sync.Mutex
	samples     map[policy.BreakerKey][]uint64 // oldest first, at most n
	flushErrors uint64
	flushRose   time.Time
}

func newHistory(n int) history {
	return history{n: n, samples: map[policy.BreakerKey][]uint64{}}
}

// record appends each breaker's failure count to its samples and forgets
// the breakers not in bs; flushErrors is the store's count now.
func (h *history) record(now time.Time, bs []policy.BreakerSnapshot, flushErrors uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := make(map[policy.BreakerKey][]uint64, len(bs))
	for _, b := range bs {
		s := append(h.samples[b.Key], failures(b))
		if len(s) > h.n {
			s = append(s[:0], s[len(s)-h.n:]...)
		}
		seen[b.Key] = s
	}
	h.samples = seen
	h.noteFlushErrors(now, flushErrors)
}

// noteFlushErrors remembers when the flush errors last rose; h.mu must be
// held.
func (h *history) noteFlushErrors(now time.Time, n uint64) {
	if n > h.flushErrors {
		h.flushRose = now
	}
	h.flushErrors = n
}

// recent returns a copy of k's samples, oldest first, keeping room for one
// more (the current value) within n.
func (h *history) recent(k policy.BreakerKey) []uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.samples[k]
	if len(s) >= h.n {
		s = s[len(s)-h.n+1:]
	}
	return append(make([]uint64, 0, len(s)+1), s...)
}

// storeState is the store's verdict with flushErrors failed group commits
// since start: FLUSH_FAILING if they rose within FlushFailingFor, else OK.
func (h *history) storeState(now time.Time, flushErrors uint64) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.noteFlushErrors(now, flushErrors)
	if !h.flushRose.IsZero() && now.Sub(h.flushRose) < FlushFailingFor {
		return "FLUSH_FAILING"
	}
	return "OK"
}
