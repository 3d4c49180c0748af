package server

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// The decisions of RetryPolicyService in domain types: the handlers in
// decisions.go convert a request (convert.go), call one of these, and
// convert the answer back. They live in server, beside the handlers, as
// plain domain code rather than in a package of their own: they need the
// handlers' Store, Config (clock, random draws, logger, metrics) and the
// error mapping of errors.go, and nothing else consumes them.

// nextDelayRequest is a validated NextDelay request in domain types.
type nextDelayRequest struct {
	call    callRef
	attempt uint32 // the attempt that failed, from 1
	failure policy.Failure
	hints   policy.Hints
	prev    time.Duration // the previous delay
	permit  string        // the HALF_OPEN probe permit the attempt used
	lease   string        // the concurrency lease the attempt held
	target  string        // the target the attempt was sent to: call.target or a fallback
}

// decideNextDelay is NextDelay's decision, in domain types: an attempt
// already decided gets its answer again (a lower one, or any after a STOP,
// is refused), and a duplicate of one being decided waits for its answer;
// otherwise the stateless rules of policy, the breaker
// (which learns of the failure), the cool-down, the deadline again, the
// budgets and the run's cut-off decide, and the changes commit together
// in one store unit. A store that takes the fleet-wide part in one step
// (OneCallNextDelay) decides the common case, a call without a fallback
// chain whose attempt held no lease, by the same rules in that step
// (nextDelayInOneCall). It returns the answer and its explanation; an
// error is a status, mapped by errors.go.
func (d *Decisions) decideNextDelay(ctx context.Context, in *nextDelayRequest) (policy.Answer, string, error) {
	call, f := in.call, in.failure
	p, _ := d.store.Resolve(call.tenant, call.target)
	// The failed attempt's target keeps its own breaker and ceilings, under
	// its own policy; the call's rules are the primary's, p.
	failed := d.hopOf(&call, &p, in.target)
	one, _ := d.store.(OneCallNextDelay)
	// Every engine call of this decision goes through u, which bounds them
	// together (redisstore: one --store-timeout for all of them).
	u := d.store.Begin()
	var r *ruled // the stateless rules' decision, once made
	if one != nil && in.lease == "" && in.target == call.target && len(p.Fallback.Targets) == 0 {
		// The common case, on a store that takes it in one step.
		rr, err := d.statelessRules(ctx, u, in, &p, &failed, one)
		if err != nil {
			return policy.Answer{}, "", err
		}
		if ans, why, done, err := d.nextDelayInOneCall(ctx, one, u, in, &p, &failed, &rr); done {
			return ans, why, err
		}
		r = &rr // the store could not take the step: the batch decides with the same rules' decision
	}
	// An attempt already decided gets its answer again; a lower one, or
	// any after a STOP, is refused.
	ck := policy.CallKey{Tenant: call.tenant, CallID: call.callID}
	prior, replay, err := u.ClaimAttempt(ck, in.attempt)
	if err != nil {
		return policy.Answer{}, "", storeError(ctx, d.cfg.Logger, "attempt", err)
	}
	if in.lease != "" {
		sig := policy.SignalNone // a replay's outcome taught the adaptive ceiling the first time
		if !replay {
			sig = flowSignal(false, f, in.hints)
		}
		lp := &p
		if in.target != call.target {
			tp := d.targetPolicy(&call, &p, in.target)
			lp = &tp
		}
		d.releaseLease(ctx, u, lp, call, in.target, in.lease, sig) // the attempt is over, whatever comes of it
	}
	if replay {
		return replayed(prior, &call, &p)
	}
	// This request holds the call's claim until it records its answer; a
	// duplicate waits for that and replays it. Returning before, it lets go.
	claimed := true
	defer func() {
		if claimed {
			d.store.ReleaseAttempt(ck)
		}
	}()
	if r == nil {
		rr, err := d.statelessRules(ctx, u, in, &p, &failed, one)
		if err != nil {
			return policy.Answer{}, "", err
		}
		r = &rr
	}
	dec, run, now, hint, result := r.dec, r.run, r.now, r.hint, r.result

	// The changes of this decision are made durable together, at once with
	// --sync=always (one commit, not one per change).
	snap, err := u.Record(failed.key, failed.breaker, result, in.permit)
	if err != nil {
		return policy.Answer{}, "", storeError(ctx, d.cfg.Logger, "breaker", err)
	}
	ans := policy.Answer{Breaker: snap.State, Note: dec.Hint.Note, FlowControlled: p.FlowControlled(), Degraded: snap.Degraded}

	if !dec.Retry && result == policy.ResultPushback && hint.Delay > 0 {
		// Not retried, but the upstream's request for time still holds the
		// fleet back: the cool-down is what pushback counts toward.
		d.shareHint(ctx, u, hint, &p, &failed, call, now)
	}
	if dec.Retry {
		// The next attempt's target: the failed one's, unless the chain
		// moves it (after_attempts, or an open breaker with on_circuit_open).
		next, nsnap := failed, snap
		if len(p.Fallback.Targets) > 0 {
			next, nsnap = d.routeRetry(u, &call, &p, failed, snap, in.attempt+1)
		}
		if err := d.shared(ctx, u, &dec, &p, &failed, &next, call, r.timeout, nsnap, now, r.draw, &ans); err != nil {
			return policy.Answer{}, "", err
		}
		if dec.Retry {
			ans.Target = next.target
			if next.target != failed.target {
				d.cfg.Metrics.fallback(failed.target, next.target)
			}
		}
	}
	// Past the run's cut-off every stop is a cut, and so is a deadline
	// stop when the cut-off was the deadline.
	fleet.CutRun(&dec, fleet.UnixNano(run.Cutoff), now.UnixNano(), r.cutBinds)
	ans.Retry, ans.Stop, ans.Disposition = dec.Retry, dec.Stop, dec.Disposition
	if dec.Retry {
		ans.Delay, ans.AttemptTimeout = dec.Delay, dec.AttemptTimeout
	}
	ans.Category, ans.Class, ans.Checks, ans.Deadline = dec.Class.Category, dec.Class.Reason, dec.Checks, dec.Deadline
	ans.Degraded = ans.Degraded || d.degraded()
	why := detail(&dec, &p)
	d.decided(ctx, u, call, in.target, in.attempt, &dec, why, snap.State)
	claimed = false // RecordAttempt ends the claim, recorded or not
	kept := ans
	if kept.Target == call.target {
		kept.Target = "" // the primary: nothing more to store
	}
	if err := u.RecordAttempt(ck, in.attempt, kept, time.Unix(0, fleet.Keep(&p, now.UnixNano(), dec.Deadline))); err != nil {
		return policy.Answer{}, "", storeError(ctx, d.cfg.Logger, "attempt", err)
	}
	if call.runID != "" {
		if err := u.NoteCall(call.runID, call.callID, decisionNote(&call, in.target, in.attempt, dec.Class.Reason, why, now)); err != nil {
			return policy.Answer{}, "", storeError(ctx, d.cfg.Logger, "run calls", err)
		}
	}
	if !ans.Retry {
		// The call ends here, once: a duplicate replays the answer above.
		u.CountAttempts(policy.AttemptTally{Tenant: call.tenant, Target: in.target, Attempt: in.attempt})
	}
	if err := u.Commit(); err != nil {
		return policy.Answer{}, "", storeError(ctx, d.cfg.Logger, "decision", err)
	}
	return ans, why, nil
}

