package server

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// Clock tells the time. The daemon uses the wall clock; tests inject a fake.
type Clock interface{ Now() time.Time }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Config configures the services. Zero fields take the defaults named.
type Config struct {
	Clock  Clock          // default: the wall clock
	Rand   func() float64 // random draws in [0,1); default math/rand/v2
	Logger *slog.Logger   // default: slog.Default()
	// Auth, when set, authenticates and authorizes every call; nil
	// leaves every service open (tests, embedding in a trusted process).
	Auth *Auth
	// Shedder, when set, sheds unary calls beyond its cap with
	// RESOURCE_EXHAUSTED.
	Shedder *Shedder
	// Metrics, when set, counts decisions, outcomes and budgets and times
	// every RPC; nil records nothing.
	Metrics *Metrics
	// WatchBuffer is the per-subscriber queue of breaker events; a
	// subscriber that falls further behind is disconnected. Default 1024.
	WatchBuffer int
	// StreamWorkers is the number of goroutines NewGRPC keeps to serve
	// calls (grpc-go's NumStreamWorkers): reused from call to call, they
	// keep the stack a handler grew instead of growing a new goroutine's
	// on every call; a call that finds them all busy gets a goroutine of
	// its own. Default DefaultStreamWorkers; negative: a goroutine per call.
	StreamWorkers int
	// MaxClockSkew is how far after the daemon's clock a call's
	// origin_time may lie; beyond it NextDelay refuses the call with
	// INVALID_ARGUMENT. Default DefaultMaxClockSkew.
	MaxClockSkew time.Duration
	// DeclaredTenants, when set, admits to worker calls only the tenants it
	// reports true for; a call naming another tenant is PERMISSION_DENIED,
	// the same whether or not that tenant has state (--tenants=declared).
	DeclaredTenants func(tenant string) bool
}

// DefaultStreamWorkers is Config.StreamWorkers' default.
const DefaultStreamWorkers = 64

