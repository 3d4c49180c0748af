package fleet

import (
	"slices"
	"time"

	"github.com/policyd/policyd/policy"
)

// Reasons of policy.Admission, machine-readable.
const (
	ReasonClosed      = "breaker:closed"       // admitted: CLOSED (or forced CLOSED)
	ReasonOpen        = "breaker:open"         // refused until the cooldown ends
	ReasonProbe       = "breaker:probe"        // admitted as a HALF_OPEN probe; report with the permit id
	ReasonProbesTaken = "breaker:probes_taken" // refused: every probe permit is out
	ReasonDisabled    = "breaker:disabled"     // admitted: the breaker is DISABLED
	ReasonForcedOpen  = "breaker:forced_open"  // refused: forced OPEN until reset
	ReasonPushback    = "cooldown:pushback"    // refused: a fleet-wide Retry-After cool-down is in force
)

// WindowSlots is the number of time buckets of the FAILURE_RATE window.
const WindowSlots = 10

// Slot is one time bucket of the FAILURE_RATE window.
type Slot struct {
	Epoch           int64 // now / slot width
	Calls, Failures uint32
}

// PermitID identifies a HALF_OPEN probe permit.
type PermitID [16]byte

// Permit is a HALF_OPEN probe permit handed out by Admit, live until
// Expiry (Unix ns).
type Permit struct {
	ID     PermitID
	Expiry int64
}

// Breaker is one fleet-wide circuit breaker. The zero value is a CLOSED
// breaker with no history; NewBreaker stamps its creation time. Times are
// Unix ns. Generation counts the breaker's state transitions; the permits
// of a HALF_OPEN generation die with it.
type Breaker struct {
	State       policy.BreakerState
	Forced      bool
	Mode        policy.BreakerMode
	OpenUntil   int64 // OPEN (unforced) until then; 0 otherwise
	Changed     int64 // last state change
	Generation  uint64
	Cooldown    Cooldown
	LastFailure int64 // not persisted by breakerstore: a chain of failures survives a restart whole
	Consecutive int
	HalfOpenOK  int
	SlotWidth   int64
	Slots       [WindowSlots]Slot
	Permits     []Permit
}

// NewBreaker returns a CLOSED breaker created at now.
func NewBreaker(now int64) Breaker {
	return Breaker{State: policy.BreakerClosed, Changed: now}
}

// NormConfig fills zero or invalid fields of c with policy.Default's.
func NormConfig(c policy.BreakerConfig) policy.BreakerConfig {
	d := &defaultBreaker
	if c.Mode != policy.BreakerConsecutive && c.Mode != policy.BreakerFailureRate {
		c.Mode = d.Mode
	}
	if c.ConsecutiveFailures <= 0 {
		c.ConsecutiveFailures = d.ConsecutiveFailures
	}
	if !(c.FailureRate > 0 && c.FailureRate <= 1) {
		c.FailureRate = d.FailureRate
	}
	if c.Window <= 0 {
		c.Window = d.Window
	}
	if c.MinCalls <= 0 {
		c.MinCalls = d.MinCalls
	}
	if c.Cooldown <= 0 {
		c.Cooldown = d.Cooldown
	}
	if c.HalfOpenProbes <= 0 {
		c.HalfOpenProbes = d.HalfOpenProbes
	}
	if c.ProbeTimeout <= 0 {
		c.ProbeTimeout = d.ProbeTimeout
	}
	return c
}

var defaultBreaker = policy.Default().Breaker

// Advance performs the lazy OPEN to HALF_OPEN transition once the cooldown
// is over. Engines call it before Admit, Record and ExtendCooldown, and
// publish the HALF_OPEN state when it reports Transitioned.
func (b *Breaker) Advance(now int64) Effect {
	if b.State == policy.BreakerOpen && !b.Forced && now >= b.OpenUntil {
		b.toState(now, policy.BreakerHalfOpen)
		return Transitioned | Mutated
	}
	return 0
}

