package policyclient

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// Disposition is how a call ended, for routing: done, fix the input, park
// on a dead-letter queue, or give up for this run.
type Disposition int

// Dispositions.
const (
	Succeeded      Disposition = iota + 1
	FailedTerminal             // the upstream refused for good: fix the input
	DeadLetter                 // retries ran out, or the call's own deadline (StopDeadline) passed: may succeed later
	DeadlineCut                // the run's cut-off ended it
	CircuitOpen                // the upstream's breaker refused it
)

var dispositionNames = map[Disposition]string{
	Succeeded: "succeeded", FailedTerminal: "failed_terminal", DeadLetter: "dead_letter",
	DeadlineCut: "deadline_cut", CircuitOpen: "circuit_open",
}

// String returns the disposition's name: succeeded, failed_terminal,
// dead_letter, deadline_cut or circuit_open.
func (d Disposition) String() string { return dispositionNames[d] }

func dispositionFromPB(d pb.Disposition) Disposition {
	switch d {
	case pb.Disposition_DISPOSITION_SUCCEEDED:
		return Succeeded
	case pb.Disposition_DISPOSITION_FAILED_TERMINAL:
		return FailedTerminal
	case pb.Disposition_DISPOSITION_DEADLINE_CUT:
		return DeadlineCut
	case pb.Disposition_DISPOSITION_CIRCUIT_OPEN:
		return CircuitOpen
	}
	return DeadLetter
}

func (d Disposition) pb() pb.Disposition {
	switch d {
	case Succeeded:
		return pb.Disposition_DISPOSITION_SUCCEEDED
	case FailedTerminal:
		return pb.Disposition_DISPOSITION_FAILED_TERMINAL
	case DeadlineCut:
		return pb.Disposition_DISPOSITION_DEADLINE_CUT
	case CircuitOpen:
		return pb.Disposition_DISPOSITION_CIRCUIT_OPEN
	}
	return pb.Disposition_DISPOSITION_DEAD_LETTER
}

// StopReason is the rule that ended a failed call.
type StopReason int

// Stop reasons, numbered as the API numbers them.
const (
	StopNone              StopReason = iota // the call succeeded
	StopTerminal                            // the failure cannot succeed when repeated
	StopNotIdempotent                       // a retry could duplicate the write
	StopAttemptsExhausted                   // max attempts reached
	StopDeadline                            // the next attempt cannot finish before the deadline
	StopBudgetExhausted                     // the tenant's or the run's retry budget is spent
	StopCircuitOpen                         // the upstream's breaker refused it
	StopServerPushback                      // the server said not to retry
)

var stopReasonNames = [...]string{
	StopTerminal: "TERMINAL", StopNotIdempotent: "NOT_IDEMPOTENT", StopAttemptsExhausted: "ATTEMPTS_EXHAUSTED",
	StopDeadline: "DEADLINE", StopBudgetExhausted: "BUDGET_EXHAUSTED", StopCircuitOpen: "CIRCUIT_OPEN",
	StopServerPushback: "SERVER_PUSHBACK",
}

// String returns the stop reason's name as the API spells it without its
// prefix (TERMINAL, ATTEMPTS_EXHAUSTED, ...), or "" for StopNone.
func (r StopReason) String() string {
	if r >= 0 && int(r) < len(stopReasonNames) {
		return stopReasonNames[r]
	}
	return "StopReason(" + strconv.Itoa(int(r)) + ")"
}

func stopReasonFromPB(r pb.StopReason) StopReason {
	if r > 0 && int(r) < len(stopReasonNames) {
		return StopReason(r)
	}
	return StopNone
}

func (r StopReason) pb() pb.StopReason { return pb.StopReason(r) }