func (c Config) withDefaults() Config {
	if c.Clock == nil {
		c.Clock = wallClock{}
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.WatchBuffer <= 0 {
		c.WatchBuffer = 1024
	}
	if c.StreamWorkers == 0 {
		c.StreamWorkers = DefaultStreamWorkers
	}
	if c.MaxClockSkew <= 0 {
		c.MaxClockSkew = DefaultMaxClockSkew
	}
	return c
}

// Decisions implements RetryPolicyService over a Store. It is safe for
// concurrent use.
type Decisions struct {
	pb.UnimplementedRetryPolicyServiceServer
	store Store
	cfg   Config
}

// NewDecisions returns the worker-facing service.
func NewDecisions(store Store, cfg Config) *Decisions {
	return &Decisions{store: store, cfg: cfg.withDefaults()}
}

// Classify says whether a failure is worth retrying under the policy of the
// call's tenant and target.
func (d *Decisions) Classify(_ context.Context, req *pb.ClassifyRequest) (*pb.ClassifyResponse, error) {
	call, err := checkNamed("call", func(field string) (callRef, error) { return callFromPB(field, req.GetCall(), false) })
	if err != nil {
		return nil, err
	}
	f, err := failureFromPB("failure", req.GetFailure())
	if err != nil {
		return nil, err
	}
	p, _ := d.store.Resolve(call.tenant, call.target)
	c := policy.Classify(&p, f, call.idempotent, call.key != "")
	return &pb.ClassifyResponse{Retryable: c.Retryable, Category: pb.Category(c.Category), Reason: c.Reason}, nil
}

// NextDelay decides after a failed attempt: the stateless rules of policy
// first, then the shared breaker, the fleet-wide cool-down, the deadline
// again, and the tenant and run budgets. A refusal is an OK answer.
func (d *Decisions) NextDelay(ctx context.Context, req *pb.NextDelayRequest) (*pb.NextDelayResponse, error) {
	call, err := checkNamed("call", func(field string) (callRef, error) { return callFromPB(field, req.GetCall(), true) })
	if err != nil {
		return nil, err
	}
	if req.GetAttempt() < 1 || req.GetAttempt() > maxAttempt {
		return nil, invalid("attempt", "must be 1 to "+strconv.Itoa(maxAttempt)+" (the attempt that failed, counting the first as 1)")
	}
	f, err := failureFromPB("failure", req.GetFailure())
	if err != nil {
		return nil, err
	}
	hints, err := checkNamed("pushback", func(field string) (policy.Hints, error) { return hintsFromPB(field, req.GetPushback()) })
	if err != nil {
		return nil, err
	}
	prev, err := duration("previous_delay", req.GetPreviousDelay(), 0)
	if err != nil {
		return nil, err
	}
	if err := checkName("permit_id", req.GetPermitId(), maxCallIDLen, false); err != nil {
		return nil, err
	}

	now := d.cfg.Clock.Now()
	if err := checkOrigin("call.origin_time", call.origin, now, d.cfg.MaxClockSkew); err != nil {
		return nil, err
	}
	p, _ := d.store.Resolve(call.tenant, call.target)
	var run policy.Run
	deadline := call.deadline
	if call.runID != "" {
		if run, err = d.runOf(ctx, "call.run_id", call.runID, call.tenant); err != nil {
			return nil, err
		}
		// The run's cut-off is a deadline for every call of the run.
		eff := policy.EffectiveDeadline(&p, now, call.origin, call.deadline)
		if eff.IsZero() || run.Cutoff.Before(eff) {
			deadline = run.Cutoff
		}
	}
	dec := policy.Decide(&p, policy.Input{
		Attempt: int(req.GetAttempt()), Failure: f,
		Idempotent: call.idempotent, HasIdempotencyKey: call.key != "",
		Hints: hints, PrevDelay: prev,
		Now: now, Origin: call.origin, Deadline: deadline,
		JitterDraw: d.cfg.Rand(), SpreadDraw: d.cfg.Rand(),
	})

	// The breaker learns of every failure; a terminal answer means the
	// upstream is up.
	key := policy.KeyFor(p.Breaker, call.tenant, call.target)
	result := policy.ResultTerminal
	if dec.Class.Category == policy.CategoryTransient {
		result = policy.ResultTransientFailure
	}
	// The changes of this decision are made durable together, at once with
	// --sync=always (one commit, not one per change).
	u := d.store.Begin()
	snap, err := u.Record(key, p.Breaker, result, req.GetPermitId())
	if err != nil {
		return nil, storeError(ctx, d.cfg.Logger, "breaker", err)
	}
	dec.Checks |= policy.CheckBreaker
	note := dec.Hint.Note
	resp := &pb.NextDelayResponse{BreakerState: pb.BreakerState(snap.State)}

	if dec.Retry {
		timeout := (f.Kind == policy.FailureTransport && f.Transport == policy.TransportTimeout) ||
			(f.Kind == policy.FailureGRPC && f.Code == int(codes.DeadlineExceeded))
		if err := d.shared(ctx, u, &dec, &p, key, call, timeout, snap, now, &note, resp); err != nil {
			return nil, err
		}
	}
	if !dec.Retry && !run.Cutoff.IsZero() && !now.Before(run.Cutoff) &&
		dec.Disposition != policy.DispositionFailedTerminal {
		// Past the run's cut-off every stop is a cut.
		dec.Disposition = policy.DispositionDeadlineCut
	}
	if dec.Retry {
		resp.Decision = pb.Decision_DECISION_RETRY
		resp.Delay = durationpb.New(dec.Delay)
		resp.AttemptTimeout = durationPB(dec.AttemptTimeout)
	} else {
		resp.Decision = pb.Decision_DECISION_STOP
		resp.StopReason = pb.StopReason(dec.Stop)
		resp.Disposition = pb.Disposition(dec.Disposition)
	}
	resp.Category = pb.Category(dec.Class.Category)
	resp.Classification = dec.Class.Reason
	resp.PushbackNote = note
	resp.Checks = dec.Checks.Names()
	resp.Detail = detail(&dec, &p)
	d.decided(ctx, u, call, req.GetAttempt(), &dec, resp.GetDetail(), snap.State)
	if err := u.Commit(); err != nil {
		return nil, storeError(ctx, d.cfg.Logger, "decision", err)
	}
	return resp, nil
}

// decided puts a NextDelay answer in the audit trail, the metrics and the
// debug log.
func (d *Decisions) decided(ctx context.Context, u policy.Unit, call callRef, attempt uint32, dec *policy.Decision, why string, breaker policy.BreakerState) {
	verdict := policy.VerdictStop
	if dec.Retry {
		verdict = policy.VerdictRetry
	}
	u.AppendAudit(policy.AuditRecord{
		Event: policy.AuditDecision, Tenant: call.tenant, Target: call.target, CallID: call.callID, RunID: call.runID,
		Attempt: attempt, Classification: dec.Class.Reason, Verdict: verdict, Delay: dec.Delay,
		Stop: dec.Stop, Disposition: dec.Disposition, Detail: why,
	})
	d.cfg.Metrics.decision(call.target, dec.Retry, dec.Stop, dec.Disposition)
	if d.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
		d.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "decision",
			slog.String("call_id", call.callID), slog.String("tenant", call.tenant), slog.String("target", call.target),
			slog.String("run_id", call.runID), slog.Uint64("attempt", uint64(attempt)),
			slog.String("classification", dec.Class.Reason), slog.String("decision", verdict.String()),
			slog.Duration("delay", dec.Delay), slog.String("stop_reason", dec.Stop.String()),
			slog.String("disposition", dec.Disposition.String()), slog.String("breaker", breaker.String()),
			slog.String("detail", why))
	}
}

