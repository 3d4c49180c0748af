package policy

import (
	"math"
	"strconv"
	"time"
)

// FieldError reports a field that breaks a rule. Field is the field's path as
// the API spells it (e.g. "backoff.factor") and Rule the rule it breaks
// (e.g. "must be > 1").
type FieldError struct {
	Field string
	Rule  string
}

// Error returns Field + ": " + Rule.
func (e *FieldError) Error() string { return e.Field + ": " + e.Rule }

// Unwrap returns ErrInvalid, so that errors.Is(err, ErrInvalid) holds for
// every FieldError.
func (e *FieldError) Unwrap() error { return ErrInvalid }

func fieldErr(field, rule string) error { return &FieldError{Field: field, Rule: rule} }

// checkFloat returns the rule a NaN or infinite v breaks, or "".
func checkFloat(v float64) string {
	switch {
	case math.IsNaN(v):
		return "must be a finite number, not NaN"
	case math.IsInf(v, 1):
		return "must be a finite number, not +Inf"
	case math.IsInf(v, -1):
		return "must be a finite number, not -Inf"
	}
	return ""
}

func itoa(v int) string { return strconv.Itoa(v) }

// validateBackoff checks b; its jitter only when checkJitter is set.
func validateBackoff(b Backoff, checkJitter bool) error {
	switch {
	case b.Base <= 0:
		return fieldErr("backoff.base_delay", "must be > 0")
	case b.Max < b.Base:
		return fieldErr("backoff.max_delay", "must be >= backoff.base_delay")
	}
	if r := checkFloat(b.Factor); r != "" {
		return fieldErr("backoff.factor", r)
	}
	switch {
	case b.Factor <= 1:
		return fieldErr("backoff.factor", "must be > 1")
	case b.Factor > 100:
		return fieldErr("backoff.factor", "must be <= 100")
	case checkJitter && b.Jitter > JitterDecorrelated:
		return fieldErr("backoff.jitter", "must be a known value, not "+itoa(int(b.Jitter)))
	}
	return nil
}

func validateCodes(field string, codes []int, lo, hi int) error {
	for _, c := range codes {
		if c < lo || c > hi {
			return fieldErr(field, "code "+itoa(c)+" must be between "+itoa(lo)+" and "+itoa(hi))
		}
	}
	return nil
}

// Validate checks a complete policy, with defaults already filled, and
// returns the first rule broken as a *FieldError naming the field by its API
// path, or nil. Unspecified enum values are accepted: they select the
// defaults. NaN and infinite numbers are always rejected.
func (p *Policy) Validate() error {
	if p == nil {
		return fieldErr("policy", "must be set")
	}
	if err := validateBackoff(p.Backoff, true); err != nil {
		return err
	}
	pb := p.Pushback
	if pb.Mode > RetryAfterOverride {
		return fieldErr("pushback.mode", "must be a known value, not "+itoa(int(pb.Mode)))
	}
	if r := checkFloat(pb.SpreadRatio); r != "" {
		return fieldErr("pushback.spread_ratio", r)
	}
	switch {
	case pb.SpreadRatio < 0 || pb.SpreadRatio > 1:
		return fieldErr("pushback.spread_ratio", "must be between 0 and 1")
	case pb.MinSpread < 0:
		return fieldErr("pushback.min_spread", "must be >= 0")
	case pb.MaxHint <= 0:
		return fieldErr("pushback.max_hint", "must be > 0")
	case p.MaxAttempts < 1 || p.MaxAttempts > maxAttemptsCap:
		return fieldErr("max_attempts", "must be between 1 and 100")
	case p.AttemptTimeout < 0:
		return fieldErr("attempt_timeout", "must be >= 0")
	case p.CallDeadline < 0:
		return fieldErr("call_deadline", "must be >= 0")
	}
	if d := p.CallDeadline; d > 0 {
		switch {
		case p.Backoff.Base > d:
			return fieldErr("backoff.base_delay", "must not exceed call_deadline")
		case p.Backoff.Max > d:
			return fieldErr("backoff.max_delay", "must not exceed call_deadline")
		case p.AttemptTimeout > d:
			return fieldErr("attempt_timeout", "must not exceed call_deadline")
		}
	}
	if ttl := p.IdempotencyTTL; ttl != 0 {
		if need := p.Schedule(); ttl < need {
			return fieldErr("idempotency_ttl", "must be at least the policy's schedule ("+need.String()+
				"): a record must outlive every retry of its call, got "+ttl.String())
		}
	}
	if err := validateCodes("transient_http_statuses", p.TransientHTTP, httpFirst, httpLast); err != nil {
		return err
	}
	if err := validateCodes("terminal_http_statuses", p.TerminalHTTP, httpFirst, httpLast); err != nil {
		return err
	}
	for _, c := range p.TerminalHTTP {
		if containsCode(p.TransientHTTP, c) {
			return fieldErr("terminal_http_statuses", "code "+itoa(c)+" must not also be in transient_http_statuses")
		}
	}
	if err := validateCodes("transient_grpc_codes", p.TransientGRPC, 1, grpcLast); err != nil {
		return err
	}
	if err := validateBreaker(p.Breaker); err != nil {
		return err
	}
	if err := validateFallback(p); err != nil {
		return err
	}
	return validateFlow(p.Flow)
}