// Call describes one logical call: one unit of work and all its attempts.
type Call struct {
	// Target names the upstream; required.
	Target string
	// SubmissionID identifies the unit of work (a document id, say). With
	// Payload it derives the idempotency key, once, before the first
	// attempt; it is also the default call id.
	SubmissionID string
	Payload      []byte
	// IdempotencyKey, when set, is used instead of the derived key.
	IdempotencyKey string
	// Idempotent says repeating the operation cannot duplicate an effect.
	// A non-idempotent call is retried only with an idempotency key, which
	// a SubmissionID provides.
	Idempotent bool
	// RunID names the batch run whose retry pool the call spends.
	RunID string
	// Deadline bounds the whole call; ctx's deadline bounds it too.
	Deadline time.Time
	// Origin is when the work began (the event's original timestamp, say):
	// policyd anchors the call's deadline (the policy's call deadline) to
	// it. Zero means now, when Do starts.
	Origin time.Time
	// CallID names the call in the audit trail; default SubmissionID, or a
	// random id.
	CallID string
	// ClaimKey makes an idempotent call use the idempotency ledger too (a
	// non-idempotent call with a key always does): see SetResultRef and
	// Result.Deduplicated.
	ClaimKey bool
	// TriageRef is a reference for triage (the source document's URI, say),
	// up to MaxTriageRefLen bytes: a call of a run carries it into the
	// run's call table (policyd run calls), beside its disposition.
	TriageRef string
}

// MaxTriageRefLen is the longest Call.TriageRef, in bytes.
const MaxTriageRefLen = 1024

// Attempt tells fn which attempt it is making.
type Attempt struct {
	Number         int    // from 1
	CallID         string // the same on every attempt
	IdempotencyKey string // the same on every attempt; send it to the upstream
	// Target is the upstream this attempt goes to: the call's Target, or
	// a fallback target policyd escalated the call to. Transport maps it to
	// a host through Transport.Hosts.
	Target string
	result *string
}

// Result is how a call ended.
type Result struct {
	Disposition Disposition
	// StopReason is the rule that ended a failed call; StopNone on
	// success.
	StopReason StopReason
	// Reason is the classification of the last failure (transient:503).
	Reason   string
	Attempts int
	// Err is the last error fn returned, or the context's error.
	Err            error
	CallID         string
	IdempotencyKey string
	// Local is true when at least one decision was made without policyd.
	Local bool
	// Deduplicated is true when the idempotency ledger said an earlier
	// attempt (another worker's, say) succeeded: fn was not called, and
	// ResultRef is that attempt's result reference.
	Deduplicated bool
	// ResultRef is the result reference of the successful attempt
	// (Attempt.SetResultRef), this call's or the one it was deduplicated
	// against.
	ResultRef string
}

// OK reports whether the call succeeded.
func (r Result) OK() bool { return r.Disposition == Succeeded }

// decision is NextDelay's answer, from policyd or the local policy.
type decision struct {
	retry          bool
	delay          time.Duration
	stopReason     pb.StopReason
	disposition    pb.Disposition
	reason         string
	attemptTimeout time.Duration
	fallback       bool
	target         string // where the next attempt goes on a retry; "" for the same target
	breaker        pb.BreakerState
}

func (d decision) stop(r pb.StopReason, disp pb.Disposition) decision {
	d.retry, d.delay, d.stopReason, d.disposition = false, 0, r, disp
	return d
}

// Errors for misuse.
var (
	ErrNoTarget   = errors.New("policyclient: Call.Target is required")
	ErrNilFunc    = errors.New("policyclient: fn must not be nil")
	ErrBadPayload = errors.New("policyclient: Call.SubmissionID must not contain NUL")
	ErrTriageRef  = errors.New("policyclient: Call.TriageRef must be at most 1024 bytes")
)