// replayed is the answer to an attempt decided before, prior as
// remembered, for call under p.
func replayed(prior policy.Answer, call *callRef, p *policy.Policy) (policy.Answer, string, error) {
	prior.FlowControlled = p.FlowControlled()
	if prior.Retry && prior.Target == "" {
		prior.Target = call.target // remembered empty: the primary
	}
	return prior, answerDetail(&prior, p), nil
}

// ruled is a NextDelay as the rules that need no fleet state decide it.
type ruled struct {
	dec      policy.Decision
	now      time.Time
	run      policy.Run // the call's run, the zero value for none
	cutBinds bool       // the run's cut-off comes before the call's own deadline
	hint     policy.Hint
	result   policy.Result // the failure as the failed attempt's breaker counts it
	timeout  bool          // the failure was a timeout (the budget's timeout cost)
	draw     float64       // spreads the delay over a fleet-wide cool-down, if one is longer
}

// runOfCall is the run call names: one's KnownRun when one is set and
// has it at hand for call's tenant (its ID, Tenant and Cutoff never
// change, and a decision reads nothing else of it), else read from runs.
func (d *Decisions) runOfCall(ctx context.Context, runs runReader, call *callRef, one OneCallNextDelay) (policy.Run, error) {
	if one != nil {
		if r, ok := one.KnownRun(call.runID); ok && r.Tenant == call.tenant {
			return r, nil
		}
	}
	return d.runOf(ctx, runs, "call.run_id", call.runID, call.tenant)
}