// shared applies the fleet-wide rules to a decision the stateless rules let
// through: an open breaker, a cool-down another worker reported, the deadline
// once more, and the budgets. It turns dec into a stop when one refuses, and
// returns an error only when a cap stops the store from answering.
func (d *Decisions) shared(ctx context.Context, u policy.Unit, dec *policy.Decision, p *policy.Policy, key policy.BreakerKey,
	call callRef, timeout bool, snap policy.BreakerSnapshot, now time.Time, note *string, resp *pb.NextDelayResponse) error {
	stop := func(r policy.StopReason, disp policy.Disposition) {
		dec.Retry, dec.Delay, dec.Stop, dec.Disposition = false, 0, r, disp
	}
	if snap.State == policy.BreakerOpen {
		stop(policy.StopCircuitOpen, policy.DispositionCircuitOpen)
		return nil
	}
	cooldown := snap.CooldownUntil
	if dec.Hint.Present && dec.Hint.Delay > 0 {
		h := min(dec.Hint.Delay, p.Pushback.MaxHint)
		if until, err := u.ExtendCooldown(key, p.Breaker, now.Add(h)); err == nil {
			cooldown = until
		} else {
			d.cfg.Logger.WarnContext(ctx, "cool-down not shared", "call_id", call.callID, "tenant", call.tenant,
				"target", call.target, "err", err)
		}
	}
	if wait := cooldown.Sub(now); wait > dec.Delay {
		// Another worker was told to back off: wait with it, spread out.
		dec.Delay = policy.SpreadHint(p.Pushback, wait, d.cfg.Rand())
		if *note != "" {
			*note += ","
		}
		*note += "cooldown:fleet"
	}
	if !policy.FitsDeadline(now, dec.Deadline, dec.Delay, p.AttemptTimeout) {
		stop(policy.StopDeadline, policy.DispositionDeadlineCut)
		return nil
	}
	dec.Checks |= policy.CheckTenantBudget
	if call.runID != "" {
		dec.Checks |= policy.CheckRunBudget
	}
	spend, err := u.SpendRetry(policy.SpendRequest{
		Tenant:  call.tenant,
		Timeout: timeout,
		RunID:   call.runID,
	})
	if errors.Is(err, policy.ErrCapacity) {
		return storeError(ctx, d.cfg.Logger, "budget", err) // a cap: the operator must hear of it
	}
	if err != nil {
		// The budget could not be consulted: stop rather than retry blind.
		d.cfg.Logger.ErrorContext(ctx, "budget unavailable", "call_id", call.callID, "tenant", call.tenant,
			"target", call.target, "err", err)
		stop(policy.StopBudgetExhausted, policy.DispositionDeadLetter)
		return nil
	}
	d.cfg.Metrics.tokens(call.tenant, spend.TenantTokens)
	resp.TenantBudgetRemaining = spend.TenantTokens
	resp.RunBudgetRemaining = spend.RunRemaining
	if !spend.Granted {
		stop(spend.Stop, spend.Disposition)
	}
	return nil
}

