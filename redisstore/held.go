package redisstore

import (
	"context"
	"slices"
	"sync"

	"golang.org/x/sync/semaphore"

	"github.com/policyd/policyd/policy"
)

// maxHeldResults bounds the breaker results one tenant's held batch
// gathers between flushes: past it the flusher is woken at once, so one
// call of policyd_outcomes stays a few thousand arguments long.
const maxHeldResults = 4096

// heldOutcomes are the outcome batches a replica holds for its next flush
// (Options.BatchOutcomes): per tenant, the merged updates of every
// ApplyOutcomes call since the last one that needed no answer from the
// engine. Its methods are safe for concurrent use.
type heldOutcomes struct {
	mu      sync.Mutex
	batches map[string]*outcomeBatch
	wake    chan struct{} // the flusher's: a batch grew past maxHeldResults
	// sending orders the sends, a read-write lock: a flush takes and
	// sends the held batches holding all of it (lock), a call that sends
	// a batch now holds a share (rlock) from taking its tenants' held
	// batches to the replies, so a tenant's updates reach the engine in
	// the order they were reported. A call whose batches are all held
	// takes neither. It is a semaphore.Weighted, not a sync.RWMutex, for
	// its Acquire with a context: a decision waits for a flush in flight
	// only until its deadline.
	sending *semaphore.Weighted
	// waitHook, when set (tests), is called with a request's call context
	// as it is about to wait for a share of sending (rlock).
	waitHook func(context.Context)
}

// allSenders is sending's weight: a flush takes all of it, each call
// sending now one, and no replica has that many requests at once.
const allSenders = 1 << 30

func newHeldOutcomes() heldOutcomes {
	return heldOutcomes{batches: map[string]*outcomeBatch{}, wake: make(chan struct{}, 1), sending: semaphore.NewWeighted(allSenders)}
}

// rlock takes a share of sending for a request whose call to the engine
// is bounded by ctx, and reports whether it holds it (then runlock gives
// it back): the deadline runs while it waits, so that a request waiting
// for a flush in flight, whose round trip waits for an engine that does
// not answer, waits for the engine once in all, not for the flush's
// timeout (nor for the calls the flush itself waits for) and then its
// own. false when ctx ended first: the caller decides without the engine.
func (h *heldOutcomes) rlock(ctx context.Context) bool {
	if h.waitHook != nil {
		h.waitHook(ctx)
	}
	if h.sending.Acquire(ctx, 1) != nil {
		return false
	}
	if ctx.Err() != nil { // Acquire may succeed with ctx done
		h.sending.Release(1)
		return false
	}
	return true
}

// rlockOr takes a share of sending for a request that sends a batch now,
// whose engine calls are bounded by ctx, and reports whether it holds it
// (then runlock gives it back). When ctx ends first it gives up waiting
// but not its place in line: it calls later at once, in the request's
// goroutine, for what to do in its turn, and runs that in a goroutine of
// its own once the share is its turn (after the flush in flight, before
// every sender that asked after it), then gives the share back. The
// request's batches so reach the engine after the held batches the flush
// sends, in the order reported, and its answer does not wait for a flush
// the engine does not answer.
func (h *heldOutcomes) rlockOr(ctx context.Context, later func() func()) bool {
	if h.waitHook != nil {
		h.waitHook(ctx)
	}
	if h.sending.TryAcquire(1) {
		return true
	}
	got, turn := make(chan struct{}), make(chan func(), 1)
	go func() {
		_ = h.sending.Acquire(context.Background(), 1)
		select {
		case got <- struct{}{}: // the request, still waiting, holds it
		case f := <-turn:
			defer h.sending.Release(1)
			f()
		}
	}()
	select {
	case <-got:
		return true
	case <-ctx.Done():
		turn <- later()
		return false
	}
}

// runlock gives back the share rlock or rlockOr took.
func (h *heldOutcomes) runlock() { h.sending.Release(1) }

// lock takes all of sending, for a flush; unlock gives it back.
func (h *heldOutcomes) lock()   { _ = h.sending.Acquire(context.Background(), allSenders) }
func (h *heldOutcomes) unlock() { h.sending.Release(allSenders) }

// holdable reports whether b needs nothing from the engine before its
// ApplyOutcomes call answers: no final disposition (the ledger may refuse
// it), no result with a probe permit (the engine may refuse it), no tally
// on either, and only breakers this replica has seen (a new one may be
// past the tenant's cap, an error the caller sees). Notes of a run's call
// table may be held: a note sent at once (NoteCall, a Commit's) goes
// after its tenant's held batch, in the same pipeline, so no note
// overtakes one made before it on this replica (the table keeps the
// target noted last).
func (s *Store) holdable(b *outcomeBatch) bool {
	if len(b.finals) > 0 || len(b.runs) > 0 {
		return false
	}
	for _, g := range b.groups {
		for _, r := range g.runs {
			if r.permit != "" {
				return false
			}
		}
		if _, ok := s.cachedState(g.key); !ok {
			return false
		}
	}
	for _, tl := range b.tallies {
		if tl.cond != 0 || tl.final != 0 {
			return false
		}
	}
	return true
}