// statelessRules decides in under p by the rules that need no fleet state
// (policy.Decide, the run's cut-off a deadline for every call of the run)
// and says what the breaker of failed learns of the failure (the run:
// runOfCall, read through the request's u).
func (d *Decisions) statelessRules(ctx context.Context, u Changes, in *nextDelayRequest, p *policy.Policy, failed *hop, one OneCallNextDelay) (ruled, error) {
	call, f := &in.call, in.failure
	r := ruled{now: d.cfg.Clock.Now()}
	deadline := call.deadline
	if call.runID != "" {
		var err error
		if r.run, err = d.runOfCall(ctx, u, call, one); err != nil {
			return ruled{}, err
		}
		// The run's cut-off is a deadline for every call of the run.
		eff := policy.EffectiveDeadline(p, r.now, call.origin, call.deadline)
		if eff.IsZero() || r.run.Cutoff.Before(eff) {
			deadline, r.cutBinds = r.run.Cutoff, true
		}
	}
	r.dec = policy.Decide(p, policy.Input{
		Attempt: int(in.attempt), Failure: f,
		Idempotent: call.idempotent, HasIdempotencyKey: call.key != "",
		Hints: in.hints, PrevDelay: in.prev,
		Now: r.now, Origin: call.origin, Deadline: deadline,
		JitterDraw: d.cfg.Rand(), SpreadDraw: d.cfg.Rand(),
	})
	r.draw = d.cfg.Rand()
	// The breaker learns of every failure; a terminal answer means the
	// upstream is up, and so does pushback (fleet.BreakerResult). The hint
	// is read here too when Decide stopped before its pushback check.
	r.hint = r.dec.Hint
	if !r.hint.Present && r.dec.Class.Category == policy.CategoryTransient && in.hints != (policy.Hints{}) {
		r.hint = policy.ParseHints(in.hints, r.now, p.Pushback.MaxHint)
	}
	r.result = fleet.BreakerResult(r.dec.Class.Category, r.hint.Present, &failed.breaker)
	r.dec.Checks |= policy.CheckBreaker
	r.timeout = (f.Kind == policy.FailureTransport && f.Transport == policy.TransportTimeout) ||
		(f.Kind == policy.FailureGRPC && f.Code == int(codes.DeadlineExceeded))
	return r, nil
}

// nextDelayInOneCall is decideNextDelay on a store that takes the
// fleet-wide part in one step (OneCallNextDelay), for a call of p, which
// has no fallback targets, whose attempt (to failed) held no lease, r
// its stateless rules' decision: the rules after them are those of the
// batch (shared, fleet.CutRun), applied by the store, as part of the
// request's u. done is false when the store could not take the step
// (degraded mode): the caller decides through u then, with r.
func (d *Decisions) nextDelayInOneCall(ctx context.Context, one OneCallNextDelay, u Changes, in *nextDelayRequest, p *policy.Policy,
	failed *hop, r *ruled) (ans policy.Answer, why string, done bool, err error) {
	call := in.call
	st := policy.NextDelayStep{
		Call: policy.CallKey{Tenant: call.tenant, CallID: call.callID}, Attempt: in.attempt,
		Key: failed.key, Breaker: failed.breaker, Result: r.result, PermitID: in.permit,
		Decision: r.dec, Policy: p, SpreadDraw: r.draw,
		Spend:     policy.SpendRequest{Tenant: call.tenant, Timeout: r.timeout, RunID: call.runID},
		RunCutoff: r.run.Cutoff, CutBinds: r.cutBinds,
		Answer: policy.Answer{Note: r.dec.Hint.Note, FlowControlled: p.FlowControlled(), Category: r.dec.Class.Category,
			Class: r.dec.Class.Reason, Checks: r.dec.Checks, Deadline: r.dec.Deadline, AttemptTimeout: r.dec.AttemptTimeout},
		Keep: time.Unix(0, fleet.Keep(p, r.now.UnixNano(), r.dec.Deadline)),
	}
	switch {
	case r.dec.Retry && r.dec.Hint.Present && r.dec.Hint.Delay > 0:
		st.Share = min(r.dec.Hint.Delay, p.Pushback.MaxHint)
	case !r.dec.Retry && r.result == policy.ResultPushback && r.hint.Delay > 0:
		// Not retried, but the upstream's request for time still holds the
		// fleet back: the cool-down is what pushback counts toward.
		st.Share = min(r.hint.Delay, p.Pushback.MaxHint)
	}
	res, ok, err := one.NextDelayInOneCall(u, &st)
	switch {
	case !ok:
		return policy.Answer{}, "", false, nil
	case errors.Is(err, fleet.ErrPermit):
		return policy.Answer{}, "", true, storeError(ctx, d.cfg.Logger, "breaker", err)
	case err != nil:
		return policy.Answer{}, "", true, storeError(ctx, d.cfg.Logger, "attempt", err)
	case res.Replay:
		ans, why, err := replayed(res.Answer, &call, p)
		return ans, why, true, err
	}
	if res.Asked {
		d.cfg.Metrics.tokens(call.tenant, res.Spend.TenantTokens)
	}
	dec := res.Decision
	ans = res.Answer
	if ans.Retry {
		ans.Target = call.target
	}
	ans.Degraded = ans.Degraded || d.degraded()
	why = detail(&dec, p)
	d.decided(ctx, d.store, call, in.target, in.attempt, &dec, why, res.Breaker.State)
	var note policy.CallNote
	if call.runID != "" {
		note = decisionNote(&call, in.target, in.attempt, dec.Class.Reason, why, r.now)
	}
	var tally policy.AttemptTally
	if !ans.Retry {
		// The call ends here, once: a duplicate replays the answer above.
		tally = policy.AttemptTally{Tenant: call.tenant, Target: in.target, Attempt: in.attempt}
	}
	if err := one.DecidedInOneCall(u, call.runID, call.callID, note, tally); err != nil {
		return policy.Answer{}, "", true, storeError(ctx, d.cfg.Logger, "run calls", err)
	}
	return ans, why, true, nil
}