// Do runs fn until it succeeds or policyd (or, when policyd cannot answer in
// time, the local copy of the default policy) says to stop: admit (skipped
// while the breaker is known CLOSED; refused at once while it is known
// OPEN), call fn with the per-attempt timeout, classify its error, ask
// NextDelay, wait (returning early if ctx ends), repeat. Outcomes are
// reported asynchronously. The error is non-nil only for misuse; how the
// call ended is in the Result.
//
// A target policyd said has a fleet-wide ceiling is never sent an attempt
// without its lease or rate slot: while policyd is silent the call waits
// (bounded by its deadline, with backoff) and asks Admit again, and ends
// DeadLetter (StopDeadline, Reason flow:unavailable) when no attempt could
// finish by the deadline any more; a call without a deadline waits while
// ctx lets it. Other targets keep the local fallback.
func (c *Client) Do(ctx context.Context, call Call, fn func(ctx context.Context, a Attempt) error) (Result, error) {
	if call.Target == "" {
		return Result{}, ErrNoTarget
	}
	if fn == nil {
		return Result{}, ErrNilFunc
	}
	if strings.IndexByte(call.SubmissionID, 0) >= 0 {
		return Result{}, ErrBadPayload
	}
	if len(call.TriageRef) > MaxTriageRefLen {
		return Result{}, ErrTriageRef
	}
	c.stats.calls.Add(1)
	key := call.IdempotencyKey
	if key == "" && call.SubmissionID != "" {
		key = IdempotencyKey(call.SubmissionID, call.Payload)
	}
	id := call.CallID
	if id == "" {
		id = call.SubmissionID
	}
	if id == "" {
		id = randomID()
	}
	origin := call.Origin
	if origin.IsZero() {
		origin = c.cfg.Now()
	}
	cs := &callState{info: callInfo{tenant: c.cfg.Tenant, target: call.Target, id: id, key: key, runID: call.RunID,
		idempotent: call.Idempotent, origin: origin, deadline: call.Deadline, triageRef: call.TriageRef}}
	ci := &cs.info
	if d, ok := ctx.Deadline(); ok && (ci.deadline.IsZero() || d.Before(ci.deadline)) {
		ci.deadline = d
	}
	l := loop{c: c, ctx: ctx, call: ci, first: &cs.first, timeout: c.cfg.AttemptTimeout, res: Result{CallID: id, IdempotencyKey: key},
		claimAlways: call.ClaimKey, target: call.Target}
	return l.run(fn), nil
}

// callState is a call's identity and its first attempt's context, made in
// one allocation: most calls make one attempt.
type callState struct {
	info  callInfo
	first attemptCtx
}

// callInfo is one call's identity and limits, shared by its attempts and
// by the outcomes the batcher turns into messages. It is not modified after
// Do builds it.
type callInfo struct {
	tenant, target, id, key, runID string
	triageRef                      string
	idempotent                     bool
	origin, deadline               time.Time
}

func (ci *callInfo) pb() *pb.CallRef {
	ref := &pb.CallRef{
		Tenant: ci.tenant, Target: ci.target, CallId: ci.id, Idempotent: ci.idempotent,
		IdempotencyKey: ci.key, RunId: ci.runID, OriginTime: timestamppb.New(ci.origin), TriageRef: ci.triageRef,
	}
	if !ci.deadline.IsZero() {
		ref.DeadlineTime = timestamppb.New(ci.deadline)
	}
	return ref
}

// outcomeRef is the call as an outcome with final disposition final names
// it: the tenant, target, call id and run id, and, for a call that ended
// otherwise than in success, its origin and deadline, which policyd checks a
// DEAD_LETTER (DEADLINE) against: the earlier of the call's deadline and
// cancelled, when the caller ended the call then. The times and the key
// cost most of a CallRef to encode and decode, so they stay out of every
// other outcome.
func (ci *callInfo) outcomeRef(final pb.Disposition, cancelled time.Time) *pb.CallRef {
	ref := &pb.CallRef{Tenant: ci.tenant, Target: ci.target, CallId: ci.id, RunId: ci.runID}
	if final != pb.Disposition_DISPOSITION_UNSPECIFIED && final != pb.Disposition_DISPOSITION_SUCCEEDED {
		ref.OriginTime, ref.TriageRef, ref.IdempotencyKey = timestamppb.New(ci.origin), ci.triageRef, ci.key
		deadline := ci.deadline
		if !cancelled.IsZero() && (deadline.IsZero() || cancelled.Before(deadline)) {
			deadline = cancelled
		}
		if !deadline.IsZero() {
			ref.DeadlineTime = timestamppb.New(deadline)
		}
	}
	return ref
}

