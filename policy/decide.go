package policy

import (
	"math/bits"
	"strings"
	"time"
)

// Check is a set of decision rules, one bit per rule.
type Check uint16

// Rules of a decision, in the order they apply. Decide applies the first
// five; the server applies the breaker and budget checks with shared state.
const (
	CheckClassification Check = 1 << iota
	CheckIdempotency
	CheckAttempts
	CheckPushback
	CheckDeadline
	CheckBreaker
	CheckTenantBudget
	CheckRunBudget
)

var checkNames = [...]string{
	"classification", "idempotency", "attempts", "pushback",
	"deadline", "breaker", "tenant_budget", "run_budget",
}

// Names returns the names of the checks in c, in the order they apply, e.g.
// ["classification", "idempotency"]. Unknown bits are left out.
func (c Check) Names() []string {
	out := make([]string, 0, bits.OnesCount(uint(c)))
	for i, n := range checkNames {
		if c&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

// String returns the names of the checks in c joined with ",".
func (c Check) String() string { return strings.Join(c.Names(), ",") }

// Input is everything Decide needs about one failed attempt.
type Input struct {
	// Attempt is the number of the attempt that just failed, from 1.
	Attempt int
	// Failure is how it failed.
	Failure Failure
	// Idempotent is true when repeating the operation cannot duplicate an
	// effect; HasIdempotencyKey when the upstream deduplicates on a key.
	Idempotent, HasIdempotencyKey bool
	// Hints are the server's raw pushback headers.
	Hints Hints
	// PrevDelay is the previous delay, for decorrelated jitter; 0 before the
	// first retry.
	PrevDelay time.Duration
	// Now is the current time. Origin is when the call first started at the
	// caller (zero means Now). Deadline is when the call must be finished;
	// zero means Origin + p.CallDeadline when CallDeadline > 0, else none.
	Now, Origin, Deadline time.Time
	// JitterDraw and SpreadDraw are random draws in [0, 1), for the backoff
	// jitter and the spread of a server hint.
	JitterDraw, SpreadDraw float64
}

// Decision is the answer to one failed attempt.
type Decision struct {
	// Retry is true when the call should wait Delay and try again.
	Retry bool
	// Delay is the wait before the next attempt when Retry, else 0.
	Delay time.Duration
	// Stop is the rule that ended the call, StopNone when Retry.
	Stop StopReason
	// Disposition is the call's final disposition, DispositionNone when Retry.
	Disposition Disposition
	// Class is the failure's classification.
	Class Classification
	// Hint is the parsed server pushback; zero when the pushback check was not
	// reached or no header was given.
	Hint Hint
	// AttemptTimeout is the timeout for the next attempt when Retry:
	// p.AttemptTimeout, or, when that is 0 and there is a deadline, the time
	// left before the deadline after the wait.
	AttemptTimeout time.Duration
	// Deadline is the effective deadline, zero if none.
	Deadline time.Time
	// Checks is the set of rules applied, including the one that stopped the
	// call.
	Checks Check
}

func (d *Decision) stop(r StopReason, disp Disposition) Decision {
	d.Stop, d.Disposition = r, disp
	return *d
}

// Decide applies the stateless rules of policy p to a failed attempt, in this
// order, and stops at the first that fires:
//
//  1. classification: a terminal or unclassified failure stops with
//     StopTerminal and DispositionFailedTerminal;
//  2. idempotency: a transient failure unsafe to repeat stops with
//     StopNotIdempotent and DispositionDeadLetter;
//  3. attempts: in.Attempt >= p.MaxAttempts stops with StopAttemptsExhausted
//     and DispositionDeadLetter;
//  4. pushback: a negative grpc-retry-pushback-ms stops with
//     StopServerPushback and DispositionDeadLetter. Otherwise the delay is
//     the jittered backoff delay and, with a server hint, in RetryAfterMax
//     mode the larger of it and the spread hint (SpreadHint), in
//     RetryAfterOverride mode the spread hint alone;
//  5. deadline, checked before the wait: when the next attempt, started after
//     the delay with p.AttemptTimeout reserved, would end after the effective
//     deadline, the call stops with StopDeadline and DispositionDeadLetter
//     (the server makes it DispositionDeadlineCut when the deadline that
//     bound was its run's cut-off).
//     So does a hint longer than p.Pushback.MaxHint whose uncapped wait would
//     pass the deadline: the server would refuse an earlier attempt anyway.
//
// Decide never allocates when in.Hints is empty. A nil p means Default().
func Decide(p *Policy, in Input) Decision {
	if p == nil {
		p = &defaultPolicy
	}
	d := Decision{
		Deadline: EffectiveDeadline(p, in.Now, in.Origin, in.Deadline),
		Checks:   CheckClassification,
		Class:    Classify(p, in.Failure, in.Idempotent, in.HasIdempotencyKey),
	}
	if d.Class.Category != CategoryTransient {
		return d.stop(StopTerminal, DispositionFailedTerminal)
	}
	d.Checks |= CheckIdempotency
	if !d.Class.Retryable {
		return d.stop(StopNotIdempotent, DispositionDeadLetter)
	}
	d.Checks |= CheckAttempts
	if in.Attempt >= p.MaxAttempts {
		return d.stop(StopAttemptsExhausted, DispositionDeadLetter)
	}
	d.Checks |= CheckPushback
	if in.Hints != (Hints{}) {
		d.Hint = ParseHints(in.Hints, in.Now, p.Pushback.MaxHint)
	}
	if d.Hint.DoNotRetry {
		return d.stop(StopServerPushback, DispositionDeadLetter)
	}
	delay := Jittered(p.Backoff, max(in.Attempt-1, 0), in.PrevDelay, in.JitterDraw)
	need := delay // the wait the deadline must allow
	if d.Hint.Present {
		spread := SpreadHint(p.Pushback, d.Hint.Delay, in.SpreadDraw)
		if p.Pushback.Mode == RetryAfterOverride {
			delay = spread
		} else {
			delay = max(delay, spread)
		}
		need = max(delay, d.Hint.Delay)
	}
	d.Checks |= CheckDeadline
	if !FitsDeadline(in.Now, d.Deadline, need, p.AttemptTimeout) {
		return d.stop(StopDeadline, DispositionDeadLetter)
	}
	d.Retry, d.Delay = true, delay
	d.AttemptTimeout = max(p.AttemptTimeout, 0)
	if !d.Deadline.IsZero() && d.AttemptTimeout == 0 {
		// FitsDeadline held, so the time left after the wait is >= 0.
		d.AttemptTimeout = d.Deadline.Sub(in.Now) - delay
	}
	return d
}

// FitsDeadline reports whether an attempt started after waiting delay from
// now, with attemptTimeout reserved for it, ends by deadline. A zero deadline
// always fits; negative durations count as 0. The arithmetic saturates, so
// extreme values never overflow. It is the deadline rule of Decide, for
// callers that lengthen a delay afterwards (a fleet-wide cool-down).
func FitsDeadline(now, deadline time.Time, delay, attemptTimeout time.Duration) bool {
	if deadline.IsZero() {
		return true
	}
	need := addSat(max(delay, 0), max(attemptTimeout, 0))
	return need <= deadline.Sub(now)
}

// EffectiveDeadline returns the deadline of a call: deadline when it is not
// zero; otherwise origin (or now, when origin is zero) plus p.CallDeadline
// when that is > 0; otherwise the zero time, meaning none. A nil p means
// Default().
func EffectiveDeadline(p *Policy, now, origin, deadline time.Time) time.Time {
	if !deadline.IsZero() {
		return deadline
	}
	if p == nil {
		p = &defaultPolicy
	}
	if p.CallDeadline <= 0 {
		return time.Time{}
	}
	if origin.IsZero() {
		origin = now
	}
	return origin.Add(p.CallDeadline)
}