// answerDetail explains a remembered answer as detail explains a decision.
func answerDetail(ans *policy.Answer, p *policy.Policy) string {
	dec := policy.Decision{Retry: ans.Retry, Delay: ans.Delay, Stop: ans.Stop, Disposition: ans.Disposition,
		Class: policy.Classification{Category: ans.Category, Reason: ans.Class}}
	return detail(&dec, p)
}

// decided puts a NextDelay answer in the audit trail, the metrics and the
// debug log, under target, the failed attempt's.
func (d *Decisions) decided(ctx context.Context, u interface{ AppendAudit(...policy.AuditRecord) }, call callRef, target string, attempt uint32, dec *policy.Decision, why string, breaker policy.BreakerState) {
	verdict := policy.VerdictStop
	if dec.Retry {
		verdict = policy.VerdictRetry
	}
	u.AppendAudit(policy.AuditRecord{
		Event: policy.AuditDecision, Tenant: call.tenant, Target: target, CallID: call.callID, RunID: call.runID,
		Attempt: attempt, Classification: dec.Class.Reason, Verdict: verdict, Delay: dec.Delay,
		Stop: dec.Stop, Disposition: dec.Disposition, Detail: why, PrimaryTarget: primaryOf(&call, target),
	})
	d.cfg.Metrics.decision(target, dec.Retry, dec.Stop, dec.Disposition)
	if d.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
		d.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "decision",
			slog.String("call_id", call.callID), slog.String("tenant", call.tenant), slog.String("target", target),
			slog.String("run_id", call.runID), slog.Uint64("attempt", uint64(attempt)),
			slog.String("classification", dec.Class.Reason), slog.String("decision", verdict.String()),
			slog.Duration("delay", dec.Delay), slog.String("stop_reason", dec.Stop.String()),
			slog.String("disposition", dec.Disposition.String()), slog.String("breaker", breaker.String()),
			slog.String("detail", why))
	}
}

// shared applies the fleet-wide rules to a decision the stateless rules let
// through (fleet.GateRetry, the budgets, fleet.Spent): an open breaker, a
// cool-down another worker reported, the deadline once more, and the
// budgets. The breaker and cool-down are those of next, the target of the
// next attempt, whose snapshot is snap; a pushback hint of the failed
// attempt goes to failed's cool-down. u is the draw that spreads a delay
// over a cool-down. It turns dec into a stop when one refuses, and returns
// an error only when a cap stops the store from answering.
func (d *Decisions) shared(ctx context.Context, u Changes, dec *policy.Decision, p *policy.Policy, failed, next *hop,
	call callRef, timeout bool, snap policy.BreakerSnapshot, now time.Time, draw float64, ans *policy.Answer) error {
	cooldown := snap.CooldownUntil
	if snap.State != policy.BreakerOpen && dec.Hint.Present && dec.Hint.Delay > 0 {
		if until, ok := d.shareHint(ctx, u, dec.Hint, p, failed, call, now); ok && next.key == failed.key {
			cooldown = until
		}
	}
	ask, spread := fleet.GateRetry(dec, p, snap.State, fleet.UnixNano(cooldown), now.UnixNano(), call.runID != "", draw)
	if spread {
		ans.Note = fleet.SpreadNote(ans.Note)
	}
	if !ask {
		return nil
	}
	spend, err := u.SpendRetry(policy.SpendRequest{
		Tenant:  call.tenant,
		Timeout: timeout,
		RunID:   call.runID,
	})
	if overCapacity(err) {
		return storeError(ctx, d.cfg.Logger, "budget", err) // a cap: the operator must hear of it
	}
	if err != nil {
		// The budget could not be consulted: stop rather than retry blind,
		// and say the answer is degraded (its final disposition is taken
		// though the store may not remember it, fleet.CheckFinal).
		d.cfg.Logger.ErrorContext(ctx, "budget unavailable", "call_id", call.callID, "tenant", call.tenant,
			"target", call.target, "err", err)
		fleet.Spent(dec, &policy.Spend{Stop: policy.StopBudgetExhausted, Disposition: policy.DispositionDeadLetter})
		ans.Degraded = true
		return nil
	}
	d.cfg.Metrics.tokens(call.tenant, spend.TenantTokens)
	ans.TenantTokens = spend.TenantTokens
	ans.RunRemaining = spend.RunRemaining
	ans.Degraded = spend.Degraded
	fleet.Spent(dec, &spend)
	return nil
}