// loop is the state of one Do.
type loop struct {
	c       *Client
	ctx     context.Context
	call    *callInfo
	first   *attemptCtx   // for the first attempt; nil once used
	ref     *pb.CallRef   // built for the first RPC, then reused
	cutoff  time.Time     // the run's cut-off, once known
	timeout time.Duration // for the next attempt
	prev    time.Duration // the last delay
	lease   string        // the concurrency lease the attempt holds; returned by the next report or NextDelay
	// target is where the next attempt goes: the call's target (the
	// primary), or a fallback policyd escalated the call to (Admit's or
	// NextDelay's answer).
	target string
	res    Result
	// claimAlways is Call.ClaimKey; resultRef what fn set (SetResultRef).
	claimAlways bool
	resultRef   string
	// mustClaim, once set, is why no attempt may be made without a claim
	// (see unclaimed): an attempt's outcome was lost, or another worker
	// held the key.
	mustClaim string
}

// pbRef returns the call as the API spells it.
func (l *loop) pbRef() *pb.CallRef {
	if l.ref == nil {
		l.ref = l.call.pb()
	}
	return l.ref
}

func (l *loop) run(fn func(context.Context, Attempt) error) Result {
	for attempt := 1; ; attempt++ {
		permit, ok := l.admit(attempt)
		if !ok {
			return l.res
		}
		lease := ""
		if l.usesLedger() {
			if lease, ok = l.claim(attempt); !ok {
				return l.res
			}
		}
		l.res.Attempts = attempt
		l.c.stats.attempts.Add(1)
		if l.c.cfg.OnEvent != nil {
			l.c.emit(Event{Kind: EventAttemptStarted, Target: l.target, CallID: l.call.id, Attempt: attempt})
		}
		start := l.c.cfg.Now()
		actx := l.first
		if actx == nil {
			actx = new(attemptCtx)
		}
		l.first = nil
		actx.start(l.ctx, l.c.wall(start), l.timeout)
		var ref *string // only a call holding a lease keeps a result reference
		if lease != "" {
			ref = new(string)
		}
		err := fn(actx, Attempt{Number: attempt, CallID: l.call.id, IdempotencyKey: l.call.key, Target: l.target, result: ref})
		if ref != nil {
			l.resultRef = *ref
		}
		stop := l.c.cfg.Now()
		timedOut := actx.end(l.c.wall(stop))
		latency := stop.Sub(start)
		recorded := false // the ledger knows how the attempt ended
		if lease != "" {
			var f failure
			if err != nil {
				f = classifyError(err, timedOut)
			}
			recorded = l.complete(lease, err, f)
		}
		if err == nil {
			l.res.ResultRef = l.resultRef
			l.res.Disposition, l.res.Err = Succeeded, nil
			l.report(outcome{attempt: attempt, success: true, permit: permit, latency: latency,
				final: pb.Disposition_DISPOSITION_SUCCEEDED})
			l.c.local.budget.deposit(0.2)
			if l.c.cfg.OnEvent != nil {
				l.c.emit(Event{Kind: EventCallEnded, Target: l.target, CallID: l.call.id, Attempt: attempt,
					Disposition: Succeeded, Reason: l.res.Reason})
			}
			return l.res
		}
		l.res.Err = err
		if l.ctx.Err() != nil {
			return l.end(DeadLetter, StopDeadline, attempt, nil)
		}
		f := classifyError(err, timedOut)
		if f.unclassified {
			// Nothing known about this error: terminal, never retried blindly.
			l.res.Reason = f.reason
			return l.end(FailedTerminal, StopTerminal, attempt, nil)
		}
		if l.usesLedger() && outcomeLost(f) {
			// The upstream may have applied it: another attempt needs a
			// claim, and one the ledger cannot answer for is not made.
			l.mustClaim = "idempotency:unknown"
			if !recorded {
				l.res.Reason = "idempotency:unknown"
				return l.end(DeadLetter, StopNotIdempotent, attempt, f.pb)
			}
		}
		dec := l.next(attempt, f, permit, timedOut)
		l.res.Reason = dec.reason
		var unrecorded *pb.Failure
		if dec.fallback {
			l.res.Local = true
			unrecorded = f.pb // policyd has not seen this failure: report it
		}
		if !dec.retry {
			return l.end(dispositionFromPB(dec.disposition), stopReasonFromPB(dec.stopReason), attempt, unrecorded)
		}
		if unrecorded != nil {
			l.report(outcome{attempt: attempt, failure: unrecorded, permit: permit, latency: latency})
		}
		if dec.attemptTimeout > 0 {
			l.timeout = dec.attemptTimeout
		}
		l.prev = dec.delay
		if l.c.cfg.OnEvent != nil {
			l.c.emit(Event{Kind: EventRetryScheduled, Target: l.target, CallID: l.call.id, Attempt: attempt,
				Delay: dec.delay, Local: dec.fallback, Reason: dec.reason})
		}
		if dec.target != "" {
			why := moveByChain
			switch {
			case dec.fallback:
				why = moveLocal
			case dec.breaker == pb.BreakerState_BREAKER_STATE_OPEN:
				why = moveByCircuit
			}
			l.moveTo(dec.target, attempt+1, why)
		}
		if err := l.c.cfg.Sleep(l.ctx, dec.delay); err != nil {
			l.res.Err = err
			return l.end(DeadLetter, StopDeadline, attempt, nil)
		}
	}
}