// runOf returns run id for tenant. Another tenant's run is NOT_FOUND, with
// the very message of a run that does not exist, so a caller cannot learn
// which run ids other tenants use.
func (d *Decisions) runOf(ctx context.Context, field, id, tenant string) (policy.Run, error) {
	r, err := d.store.Run(id)
	if err == nil && r.Tenant == tenant {
		return r, nil
	}
	if err == nil || errors.Is(err, policy.ErrNotFound) {
		return policy.Run{}, status.Error(codes.NotFound, field+": run "+strconv.Quote(id)+" not found for tenant "+strconv.Quote(tenant))
	}
	return policy.Run{}, storeError(ctx, d.cfg.Logger, field, err)
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

// ReportOutcome records a batch of outcomes. The batch is validated whole
// before anything is applied, so a bad entry loses nothing.
func (d *Decisions) ReportOutcome(ctx context.Context, req *pb.ReportOutcomeRequest) (*pb.ReportOutcomeResponse, error) {
	outs := req.GetOutcomes()
	if len(outs) == 0 || len(outs) > maxOutcomes {
		return nil, invalid("outcomes", "must hold 1 to "+strconv.Itoa(maxOutcomes)+" outcomes, got "+strconv.Itoa(len(outs)))
	}
	sc := outcomeScratchPool.Get().(*outcomeScratch)
	ups := slices.Grow(sc.ups[:0], len(outs))[:len(outs)]
	trail := slices.Grow(sc.trail[:0], 2*len(outs)) // at most two records an outcome
	defer func() { sc.ups, sc.trail = ups, trail; sc.put() }()
	var runs map[string]string
	deposits := map[string]int{}
	for i, o := range outs {
		it, err := outcomeFromPB("", o)
		if err != nil {
			// Only now build the field's path, checking again under it: a
			// valid batch of a thousand outcomes builds no paths at all.
			_, err = outcomeFromPB("outcomes["+strconv.Itoa(i)+"]", o)
			return nil, err
		}
		p, _ := d.store.Resolve(it.call.tenant, it.call.target)
		u := &ups[i]
		*u = policy.OutcomeUpdate{
			Key: policy.KeyFor(p.Breaker, it.call.tenant, it.call.target), Breaker: p.Breaker, PermitID: o.GetPermitId(),
		}
		var class string
		switch {
		case o.GetSuccess():
			deposits[it.call.tenant]++
			u.Result = policy.ResultSuccess
		case !o.GetAlreadyRecorded():
			c := policy.Classify(&p, it.failure, true, true)
			u.Result = policy.ResultTerminal
			if c.Category == policy.CategoryTransient {
				u.Result = policy.ResultTransientFailure
			}
			class = c.Reason
		}
		start := len(trail)
		trail = d.outcome(ctx, trail, it.call, o, class)
		u.Audit = trail[start:len(trail):len(trail)]
		if fd := o.GetFinalDisposition(); fd != pb.Disposition_DISPOSITION_UNSPECIFIED && it.call.runID != "" {
			u.RunID, u.CallID = it.call.runID, it.call.callID
			u.Final, u.Stop = policy.Disposition(fd), policy.StopReason(o.GetFinalStopReason())
			if runs == nil {
				runs = map[string]string{}
			}
			runs[it.call.runID] = it.call.tenant
		}
	}
	for id, tenant := range runs {
		if _, err := d.runOf(ctx, "outcomes.call.run_id", id, tenant); err != nil {
			return nil, err
		}
	}

	// Nothing is applied before the whole batch is valid. The store applies
	// it as a whole: with --sync=always that is one commit for the request,
	// not one per outcome.
	n, err := d.store.ApplyOutcomes(ups, deposits)
	d.cfg.Metrics.successes(outs[:n])
	if err != nil {
		return nil, storeError(ctx, d.cfg.Logger, "outcomes", err)
	}
	return &pb.ReportOutcomeResponse{Accepted: uint32(len(outs))}, nil
}

// outcomeScratch is ReportOutcome's working memory, reused from request to
// request: a batch of a thousand outcomes needs a few hundred KB of it,
// which the store copies what it keeps from.
type outcomeScratch struct {
	ups   []policy.OutcomeUpdate
	trail []policy.AuditRecord
}

var outcomeScratchPool = sync.Pool{New: func() any { return new(outcomeScratch) }}

// put returns sc to the pool, cleared so it pins no request's strings.
func (sc *outcomeScratch) put() {
	clear(sc.ups)
	clear(sc.trail)
	sc.ups, sc.trail = sc.ups[:0], sc.trail[:0]
	outcomeScratchPool.Put(sc)
}

// outcomeItem is a validated Outcome's call and failure.
type outcomeItem struct {
	call    callRef
	failure policy.Failure
}

// outcomeFromPB validates one Outcome; field is its path in the request.
func outcomeFromPB(field string, o *pb.Outcome) (outcomeItem, error) {
	var it outcomeItem
	call, err := callFromPB(sub(field, ".call"), o.GetCall(), true)
	if err != nil {
		return it, err
	}
	if o.GetAttempt() < 1 || o.GetAttempt() > maxAttempt {
		return it, invalid(field+".attempt", "must be 1 to "+strconv.Itoa(maxAttempt))
	}
	if _, err := duration(sub(field, ".latency"), o.GetLatency(), 0); err != nil {
		return it, err
	}
	if err := checkName(sub(field, ".permit_id"), o.GetPermitId(), maxCallIDLen, false); err != nil {
		return it, err
	}
	it.call = call
	if !o.GetSuccess() && !o.GetAlreadyRecorded() {
		if it.failure, err = failureFromPB(sub(field, ".failure"), o.GetFailure()); err != nil {
			return it, err
		}
	}
	fd := o.GetFinalDisposition()
	if fd < 0 || fd > pb.Disposition_DISPOSITION_CIRCUIT_OPEN {
		return it, invalid(field+".final_disposition", "must be a known Disposition value")
	}
	if sr := o.GetFinalStopReason(); sr < 0 || sr > pb.StopReason_STOP_REASON_SERVER_PUSHBACK {
		return it, invalid(field+".final_stop_reason", "must be a known StopReason value")
	}
	if o.GetSuccess() && fd != pb.Disposition_DISPOSITION_UNSPECIFIED && fd != pb.Disposition_DISPOSITION_SUCCEEDED {
		return it, invalid(field+".final_disposition", "must be SUCCEEDED or unset when success is true")
	}
	return it, nil
}

// outcome appends a reported outcome, and the call's final disposition when
// it carries one (with or without a run), to trail and logs it at debug
// level. class is the failure's classification, when it was classified. A
// success that ends its call (the common outcome by far) is one FINAL
// record, which says both.
func (d *Decisions) outcome(ctx context.Context, trail []policy.AuditRecord, call callRef, o *pb.Outcome, class string) []policy.AuditRecord {
	why := "attempt failed"
	switch {
	case o.GetSuccess():
		why = "attempt succeeded"
	case o.GetAlreadyRecorded():
		why = "attempt failed (recorded by NextDelay)"
	}
	// The latency is kept in Delay, not formatted into the detail here:
	// QueryAudit writes it out (auditRecordToPB), once per record read
	// rather than once per outcome reported.
	rec := policy.AuditRecord{
		Event: policy.AuditOutcome, Tenant: call.tenant, Target: call.target, CallID: call.callID, RunID: call.runID,
		Attempt: o.GetAttempt(), Classification: class, Detail: why, Delay: max(o.GetLatency().AsDuration(), 0),
	}
	fd, stop := policy.Disposition(o.GetFinalDisposition()), policy.StopReason(o.GetFinalStopReason())
	if o.GetSuccess() && fd == policy.DispositionSucceeded {
		rec.Event, rec.Disposition = policy.AuditFinal, fd
	}
	trail = append(trail, rec)
	if fd != policy.DispositionNone && !o.GetSuccess() {
		rec.Event, rec.Classification, rec.Disposition, rec.Stop = policy.AuditFinal, "", fd, stop
		rec.Delay, rec.Detail = 0, finalDetail(fd, stop)
		trail = append(trail, rec)
	}
	if d.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
		d.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "outcome",
			slog.String("call_id", call.callID), slog.String("tenant", call.tenant), slog.String("target", call.target),
			slog.String("run_id", call.runID), slog.Uint64("attempt", uint64(o.GetAttempt())),
			slog.Bool("success", o.GetSuccess()), slog.String("classification", class),
			slog.String("final_disposition", fd.String()), slog.String("final_stop_reason", stop.String()))
	}
	return trail
}