// shareHint makes a server's pushback hint the fleet-wide cool-down of the
// breaker of at (capped at p.Pushback.MaxHint, p the call's policy) and
// returns the end in force; ok is false, and the failure logged, when the
// store could not.
func (d *Decisions) shareHint(ctx context.Context, u Changes, hint policy.Hint, p *policy.Policy, at *hop,
	call callRef, now time.Time) (until time.Time, ok bool) {
	h := min(hint.Delay, p.Pushback.MaxHint)
	until, err := u.ExtendCooldown(at.key, at.breaker, now.Add(h))
	if err != nil {
		d.cfg.Logger.WarnContext(ctx, "cool-down not shared", "call_id", call.callID, "tenant", call.tenant,
			"target", at.target, "err", err)
		return time.Time{}, false
	}
	return until, true
}

// decideAdmit is Admit's decision, in domain types: a call of a run past
// its cut-off is refused (run:cutoff, the breaker not consulted);
// otherwise the shared breaker of the call's policy admits or refuses (a
// refusal is a value, put in the audit trail). The answer carries the
// run's cut-off, so the client can hold it without asking again. An
// unknown run is NOT_FOUND (tenant-scoped); any other error is a status,
// mapped by errors.go.
//
// target is the target the attempt is meant for (call.target, or a
// fallback NextDelay named); with the primary's fallback on_circuit_open, a
// refusal by its open breaker or full ceiling moves the attempt to the next
// target of the chain that admits it (admitChain).
func (d *Decisions) decideAdmit(ctx context.Context, call callRef, target string, attempt uint32) (policy.Admission, error) {
	var a policy.Admission
	if call.runID != "" {
		// A call of a run past its cut-off is not attempted: the cut-off
		// holds for calls started after it, not only for their retries.
		one, _ := d.store.(OneCallNextDelay)
		run, err := d.runOfCall(ctx, d.store, &call, one)
		if err != nil {
			return policy.Admission{}, err
		}
		if !d.cfg.Clock.Now().Before(run.Cutoff) {
			a = policy.Admission{Reason: "run:cutoff", RunCutoff: run.Cutoff}
		} else {
			a.RunCutoff = run.Cutoff
		}
	}
	if a.Reason == "" {
		p, _ := d.store.Resolve(call.tenant, call.target)
		var b policy.Admission
		var err error
		if target == call.target && len(p.Fallback.Targets) == 0 {
			b, err = d.admit(d.store, &p, &call, target)
			b.Target = target
		} else {
			// The chain's admissions within one request's time (Begin).
			b, err = d.admitChain(d.store.Begin(), &p, &call, target)
		}
		if err != nil {
			return policy.Admission{}, storeError(ctx, d.cfg.Logger, "breaker", err)
		}
		b.RunCutoff = a.RunCutoff
		a = b
	}
	a.Degraded = a.Degraded || d.degraded()
	if !a.Admitted {
		why := "refused: " + a.Reason
		if a.RetryAfter > 0 {
			why += ", ask again in " + a.RetryAfter.String()
		}
		d.store.AppendAudit(policy.AuditRecord{
			Event: policy.AuditAdmit, Tenant: call.tenant, Target: target, CallID: call.callID, RunID: call.runID,
			Attempt: attempt, Detail: why, PrimaryTarget: primaryOf(&call, target),
		})
		if d.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
			d.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "admission refused",
				slog.String("call_id", call.callID), slog.String("tenant", call.tenant), slog.String("target", target),
				slog.Uint64("attempt", uint64(attempt)), slog.String("breaker", a.State.String()),
				slog.String("reason", a.Reason), slog.Duration("retry_after", a.RetryAfter))
		}
	}
	return a, nil
}