// end finishes the call with a disposition and reports it.
func (l *loop) end(d Disposition, stop StopReason, attempt int, unrecorded *pb.Failure) Result {
	l.res.Disposition, l.res.StopReason = d, stop
	if l.c.cfg.OnEvent != nil {
		l.c.emit(Event{Kind: EventCallEnded, Target: l.target, CallID: l.call.id, Attempt: attempt,
			Disposition: d, StopReason: stop, Reason: l.res.Reason})
	}
	o := outcome{attempt: max(attempt, 1), final: d.pb(), failure: unrecorded, alreadyRecorded: unrecorded == nil,
		stop: stop.pb()}
	if stop == StopDeadline && l.ctx.Err() != nil {
		// The caller ended the call (cancelled it, or its context's
		// deadline passed): policyd may know a later deadline (a policy's
		// call_deadline) and would refuse a DEAD_LETTER (DEADLINE) before it.
		o.cancelled = l.c.cfg.Now()
	}
	l.report(o)
	return l.res
}

// moveTo sends the call's attempts from attempt on to target, a target of
// its escalation chain, telling OnEvent when it is another than the one
// they went to.
// why says what moved it, for what the client learns of the chain
// (chainCache.learn).
func (l *loop) moveTo(target string, attempt int, why move) {
	if target == l.target {
		return
	}
	if l.c.cfg.OnEvent != nil {
		l.c.emit(Event{Kind: EventFallbackTaken, Target: target, From: l.target, CallID: l.call.id, Attempt: attempt})
	}
	if why == moveByChain {
		if b, known := l.c.breakers.lookup(l.target); known && b.state == pb.BreakerState_BREAKER_STATE_OPEN {
			why = moveByCircuit
		}
	}
	l.c.chains.learn(l.call.target, l.target, target, attempt, why, l.c.cfg.Now())
	l.target = target
}

// attemptTarget is the attempt_target of a request about the current
// attempt: "" for the primary.
func (l *loop) attemptTarget() string {
	if l.target == l.call.target {
		return ""
	}
	return l.target
}

// report queues o, which returns the lease the attempt held, if any: the
// batcher is then asked to send at once, so the lease's slot is free for
// another worker without waiting for a tick.
func (l *loop) report(o outcome) {
	o.call, o.target = l.call, l.attemptTarget()
	o.lease, l.lease = l.lease, ""
	l.c.out.add(o)
	if o.lease != "" {
		l.c.out.kick()
	}
}