// finalDetails are the details of FINAL records, by disposition and stop
// reason, made once rather than for every call that ends.
var finalDetails = func() (t [policy.DispositionCircuitOpen + 1][policy.StopServerPushback + 1]string) {
	for fd := range t {
		for stop := range t[fd] {
			t[fd][stop] = "final disposition " + policy.Disposition(fd).String()
			if policy.StopReason(stop) != policy.StopNone {
				t[fd][stop] += " (" + policy.StopReason(stop).String() + ")"
			}
		}
	}
	return t
}()

// finalDetail is the detail of a FINAL record.
func finalDetail(fd policy.Disposition, stop policy.StopReason) string {
	if int(fd) < len(finalDetails) && int(stop) < len(finalDetails[fd]) {
		return finalDetails[fd][stop]
	}
	return "final disposition " + fd.String() + " (" + stop.String() + ")"
}

// Admit asks the shared breaker whether an attempt may go ahead.
func (d *Decisions) Admit(ctx context.Context, req *pb.AdmitRequest) (*pb.AdmitResponse, error) {
	call, err := checkNamed("call", func(field string) (callRef, error) { return callFromPB(field, req.GetCall(), false) })
	if err != nil {
		return nil, err
	}
	if req.GetAttempt() > maxAttempt {
		return nil, invalid("attempt", "must be at most "+strconv.Itoa(maxAttempt))
	}
	p, _ := d.store.Resolve(call.tenant, call.target)
	a, err := d.store.Admit(policy.KeyFor(p.Breaker, call.tenant, call.target), p.Breaker)
	if err != nil {
		return nil, storeError(ctx, d.cfg.Logger, "breaker", err)
	}
	if !a.Admitted {
		why := "refused: " + a.Reason
		if a.RetryAfter > 0 {
			why += ", ask again in " + a.RetryAfter.String()
		}
		d.store.AppendAudit(policy.AuditRecord{
			Event: policy.AuditAdmit, Tenant: call.tenant, Target: call.target, CallID: call.callID, RunID: call.runID,
			Attempt: req.GetAttempt(), Detail: why,
		})
		if d.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
			d.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "admission refused",
				slog.String("call_id", call.callID), slog.String("tenant", call.tenant), slog.String("target", call.target),
				slog.Uint64("attempt", uint64(req.GetAttempt())), slog.String("breaker", a.State.String()),
				slog.String("reason", a.Reason), slog.Duration("retry_after", a.RetryAfter))
		}
	}
	return &pb.AdmitResponse{
		Admitted: a.Admitted, State: pb.BreakerState(a.State), PermitId: a.PermitID,
		RetryAfter: durationPB(a.RetryAfter), Reason: a.Reason,
	}, nil
}