// agrees checks outcome i's final disposition against the outcome and
// what policyd decided for the call (fleet.CheckFinal): a contradiction
// is INVALID_ARGUMENT naming outcomes[i].final_disposition and the rule.
// ans and answered are the call's remembered answer and the attempt it
// answered, 0 for none (finalAnswers reads
// them for the whole request); it also reads the call's run and its
// breaker as this replica knows it (Breakers.KnownBreaker: no round
// trip), so it runs only for the outcomes checkFinal selects. A
// disposition refused so is checked again on the breaker as the store
// has it, read then (through st, the request's): the replica's copy may lag the fleet's by the change
// stream's delivery, or be missing. stopped reports that policyd stopped
// the call itself (NextDelay's STOP, which counted the call's end in the
// attempt statistics).
func (d *Decisions) agrees(ctx context.Context, st Changes, i int, it *outcomeItem, ans policy.Answer, answered uint32, p *policy.Policy, key policy.BreakerKey) (stopped bool, err error) {
	now := d.cfg.Clock.Now()
	success, alreadyRecorded := it.success, it.alreadyRecorded
	r := fleet.FinalReport{
		Final:          it.final,
		Success:        success,
		Now:            now.UnixNano(),
		Horizon:        int64(fleet.Horizon(p)),
		Skew:           int64(d.cfg.MaxClockSkew),
		AttemptTimeout: int64(p.AttemptTimeout),
	}
	if !success && !alreadyRecorded {
		r.Failure = policy.Classify(p, it.failure, true, true).Category
	}
	r.Recorded = !success && alreadyRecorded
	r.Answer, r.Decided = ans, answered > 0
	// A RETRY remembered for an attempt before the one whose failure was
	// told to NextDelay: the answer to that one was lost.
	r.Stale = r.Recorded && r.Decided && ans.Retry && it.attempt > answered
	deadline := r.Answer.Deadline
	if !it.call.deadline.IsZero() || !it.call.origin.IsZero() {
		deadline = policy.EffectiveDeadline(p, now, it.call.origin, it.call.deadline)
	}
	if !deadline.IsZero() {
		r.Deadline = deadline.UnixNano()
	}
	if it.call.runID != "" {
		run, err := d.runOf(ctx, st, "outcomes.call.run_id", it.call.runID, it.call.tenant)
		if err != nil {
			return false, err
		}
		r.Cutoff = run.Cutoff.UnixNano()
	}
	r.HasKey = it.call.key != ""
	snap, known := d.store.KnownBreaker(key)
	if known {
		setBreaker(&r, &snap)
	}
	rule := fleet.CheckFinal(&r)
	if rule != "" {
		// What a breaker tells only lets a disposition through (it refused
		// the call, its cool-down ate the deadline), so a breaker not known
		// here matters only for a refusal, and so does a known one that
		// lags the store's.
		r.HasBreaker, r.Breaker, r.Transitioned, r.Changed, r.CooldownEnd = false, 0, false, 0, 0
		if snap, err := st.Breaker(key); err == nil {
			setBreaker(&r, &snap)
		} else if !notFound(err) {
			return false, storeError(ctx, d.cfg.Logger, "breaker", err)
		}
		rule = fleet.CheckFinal(&r)
	}
	if rule != "" {
		return false, invalid("outcomes["+strconv.Itoa(i)+"].final_disposition", rule)
	}
	return r.Decided && !r.Answer.Retry, nil
}

// setBreaker puts what fleet.CheckFinal needs of the call's breaker in r.
func setBreaker(r *fleet.FinalReport, snap *policy.BreakerSnapshot) {
	r.HasBreaker, r.Breaker, r.Transitioned = true, snap.State, snap.Generation > 0
	r.Changed, r.CooldownEnd = snap.Changed.UnixNano(), snap.CooldownUntil.UnixNano()
	if snap.CooldownUntil.IsZero() {
		r.CooldownEnd = 0
	}
}

// checkFinal reports whether outcome it's final disposition is checked
// against what policyd decided (agrees): every one but a success's
// SUCCEEDED.
func (it *outcomeItem) checkFinal() bool {
	fd := it.final.Disposition
	return fd != policy.DispositionNone && (fd != policy.DispositionSucceeded || !it.success)
}