// Admit decides whether an attempt may go through at now (after Advance).
// In HALF_OPEN it hands out at most cfg.HalfOpenProbes live permits, each
// with the id newID returns and expiring after cfg.ProbeTimeout; newID is
// called only when a permit is handed out. A refusal is an Admission with
// Admitted false and RetryAfter set where waiting helps.
func (b *Breaker) Admit(now int64, cfg *policy.BreakerConfig, newID func() PermitID) (policy.Admission, Effect) {
	switch {
	case b.State == policy.BreakerDisabled:
		return policy.Admission{Admitted: true, State: policy.BreakerDisabled, Reason: ReasonDisabled}, 0
	case b.Forced && b.State == policy.BreakerOpen:
		return policy.Admission{State: policy.BreakerOpen, Reason: ReasonForcedOpen}, 0
	case b.Forced:
		return policy.Admission{Admitted: true, State: b.State, Reason: ReasonClosed}, 0
	}
	if on, left := b.Cooldown.Active(now); on {
		return policy.Admission{State: b.State, Reason: ReasonPushback, RetryAfter: time.Duration(left)}, 0
	}
	switch b.State {
	case policy.BreakerOpen:
		return policy.Admission{State: policy.BreakerOpen, Reason: ReasonOpen, RetryAfter: time.Duration(b.OpenUntil - now)}, 0
	case policy.BreakerHalfOpen:
		var e Effect
		if b.expirePermits(now) {
			e = Mutated
		}
		if len(b.Permits) < cfg.HalfOpenProbes {
			p := Permit{ID: newID(), Expiry: now + int64(cfg.ProbeTimeout)}
			b.Permits = append(b.Permits, p)
			return policy.Admission{Admitted: true, State: policy.BreakerHalfOpen, Reason: ReasonProbe,
				PermitID: p.ID.String()}, Mutated
		}
		earliest := b.Permits[0].Expiry
		for _, p := range b.Permits[1:] {
			earliest = min(earliest, p.Expiry)
		}
		return policy.Admission{State: policy.BreakerHalfOpen, Reason: ReasonProbesTaken, RetryAfter: time.Duration(earliest - now)}, e
	}
	return policy.Admission{Admitted: true, State: policy.BreakerClosed, Reason: ReasonClosed}, 0
}

// Record applies one attempt's result at now (after Advance). Only
// policy.ResultTransientFailure counts as a failure. Past cfg's threshold
// it trips the breaker OPEN for cfg.Cooldown. policy.ResultPushback counts
// nothing: it only releases the permit it carries (see BreakerResult).
//
// In HALF_OPEN only a probe settles the breaker: a result carrying a live
// permit of this generation releases it and counts (a failure reopens the
// breaker, cfg.HalfOpenProbes successes close it); a result without a
// permit changes nothing; a permit that is not live (expired, of another
// breaker or generation, invented) is refused with ErrPermit and changes
// nothing. In the other states permit is released when it is one of the
// breaker's and otherwise ignored: a late probe reporting after its
// generation ended is not an error.
func (b *Breaker) Record(now int64, cfg *policy.BreakerConfig, r policy.Result, permit string) (Effect, error) {
	var e Effect
	i := -1
	if permit != "" {
		if id, ok := ParsePermitID(permit); ok {
			i = b.permitIndex(id)
		}
		if i >= 0 && b.Permits[i].Expiry <= now {
			i = -1
		}
	}
	if b.State == policy.BreakerHalfOpen && !b.Forced {
		switch {
		case permit == "":
			return 0, nil
		case i < 0:
			return 0, ErrPermit
		}
	}
	if i >= 0 {
		b.Permits = slices.Delete(b.Permits, i, i+1)
		e = Mutated
	}
	if r == policy.ResultPushback {
		// The upstream is up and asked for time: the cool-down handles it.
		// A probe answered so frees its permit and settles nothing.
		return e, nil
	}
	failure := r == policy.ResultTransientFailure
	switch {
	case b.State == policy.BreakerDisabled, b.State == policy.BreakerOpen:
		return e, nil // forced or not, an OPEN breaker ignores late results
	case b.Forced: // forced CLOSED: counts, never trips
		b.count(now, cfg, failure)
		return Mutated, nil
	case b.State == policy.BreakerHalfOpen:
		if failure {
			b.trip(now, cfg)
			return Transitioned | Mutated, nil
		}
		b.HalfOpenOK++
		if b.HalfOpenOK >= cfg.HalfOpenProbes {
			b.toState(now, policy.BreakerClosed)
			return Transitioned | Mutated, nil
		}
		return Mutated, nil
	}
	b.count(now, cfg, failure)
	if failure && b.shouldTrip(now, cfg) {
		b.trip(now, cfg)
		return Transitioned | Mutated, nil
	}
	return Mutated, nil
}

// permitIndex returns the index of the permit with id, or -1.
func (b *Breaker) permitIndex(id PermitID) int {
	for i := range b.Permits {
		if b.Permits[i].ID == id {
			return i
		}
	}
	return -1
}

// ExtendCooldown moves the breaker's pushback cool-down to until when that
// is later (see Cooldown.Extend) and returns the end in force.
func (b *Breaker) ExtendCooldown(now, until int64) (int64, Effect) {
	return b.Cooldown.Extend(now, until)
}

// Reset puts the breaker back to CLOSED, unforced, with its counters,
// permits and cool-down cleared.
func (b *Breaker) Reset(now int64) Effect {
	b.Forced = false
	b.Cooldown = Cooldown{}
	b.toState(now, policy.BreakerClosed)
	return Transitioned | Mutated
}