// admit asks whether attempt may go ahead; it returns a probe permit when
// one was handed out, and keeps the concurrency lease, when the target has
// a ceiling, in l.lease. It waits out a fleet-wide cool-down, and a full
// ceiling, when the deadline allows: neither wait counts an attempt or
// spends budget. ok false means the call ended (l.res is set).
//
// While policyd is silent (Admit unanswered within the decision timeout,
// or unreachable), an attempt to a target without a known ceiling goes
// ahead on the local policy; one to a target policyd said has a ceiling
// (flowCache.ceilingKnown) does not: its Admit waits longer for an answer
// (ceilingAdmitTimeout), then the call waits (waitSilent) and asks Admit
// again, and when the deadline leaves no room for an attempt, the call
// ends a dead letter (DEADLINE, flow:unavailable), reported to policyd
// once it answers.
func (l *loop) admit(attempt int) (permit string, ok bool) {
	cut, runKnown := l.runCut()
	if cut {
		l.res.Reason = "run:cutoff"
		l.end(DeadlineCut, StopDeadline, attempt-1, nil)
		return "", false
	}
	unanswered := 0 // Admits in a row policyd left unanswered
	for {
		b, known := l.c.breakers.lookup(l.target)
		flow := l.c.flow.controlled(l.target)
		if runKnown && known && !flow && b.cooldownUntil.IsZero() &&
			(b.state == pb.BreakerState_BREAKER_STATE_CLOSED || b.state == pb.BreakerState_BREAKER_STATE_DISABLED) {
			return "", true // the common case, without reading the clock
		}
		now := l.c.cfg.Now()
		if known {
			switch {
			case b.cooldownUntil.After(now):
				// Another worker was told to back off: wait with it.
				if !l.waitFor(b.cooldownUntil.Sub(now), attempt, "cooldown:pushback") {
					return "", false
				}
				continue
			case runKnown && !flow && (b.state == pb.BreakerState_BREAKER_STATE_CLOSED || b.state == pb.BreakerState_BREAKER_STATE_DISABLED):
				return "", true
			case b.state == pb.BreakerState_BREAKER_STATE_OPEN && (b.forced || b.openUntil.After(now)) &&
				!l.c.chains.escalatesOnOpen(l.call.target, attempt, now, l.c.breakers.openAt(now)):
				l.c.stats.fastFails.Add(1)
				l.res.Reason = "breaker:open"
				l.end(CircuitOpen, StopCircuitOpen, attempt-1, nil)
				return "", false
			}
		}
		ceiling := l.c.flow.ceilingKnown(l.target)
		if !ceiling && !l.c.reachable() {
			// policyd is away: the local policy admits, unless its chain
			// moved the call to a target with a ceiling.
			if !l.admitLocal(attempt) {
				return "", false
			}
			if l.c.flow.ceilingKnown(l.target) {
				continue
			}
			return "", true
		}
		l.c.stats.admits.Add(1)
		timeout := l.c.cfg.DecisionTimeout
		if ceiling {
			timeout = l.ceilingAdmitTimeout()
		}
		ctx, cancel := context.WithTimeout(l.ctx, timeout)
		resp, err := l.c.workers.Admit(ctx, &pb.AdmitRequest{Call: l.pbRef(), Attempt: uint32(attempt), AttemptTarget: l.attemptTarget()})
		cancel()
		if err != nil && ceiling && l.ctx.Err() == nil && silence(err) {
			// A fleet-wide ceiling is kept by policyd alone: no attempt
			// without its lease or rate slot. Wait and ask again.
			l.c.failed(err)
			if !l.waitSilent(unanswered, attempt) {
				return "", false
			}
			unanswered++
			continue
		}
		if err != nil {
			if ceiling && silence(err) {
				l.res.Reason = "flow:unavailable" // the call's context ended while it asked
			}
			if !l.unanswered(err, attempt) || !l.admitLocal(attempt) {
				return "", false
			}
			if l.c.flow.ceilingKnown(l.target) {
				continue // the local chain moved the call to a target with a ceiling
			}
			return "", true
		}
		unanswered = 0
		if t := resp.GetTarget(); resp.GetAdmitted() && t != "" {
			l.moveTo(t, attempt, moveByCircuit)
		}
		l.c.flow.learn(l.target, resp.GetFlowControlled())
		if !resp.GetAdmitted() && resp.GetState() == pb.BreakerState_BREAKER_STATE_OPEN {
			// Refused on an open breaker: no fallback took it, so fail
			// fast locally again.
			l.c.chains.refusedOpen(l.call.target)
		}
		if c := resp.GetRunCutoffTime(); c != nil && l.call.runID != "" {
			l.cutoff, runKnown = c.AsTime(), true
			l.c.runs.learn(l.call.runID, l.cutoff)
		}
		if resp.GetAdmitted() {
			l.lease = resp.GetLeaseId()
			return resp.GetPermitId(), true
		}
		if r := resp.GetReason(); r == "cooldown:pushback" || r == "concurrency:full" || r == "rate:limited" {
			if !l.waitFor(resp.GetRetryAfter().AsDuration(), attempt, r) {
				return "", false
			}
			continue
		}
		l.res.Reason = resp.GetReason()
		if l.res.Reason == "run:cutoff" {
			l.end(DeadlineCut, StopDeadline, attempt-1, nil)
			return "", false
		}
		l.end(CircuitOpen, StopCircuitOpen, attempt-1, nil)
		return "", false
	}
}