// WatchBreakers streams the current breaker states, then every change,
// until the client goes away. A client that falls behind is disconnected
// with UNAVAILABLE and resumes with a fresh snapshot when it reconnects.
func (d *Decisions) WatchBreakers(req *pb.WatchBreakersRequest, stream grpc.ServerStreamingServer[pb.WatchBreakersResponse]) error {
	if err := checkName("tenant", req.GetTenant(), maxTenantLen, false); err != nil {
		return err
	}
	events, cancel := d.store.Subscribe(req.GetTenant(), d.cfg.WatchBuffer)
	defer cancel()
	ctx := stream.Context()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-events:
			if !ok {
				return status.Error(codes.Unavailable, "breaker watch fell behind or policyd is stopping; reconnect for a fresh snapshot")
			}
			msg := &pb.WatchBreakersResponse{SnapshotComplete: true}
			if !ev.SnapshotDone {
				msg = &pb.WatchBreakersResponse{Breaker: breakerToPB(ev.Snapshot), Snapshot: ev.Initial}
			}
			if err := stream.Send(msg); err != nil {
				return err
			}
		}
	}
}

// PlanBudget fits retries into a window, offline.
func (d *Decisions) PlanBudget(_ context.Context, req *pb.PlanBudgetRequest) (*pb.PlanBudgetResponse, error) {
	in, hops, err := planInputFromPB(req)
	if err != nil {
		return nil, err
	}
	if in, err = d.planRemaining(req, in); err != nil {
		return nil, err
	}
	if hops <= 1 {
		plan, err := policy.PlanBudget(in)
		if err != nil {
			return nil, invalidFrom("", err)
		}
		return &pb.PlanBudgetResponse{Plan: planToPB(plan)}, nil
	}
	plans, err := policy.SplitHops(in, hops)
	if err != nil {
		return nil, invalidFrom("", err)
	}
	resp := &pb.PlanBudgetResponse{Plan: planToPB(plans[0])}
	for _, p := range plans {
		resp.Hops = append(resp.Hops, planToPB(p))
	}
	return resp, nil
}