// finalAnswers reads the remembered answers of the calls of the outcomes
// that checkFinal selects, in items' order, in one batch of st, the
// request's (Attempts.LastAnswers: one round trip per tenant on a shared
// engine, not one per outcome); nil when there are none.
func finalAnswers(st Changes, items []outcomeItem) (answers []policy.Answer, answered []uint32) {
	var keys []policy.CallKey
	for i := range items {
		if it := &items[i]; it.checkFinal() {
			keys = append(keys, policy.CallKey{Tenant: it.call.tenant, CallID: it.call.callID})
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	answers, answered = make([]policy.Answer, len(keys)), make([]uint32, len(keys))
	st.LastAnswers(keys, answers, answered)
	return answers, answered
}

// detail explains a decision in a sentence for logs and humans.
func detail(dec *policy.Decision, p *policy.Policy) string {
	if dec.Retry {
		return "retry after " + dec.Delay.Round(time.Millisecond).String() + " (" + dec.Class.Reason + ")"
	}
	switch dec.Stop {
	case policy.StopTerminal:
		return "not retryable: " + dec.Class.Reason
	case policy.StopNotIdempotent:
		return "not idempotent and no idempotency key: a retry could duplicate the write"
	case policy.StopAttemptsExhausted:
		return "max attempts (" + strconv.Itoa(p.MaxAttempts) + ") reached"
	case policy.StopDeadline:
		return "the next attempt cannot finish before the deadline"
	case policy.StopBudgetExhausted:
		return "retry budget exhausted"
	case policy.StopCircuitOpen:
		return "the upstream's circuit breaker is open"
	case policy.StopServerPushback:
		return "the server said not to retry"
	}
	return ""
}

// outcomeItem is a validated Outcome in domain types.
type outcomeItem struct {
	call            callRef
	attempt         uint32
	success         bool
	alreadyRecorded bool // the failure was told to NextDelay
	failure         policy.Failure
	latency         time.Duration
	permit          string
	lease           string
	final           fleet.Final
	target          string // the target the attempt was sent to: call.target or a fallback
	ceiled          bool   // decideOutcomes: target's policy has a ceiling (settleLeases)
	chained         bool   // decideOutcomes: the attempt is on the primary, whose policy has a fallback
}

// decideOutcomes is ReportOutcome's decision, in domain types: each
// outcome's result for its breaker (classified under its policy), its
// audit records, its final disposition for its run's ledger (which must
// agree with what policyd decided, see agrees), and the tenants'
// deposits, applied by the store as one batch once the whole batch is
// valid. It returns how many outcomes the store applied and the updates,
// whose Refused field names the ones the state's rules refused; an error
// is a status, mapped by errors.go.
func (d *Decisions) decideOutcomes(ctx context.Context, st Changes, items []outcomeItem, sc *outcomeScratch) (int, []policy.OutcomeUpdate, error) {
	ups := slices.Grow(sc.ups[:0], len(items))[:len(items)]
	sc.ups = ups
	trail := slices.Grow(sc.trail[:0], 2*len(items)) // at most two records an outcome
	defer func() { sc.trail = trail }()
	var runs map[string]string
	var now time.Time // read once, for the first outcome of a run
	deposits := map[string]int{}
	// The successes of consecutive outcomes of one tenant (most of a
	// batch) are summed before they go in deposits, not hashed one by one.
	var depTenant string
	depN := 0
	pols := &sc.pols
	pols.reset()
	var pi int // the call's policy in pols, looked up again only when an outcome's tenant or target differs from the last's
	answers, answered := finalAnswers(st, items)
	checked := 0 // outcomes agrees has checked
	for i := range items {
		it := &items[i]
		if i == 0 || it.call.tenant != items[i-1].call.tenant || it.call.target != items[i-1].call.target {
			pi = pols.resolve(d.store, it.call.tenant, it.call.target)
		}
		// The attempt's breaker is its target's, under that target's policy;
		// the failure is classified under the call's, the primary's.
		ti := pi
		if it.target != it.call.target {
			ti = pols.resolve(d.store, it.call.tenant, it.target)
		}
		p, tp := &pols.p[pi], &pols.p[ti] // after both lookups: one may grow pols.p
		// What settleLeases needs to know, so it resolves only the
		// outcomes of targets with a ceiling or a chain, or with a lease.
		it.ceiled = tp.FlowControlled()
		it.chained = it.target == it.call.target && len(p.Fallback.Targets) > 0
		u := &ups[i]
		*u = policy.OutcomeUpdate{Key: policy.KeyFor(tp.Breaker, it.call.tenant, it.target), Breaker: tp.Breaker, PermitID: it.permit}
		var class string
		switch {
		case it.success:
			if depN > 0 && it.call.tenant != depTenant {
				deposits[depTenant] += depN
				depN = 0
			}
			depTenant = it.call.tenant
			depN++
			u.Result = policy.ResultSuccess
		case !it.alreadyRecorded:
			c := policy.Classify(p, it.failure, true, true)
			u.Result = policy.ResultTerminal
			if c.Category == policy.CategoryTransient {
				u.Result = policy.ResultTransientFailure
			}
			class = c.Reason
		}
		if it.final.Deduplicated {
			// A deduplicated success needs the key's record to say so.
			v, err := st.Key(policy.KeyRef{Tenant: it.call.tenant, Key: it.call.key})
			if err != nil && !notFound(err) {
				return 0, ups, storeError(ctx, d.cfg.Logger, "outcomes.call.idempotency_key", err)
			}
			if err != nil || v.State != policy.KeySucceeded {
				return 0, ups, invalid("outcomes["+strconv.Itoa(i)+"].deduplicated", "needs the call's idempotency key to have SUCCEEDED")
			}
		}
		if it.success {
			u.Tally = policy.AttemptTally{Tenant: it.call.tenant, Target: it.target, Attempt: it.attempt, Success: true}
		}
		if it.checkFinal() {
			stopped, err := d.agrees(ctx, st, i, it, answers[checked], answered[checked], p, u.Key)
			checked++
			if err != nil {
				return 0, ups, err
			}
			if !stopped {
				// A final failure policyd did not decide (NextDelay's STOP
				// counted those) ends the call here.
				u.Tally = policy.AttemptTally{Tenant: it.call.tenant, Target: it.target, Attempt: it.attempt}
			}
		}
		start := len(trail)
		trail = d.outcome(ctx, trail, it, class)
		u.Audit = trail[start:len(trail):len(trail)]
		if it.call.runID != "" {
			if now.IsZero() {
				now = d.cfg.Clock.Now()
			}
			u.RunID, u.CallID, u.Note = it.call.runID, it.call.callID, outcomeNote(it, class, now)
		}
		if it.final.Disposition != policy.DispositionNone && it.call.runID != "" {
			u.RunID, u.CallID = it.call.runID, it.call.callID
			u.Final, u.Stop, u.Deduplicated = it.final.Disposition, it.final.Stop, it.final.Deduplicated
			if runs == nil {
				runs = map[string]string{}
			}
			runs[it.call.runID] = it.call.tenant
		}
	}
	for id, tenant := range runs {
		if _, err := d.runOf(ctx, st, "outcomes.call.run_id", id, tenant); err != nil {
			return 0, ups, err
		}
	}
	// Nothing is applied before the whole batch is valid. The store applies
	// it as a whole: with --sync=always that is one commit for the request,
	// not one per outcome.
	if depN > 0 {
		deposits[depTenant] += depN
	}
	n, err := st.ApplyOutcomes(ups, deposits)
	if err != nil {
		return n, ups, storeError(ctx, d.cfg.Logger, "outcomes", err)
	}
	return n, ups, nil
}

// outcome appends a reported outcome, and the call's final disposition when
// it carries one (with or without a run), to trail and logs it at debug
// level. class is the failure's classification, when it was classified. A
// success that ends its call (the common outcome by far) is one FINAL
// record, which says both.
func (d *Decisions) outcome(ctx context.Context, trail []policy.AuditRecord, it *outcomeItem, class string) []policy.AuditRecord {
	call := it.call
	why := "attempt failed"
	switch {
	case it.success:
		why = "attempt succeeded"
	case it.alreadyRecorded:
		why = "attempt failed (recorded by NextDelay)"
	}
	// The latency is kept in Delay, not formatted into the detail here:
	// QueryAudit writes it out (auditRecordToPB), once per record read
	// rather than once per outcome reported.
	rec := policy.AuditRecord{
		Event: policy.AuditOutcome, Tenant: call.tenant, Target: it.target, CallID: call.callID, RunID: call.runID,
		Attempt: it.attempt, Classification: class, Detail: why, Delay: it.latency, PrimaryTarget: primaryOf(&call, it.target),
	}
	fd, stop := it.final.Disposition, it.final.Stop
	if it.success && fd == policy.DispositionSucceeded {
		rec.Event, rec.Disposition = policy.AuditFinal, fd
	}
	trail = append(trail, rec)
	if fd != policy.DispositionNone && !it.success {
		rec.Event, rec.Classification, rec.Disposition, rec.Stop = policy.AuditFinal, "", fd, stop
		rec.Delay, rec.Detail = 0, finalDetail(fd, stop)
		trail = append(trail, rec)
	}
	if d.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
		d.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "outcome",
			slog.String("call_id", call.callID), slog.String("tenant", call.tenant), slog.String("target", it.target),
			slog.String("run_id", call.runID), slog.Uint64("attempt", uint64(it.attempt)),
			slog.Bool("success", it.success), slog.String("classification", class),
			slog.String("final_disposition", fd.String()), slog.String("final_stop_reason", stop.String()))
	}
	return trail
}