// admitLocal admits attempt while policyd is away, to the target the
// chain known gives it (chainCache.local) on the breakers last seen: the
// call moves there, or, when that target's breaker is open and no fallback
// takes the call, it ends CIRCUIT_OPEN. ok false means the call ended.
func (l *loop) admitLocal(attempt int) bool {
	t, ok := l.c.chains.local(l.call.target, attempt, l.c.breakers.openAt(l.c.cfg.Now()))
	if !ok {
		l.res.Reason = "breaker:open"
		l.end(CircuitOpen, StopCircuitOpen, attempt-1, nil)
		return false
	}
	if t != "" {
		l.moveTo(t, attempt, moveLocal)
	}
	return true
}

// waitFor waits out a fleet-wide cool-down or a full ceiling (reason) of
// d before an attempt, unless the attempt could then not finish by the
// deadline. The wait is spread like policyd spreads a hint, over [d, d +
// max(d/10, 250ms)], so the workers held by one cool-down do not all call
// at the instant it ends; a rate ceiling's wait is exact (policyd's GCRA
// computed it for this request) and is not spread.
func (l *loop) waitFor(d time.Duration, attempt int, reason string) bool {
	if reason != "rate:limited" {
		d += time.Duration(rand.Float64() * float64(max(d/10, 250*time.Millisecond)))
	}
	if deadline, cut := l.cutoffBinds(); !deadline.IsZero() && l.c.cfg.Now().Add(d+l.timeout).After(deadline) {
		l.res.Reason = reason
		disp := DeadLetter
		if cut {
			disp = DeadlineCut
		}
		l.end(disp, StopDeadline, attempt-1, nil)
		return false
	}
	if err := l.c.cfg.Sleep(l.ctx, d); err != nil {
		l.res.Err = err
		l.end(DeadLetter, StopDeadline, attempt-1, nil)
		return false
	}
	return true
}

// next asks policyd what to do after a failed attempt, or decides locally
// when policyd does not answer within the decision timeout.
func (l *loop) next(attempt int, f failure, permit string, timedOut bool) decision {
	if l.c.reachable() {
		ctx, cancel := context.WithTimeout(l.ctx, l.c.cfg.DecisionTimeout)
		l.c.out.flushNow(ctx)
		resp, err := l.c.workers.NextDelay(ctx, &pb.NextDelayRequest{
			Call: l.pbRef(), Attempt: uint32(attempt), Failure: f.pb, Pushback: f.pushback,
			PreviousDelay: durationpb.New(l.prev), PermitId: permit, LeaseId: l.lease, AttemptTarget: l.attemptTarget(),
		})
		cancel()
		if err == nil {
			l.lease = "" // NextDelay returned it
			l.c.flow.learn(l.call.target, resp.GetFlowControlled())
			return decision{
				retry: resp.GetDecision() == pb.Decision_DECISION_RETRY, delay: resp.GetDelay().AsDuration(),
				stopReason: resp.GetStopReason(), disposition: resp.GetDisposition(),
				reason: resp.GetClassification(), attemptTimeout: resp.GetAttemptTimeout().AsDuration(),
				target: resp.GetTarget(), breaker: resp.GetBreakerState(),
			}
		}
		if l.ctx.Err() == nil {
			l.c.failed(err)
		}
	}
	l.c.stats.local.Add(1)
	if l.c.cfg.OnEvent != nil {
		l.c.emit(Event{Kind: EventLocalDecision, Target: l.target, CallID: l.call.id, Attempt: attempt})
	}
	deadline, cut := l.cutoffBinds()
	dec := l.c.local.decide(l.c.cfg.Now(), deadline, attempt, f, l.call.idempotent, l.call.key != "", timedOut, l.timeout)
	if cut && dec.stopReason == pb.StopReason_STOP_REASON_DEADLINE {
		dec.disposition = pb.Disposition_DISPOSITION_DEADLINE_CUT // the run's cut-off bound, not the call's deadline
	}
	if dec.retry {
		t, ok := l.c.chains.local(l.call.target, attempt+1, l.c.breakers.openAt(l.c.cfg.Now()))
		if !ok {
			// The chain's next target is open and none after it takes the
			// call, as policyd would answer.
			return dec.stop(pb.StopReason_STOP_REASON_CIRCUIT_OPEN, pb.Disposition_DISPOSITION_CIRCUIT_OPEN)
		}
		dec.target = t
	}
	return dec
}