func planInputFromPB(req *pb.PlanBudgetRequest) (policy.PlanInput, int, error) {
	var in policy.PlanInput
	var err error
	if req.GetWindow() == nil {
		return in, 0, invalid("window", "is required")
	}
	if in.Window, err = duration("window", req.GetWindow(), 0); err != nil {
		return in, 0, err
	}
	if in.Backoff, err = backoffFromPB("backoff", req.GetBackoff(), policy.Default().Backoff); err != nil {
		return in, 0, err
	}
	if in.AttemptTimeout, err = duration("attempt_timeout", req.GetAttemptTimeout(), 0); err != nil {
		return in, 0, err
	}
	if in.TTLMargin, err = duration("ttl_margin", req.GetTtlMargin(), 0); err != nil {
		return in, 0, err
	}
	if req.MaxAttempts != nil {
		if req.GetMaxAttempts() < 1 || req.GetMaxAttempts() > 100 {
			return in, 0, invalid("max_attempts", "must be 1 to 100")
		}
		in.MaxAttempts = int(req.GetMaxAttempts())
	}
	if req.GetHops() > 16 {
		return in, 0, invalid("hops", "must be at most 16")
	}
	if err := in.Validate(); err != nil {
		return in, 0, invalidFrom("", err)
	}
	return in, int(req.GetHops()), nil
}