func validateFlow(f FlowConfig) error {
	switch {
	case f.MaxInFlight < 0 || f.MaxInFlight > MaxCeiling:
		return fieldErr("flow.max_in_flight", "must be between 1 and "+itoa(MaxCeiling))
	case f.LeaseSlack < 0:
		return fieldErr("flow.lease_slack", "must be >= 0")
	}
	if r := checkFloat(f.MaxRate); r != "" {
		return fieldErr("flow.max_rate", r)
	}
	switch {
	case f.MaxRate < 0 || f.MaxRate > 1e9:
		return fieldErr("flow.max_rate", "must be > 0 and at most 1e9 per second")
	case f.Burst < 0 || f.Burst > MaxCeiling:
		return fieldErr("flow.burst", "must be between 1 and "+itoa(MaxCeiling))
	}
	return validateAdaptive(f)
}

// maxAdaptiveHold is the longest hold between two decreases of an
// adaptive ceiling.
const maxAdaptiveHold = time.Hour

// validateAdaptive checks f's adaptive ceiling against its max_in_flight;
// zero fields take their defaults.
func validateAdaptive(f FlowConfig) error {
	a := f.Adaptive
	if !a.Enabled {
		return nil
	}
	if r := checkFloat(a.Decrease); r != "" {
		return fieldErr("flow.adaptive.decrease", r)
	}
	if r := checkFloat(a.Increase); r != "" {
		return fieldErr("flow.adaptive.increase", r)
	}
	switch {
	case f.MaxInFlight == 0:
		return fieldErr("flow.adaptive", "requires flow.max_in_flight, the ceiling's maximum and start")
	case a.Min < 0 || a.Min > f.MaxInFlight:
		return fieldErr("flow.adaptive.min_in_flight", "must be 1 to flow.max_in_flight ("+itoa(f.MaxInFlight)+")")
	case a.Decrease < 0 || a.Decrease >= 1:
		return fieldErr("flow.adaptive.decrease", "must be above 0 and below 1")
	case a.Increase < 0 || a.Increase > float64(f.MaxInFlight):
		return fieldErr("flow.adaptive.increase", "must be above 0 and at most flow.max_in_flight ("+itoa(f.MaxInFlight)+")")
	case a.Hold < 0 || a.Hold > maxAdaptiveHold:
		return fieldErr("flow.adaptive.hold", "must be 0 to 1h")
	}
	return nil
}

func validateBreaker(b BreakerConfig) error {
	switch {
	case b.Mode > BreakerFailureRate:
		return fieldErr("breaker.mode", "must be a known value, not "+itoa(int(b.Mode)))
	case b.Scope > ScopeTarget:
		return fieldErr("breaker.scope", "must be a known value, not "+itoa(int(b.Scope)))
	case b.ConsecutiveFailures < 1 || b.ConsecutiveFailures > 10000:
		return fieldErr("breaker.consecutive_failures", "must be between 1 and 10000")
	}
	if r := checkFloat(b.FailureRate); r != "" {
		return fieldErr("breaker.failure_rate", r)
	}
	switch {
	case b.FailureRate <= 0 || b.FailureRate > 1:
		return fieldErr("breaker.failure_rate", "must be > 0 and <= 1")
	case b.Window <= 0:
		return fieldErr("breaker.window", "must be > 0")
	case b.MinCalls < 1:
		return fieldErr("breaker.min_calls", "must be >= 1")
	case b.Cooldown <= 0:
		return fieldErr("breaker.cooldown", "must be > 0")
	case b.HalfOpenProbes < 1 || b.HalfOpenProbes > 1000:
		return fieldErr("breaker.half_open_probes", "must be between 1 and 1000")
	case b.ProbeTimeout <= 0:
		return fieldErr("breaker.probe_timeout", "must be > 0")
	}
	return nil
}

// maxAttemptsCap is the largest attempt count a policy or plan may ask for.
const maxAttemptsCap = 100

// Validate checks a plan request and returns the first rule broken as a
// *FieldError, or nil: window > 0; the backoff as for a policy, with base and
// max delay not exceeding the window; attempt_timeout >= 0; ttl_margin >= 0
// and small enough that window + ttl_margin (the default one when 0) is a
// Duration; max_attempts 0 (meaning 100) to 100; reserve in [0, 1); Now set
// when Origin is. The backoff's jitter is not checked: plans use nominal
// delays and ignore it.
func (in PlanInput) Validate() error {
	if in.Window <= 0 {
		return fieldErr("window", "must be > 0")
	}
	if err := validateBackoff(in.Backoff, false); err != nil {
		return err
	}
	switch {
	case in.Backoff.Base > in.Window:
		return fieldErr("backoff.base_delay", "must not exceed window")
	case in.Backoff.Max > in.Window:
		return fieldErr("backoff.max_delay", "must not exceed window")
	case in.AttemptTimeout < 0:
		return fieldErr("attempt_timeout", "must be >= 0")
	case in.TTLMargin < 0:
		return fieldErr("ttl_margin", "must be >= 0")
	case in.TTLMargin > maxDuration-in.Window:
		return fieldErr("ttl_margin", "must not make window + ttl_margin overflow a duration")
	case in.TTLMargin == 0 && DefaultTTLMargin(in.Window, in.AttemptTimeout) > maxDuration-in.Window:
		return fieldErr("window", "too long for window + the default ttl_margin to be a duration; give ttl_margin")
	case in.MaxAttempts < 0 || in.MaxAttempts > maxAttemptsCap:
		return fieldErr("max_attempts", "must be between 0 and 100")
	case !(in.Reserve >= 0 && in.Reserve < 1): // NaN fails both
		return fieldErr("reserve", "must be in [0, 1)")
	case !in.Origin.IsZero() && in.Now.IsZero():
		return fieldErr("origin_time", "needs the time of planning (Now)")
	}
	return nil
}