// Force pins the breaker to st (OPEN, CLOSED or DISABLED; the caller
// checks) until Reset. Forced OPEN refuses every call, forced CLOSED admits
// every call and never trips but keeps counting, DISABLED admits and counts
// nothing.
func (b *Breaker) Force(now int64, st policy.BreakerState) Effect {
	b.Forced = true
	b.Cooldown = Cooldown{}
	b.OpenUntil = 0 // forced OPEN lasts until reset
	cons, slots := b.Consecutive, b.Slots
	b.toState(now, st)
	if st == policy.BreakerClosed {
		b.Consecutive, b.Slots = cons, slots // forcing CLOSED keeps the counts
	}
	return Transitioned | Mutated
}

// count adds one call to the consecutive count and the sliding window.
// Failures further apart than the window are not "in a row": a quiet
// upstream that fails once an hour never trips the breaker.
func (b *Breaker) count(now int64, cfg *policy.BreakerConfig, failure bool) {
	if failure {
		if b.LastFailure != 0 && now-b.LastFailure > int64(cfg.Window) {
			b.Consecutive = 0
		}
		b.Consecutive++
		b.LastFailure = now
	} else {
		b.Consecutive = 0
	}
	width := max(int64(cfg.Window)/WindowSlots, 1)
	if width != b.SlotWidth {
		b.SlotWidth = width
		b.Slots = [WindowSlots]Slot{}
	}
	epoch := now / width
	sl := &b.Slots[epoch%WindowSlots]
	if sl.Epoch != epoch {
		*sl = Slot{Epoch: epoch}
	}
	sl.Calls++
	if failure {
		sl.Failures++
	}
}

// Window sums the slots inside the sliding window ending at now.
func (b *Breaker) Window(now int64) (calls, failures uint64) {
	if b.SlotWidth == 0 {
		return 0, 0
	}
	cur := now / b.SlotWidth
	for _, sl := range b.Slots {
		if sl.Epoch > cur-WindowSlots && sl.Epoch <= cur {
			calls += uint64(sl.Calls)
			failures += uint64(sl.Failures)
		}
	}
	return calls, failures
}

// shouldTrip applies the mode's rule after a failure.
func (b *Breaker) shouldTrip(now int64, cfg *policy.BreakerConfig) bool {
	if cfg.Mode == policy.BreakerFailureRate {
		calls, failures := b.Window(now)
		return calls >= uint64(cfg.MinCalls) && float64(failures) >= cfg.FailureRate*float64(calls)
	}
	return b.Consecutive >= cfg.ConsecutiveFailures
}

// trip opens the breaker for cfg.Cooldown.
func (b *Breaker) trip(now int64, cfg *policy.BreakerConfig) {
	b.OpenUntil = now + int64(cfg.Cooldown)
	b.toState(now, policy.BreakerOpen)
}

// toState changes state, starting a new generation, and clears what the new
// state starts afresh.
func (b *Breaker) toState(now int64, st policy.BreakerState) {
	b.State = st
	b.Changed = now
	b.Generation++
	b.Permits = b.Permits[:0]
	b.HalfOpenOK = 0
	b.Consecutive = 0
	b.Slots = [WindowSlots]Slot{}
	if st != policy.BreakerOpen {
		b.OpenUntil = 0
	}
}

// expirePermits frees the slots of permits past their expiry.
func (b *Breaker) expirePermits(now int64) bool {
	n := len(b.Permits)
	b.Permits = slices.DeleteFunc(b.Permits, func(p Permit) bool { return p.Expiry <= now })
	return len(b.Permits) != n
}

// LivePermits returns the number of permits live at now.
func (b *Breaker) LivePermits(now int64) int {
	n := 0
	for _, p := range b.Permits {
		if p.Expiry > now {
			n++
		}
	}
	return n
}

// Snapshot is b, the breaker under key, as the API shows it at now.
func (b *Breaker) Snapshot(key policy.BreakerKey, now int64) policy.BreakerSnapshot {
	calls, failures := b.Window(now)
	return policy.BreakerSnapshot{
		Key:                 key,
		State:               b.State,
		Forced:              b.Forced,
		OpenUntil:           UnixTime(b.OpenUntil),
		ConsecutiveFailures: b.Consecutive,
		WindowCalls:         calls,
		WindowFailures:      failures,
		ProbesInFlight:      b.LivePermits(now),
		Changed:             UnixTime(b.Changed),
		CooldownUntil:       UnixTime(b.Cooldown.Until),
		Mode:                b.Mode,
		Generation:          b.Generation,
	}
}

// Idle reports whether the breaker holds nothing worth keeping at now
// after ttl without activity since lastActive: CLOSED, unforced, no
// permits, no cool-down in force.
func (b *Breaker) Idle(now, lastActive int64, ttl time.Duration) bool {
	return b.State == policy.BreakerClosed && !b.Forced && len(b.Permits) == 0 &&
		b.Cooldown.Until <= now && now-lastActive >= int64(ttl)
}