// ceilingAdmitTimeout bounds an Admit about a target with a fleet-wide
// ceiling. No attempt goes ahead without its answer, so giving up at the
// decision timeout would gain nothing and leave the lease policyd granted
// meanwhile held by no one until it expires: it waits up to
// Config.RetryUnreachableAfter (at least the decision timeout), and not
// past the last instant an attempt could still start and finish by the
// deadline.
func (l *loop) ceilingAdmitTimeout() time.Duration {
	d := max(l.c.cfg.DecisionTimeout, l.c.cfg.RetryUnreachableAfter)
	if deadline, _ := l.cutoffBinds(); !deadline.IsZero() {
		d = min(d, max(deadline.Sub(l.c.cfg.Now())-l.timeout, l.c.cfg.DecisionTimeout))
	}
	return d
}

// waitSilent waits before asking Admit again for attempt, to a target with
// a fleet-wide ceiling, after n Admits in a row policyd left unanswered:
// equal jitter over min(RetryUnreachableAfter, 100ms * 2^n), and never past
// the last instant an attempt could still start and finish by the deadline
// (the call's, or the run's cut-off), so the last ask is made then. When
// that instant has passed, the call ends a dead letter (DEADLINE; a run's
// call past its cut-off DEADLINE_CUT) with reason flow:unavailable, and
// waitSilent returns false; policyd, whose clock then says the same,
// accepts the report when it answers again.
func (l *loop) waitSilent(n, attempt int) bool {
	nominal := min(l.c.cfg.RetryUnreachableAfter, 100*time.Millisecond<<min(n, 16))
	d := nominal/2 + time.Duration(rand.Float64()*float64(nominal/2))
	if deadline, cut := l.cutoffBinds(); !deadline.IsZero() {
		room := deadline.Sub(l.c.cfg.Now()) - l.timeout
		if room <= 0 {
			l.res.Reason = "flow:unavailable"
			disp := DeadLetter
			if cut {
				disp = DeadlineCut
			}
			l.end(disp, StopDeadline, attempt-1, nil)
			return false
		}
		d = min(d, room)
	}
	if err := l.c.cfg.Sleep(l.ctx, d); err != nil {
		l.res.Err, l.res.Reason = err, "flow:unavailable"
		l.end(DeadLetter, StopDeadline, attempt-1, nil)
		return false
	}
	return true
}

// silence reports whether err means policyd did not answer (unreachable,
// slow or shedding), not that it refused the request.
func silence(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Canceled:
		return true
	}
	return false
}

// failed notes a decision RPC that did not answer. Unreachable or slow
// policyd switches the client to local decisions for a while; any other
// error (a bad request, say) is logged and decided locally this once.
func (c *Client) failed(err error) {
	if silence(err) {
		c.unreachable(err)
		return
	}
	c.cfg.Logger.Error("policyd refused a decision request; deciding locally", "err", err)
}

// randomID names a call that came without an id. Call ids must be unique,
// not secret.
func randomID() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	return hex.EncodeToString(b[:])
}