// holdsAll reports whether hold would keep every batch of batches and
// send nothing now (no notes to send either).
func (s *Store) holdsAll(batches map[string]*outcomeBatch, notes []pendingNote) bool {
	if len(notes) > 0 || s.closed.Load() || !s.health.up() {
		return false
	}
	for _, b := range batches {
		if !s.holdable(b) {
			return false
		}
	}
	return true
}

// hold keeps the holdable batches of batches for the next flush, merged
// into their tenant's held batch, and returns the ones to send now. For
// every tenant of those, and of notes (the call-table notes to send
// now), it also returns the tenant's held batch in prior, taken out of
// the hold: sent first, it keeps the tenant's updates in the order they
// were reported. After Close, and while the engine is down (a queued
// batch drives this replica's breaker copies at once), nothing is held.
func (s *Store) hold(batches map[string]*outcomeBatch, notes []pendingNote) (send, prior map[string]*outcomeBatch) {
	h := &s.held
	h.mu.Lock()
	defer h.mu.Unlock()
	send, prior = map[string]*outcomeBatch{}, map[string]*outcomeBatch{}
	wake := false
	for t, b := range batches {
		hb := h.batches[t]
		if !s.opts.BatchOutcomes || s.closed.Load() || !s.health.up() || !s.holdable(b) {
			send[t] = b
			if hb != nil {
				prior[t] = hb
				delete(h.batches, t)
			}
			continue
		}
		b.detach()
		switch {
		case hb == nil:
			h.batches[t] = b
		case hb.hour != b.hour:
			// Tallies count in the hour their batch was made in.
			prior[t] = hb
			h.batches[t] = b
		default:
			hb.merge(b)
			b = hb
		}
		if b.results >= maxHeldResults {
			wake = true
		}
	}
	for _, n := range notes {
		if hb := h.batches[n.tenant]; hb != nil {
			prior[n.tenant] = hb
			delete(h.batches, n.tenant)
		}
	}
	if wake {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	return send, prior
}

// takeHeld returns every held batch and empties the hold.
func (h *heldOutcomes) takeHeld() map[string]*outcomeBatch {
	h.mu.Lock()
	defer h.mu.Unlock()
	all := h.batches
	h.batches = map[string]*outcomeBatch{}
	return all
}

// flushHeld sends every held batch, one call of policyd_outcomes per
// tenant in one pipeline; a batch the engine does not answer for is
// queued for replay (runOutcomes), one it refuses is logged and counted
// as dropped (its caller was answered at ApplyOutcomes).
func (s *Store) flushHeld() {
	s.held.lock()
	defer s.held.unlock()
	all := s.held.takeHeld()
	if len(all) == 0 {
		return
	}
	if _, err := s.runOutcomes(nil, all, nil, false); err != nil {
		s.log.Warn("redisstore: held outcome batch refused: dropped", "err", err)
		s.queue.dropped.Add(1)
	}
}

// detach makes b a batch no ApplyOutcomes call waits on: its results
// refer to no update (-1), so its reply sets no Refused.
func (b *outcomeBatch) detach() {
	for _, g := range b.groups {
		for j := range g.runs {
			g.runs[j].update = -1
		}
	}
}

// merge appends o, a detached batch of the same tenant and hour made
// later than b, to b: results per breaker in order, as runs (appendRun:
// a held breaker's successes are a run or a few, however many were
// reported; a breaker's latest configuration applies), deposits and
// tallies summed, notes in order.
func (b *outcomeBatch) merge(o *outcomeBatch) {
	for _, g := range o.groups {
		bg := b.byKey[g.key]
		if bg == nil {
			b.byKey[g.key] = g
			b.groups = append(b.groups, g)
			continue
		}
		bg.cfg = g.cfg
		for _, r := range g.runs {
			bg.runs = appendRun(bg.runs, r)
		}
	}
	b.deposit += o.deposit
	b.results += o.results
	sums := b.sums()
	for _, tl := range o.tallies {
		if i, ok := sums[tl.key]; ok {
			b.tallies[i].n += tl.n
			continue
		}
		sums[tl.key] = len(b.tallies)
		b.tallies = append(b.tallies, tl)
	}
	b.notes = append(b.notes, o.notes...)
}

// takeResults takes the results of the breaker under key out of its
// tenant's held batch, in the order they were reported, for a call that
// records a result of that breaker now (Store.Record): sent in front of
// it in the same call, they reach the engine in the order they were made,
// as if they had not been held. The caller holds s.held.sending's read
// lock from the take to the reply, so no flush sends results of key held
// after the take before them.
func (s *Store) takeResults(key policy.BreakerKey) []result {
	h := &s.held
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.batches[key.Tenant]
	if b == nil {
		return nil
	}
	g := b.byKey[key]
	if g == nil {
		return nil
	}
	delete(b.byKey, key)
	b.results -= g.results()
	b.groups = slices.DeleteFunc(b.groups, func(o *outcomeGroup) bool { return o == g })
	if len(b.groups) == 0 && b.deposit == 0 && len(b.tallies) == 0 && len(b.notes) == 0 {
		delete(h.batches, key.Tenant)
	}
	results := make([]result, 0, g.results())
	for _, r := range g.runs {
		for range r.n {
			results = append(results, result{r.result, r.permit})
		}
	}
	return results
}
