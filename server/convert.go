package server

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/fleet"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// This file is the only place where protobuf types meet domain types.

// Limits on names and sizes in requests.
const (
	maxTenantLen = 128
	maxTargetLen = 256
	maxCallIDLen = 128
	maxKeyLen    = 256
	maxRunIDLen  = 128
	maxDescLen   = 1024
	maxHeaderLen = 256
	maxAttempt   = 10000
	// maxPolicyAttempts is the largest max_attempts a policy takes (the cap
	// policy.Policy.Validate applies), checked here first so the message
	// and the check agree.
	maxPolicyAttempts = 100
	maxPageSize       = 1000
	maxOutcomes       = 1000
	maxTableLen       = 64
	defaultPage       = 100
	maxDurationSec    = 10 * 365 * 24 * 3600 // ten years
)

// checkName validates an identifier: at most max bytes of valid UTF-8,
// following the rules of nameRule (no control characters: NUL separates key
// parts in the store).
func checkName(field, v string, max int, required bool) error {
	if v == "" {
		if required {
			return invalid(field, "is required")
		}
		return nil
	}
	if len(v) > max {
		return invalid(field, "must be at most "+strconv.Itoa(max)+" bytes, got "+strconv.Itoa(len(v)))
	}
	if printableASCII(v) {
		// The usual name, checked without decoding runes.
		if v[0] == ' ' || v[len(v)-1] == ' ' {
			return invalid(field, ruleEdgeSpace)
		}
		return nil
	}
	if !utf8.ValidString(v) {
		return invalid(field, "must be valid UTF-8")
	}
	if rule := nameRule(v); rule != "" {
		return invalid(field, rule)
	}
	return nil
}

// printableASCII reports whether v is ASCII without control characters.
func printableASCII(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c >= 0x7f {
			return false
		}
	}
	return true
}

// checkText validates free text: valid UTF-8, at most max bytes.
func checkText(field, v string, max int) error {
	if len(v) > max {
		return invalid(field, "must be at most "+strconv.Itoa(max)+" bytes, got "+strconv.Itoa(len(v)))
	}
	if !utf8.ValidString(v) {
		return invalid(field, "must be valid UTF-8")
	}
	return nil
}

// duration converts an optional non-negative Duration; nil gives def.
func duration(field string, d *durationpb.Duration, def time.Duration) (time.Duration, error) {
	if d == nil {
		return def, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalid(field, "must be a valid duration")
	}
	if d.GetSeconds() < 0 || d.GetNanos() < 0 {
		return 0, invalid(field, "must not be negative")
	}
	if d.GetSeconds() > maxDurationSec {
		return 0, invalid(field, "must be at most ten years")
	}
	return d.AsDuration(), nil
}

// timestamp converts an optional Timestamp; nil gives the zero time.
func timestamp(field string, t *timestamppb.Timestamp) (time.Time, error) {
	if t == nil {
		return time.Time{}, nil
	}
	if err := t.CheckValid(); err != nil {
		return time.Time{}, invalid(field, "must be a valid timestamp")
	}
	return t.AsTime(), nil
}

// finite checks an optional float: present values must be finite.
func finite(field string, v float64) error {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return invalid(field, "must be a finite number")
	}
	return nil
}

// durationPB converts a span, nil for zero.
func durationPB(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// timePB converts an instant, nil for the zero time.
func timePB(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// sub is the path of field's child name. While field is "" it is "" too:
// the hot handlers check a request first without paths, so a valid one
// builds no strings, and check again under the real path only to name a
// failure (see checkNamed).
func sub(field, name string) string {
	if field == "" {
		return ""
	}
	return field + name
}

// checkNamed runs check without a field path and, only when it fails, again
// under path, so the error names the field.
func checkNamed[T any](path string, check func(field string) (T, error)) (T, error) {
	v, err := check("")
	if err != nil {
		_, err = check(path)
	}
	return v, err
}

// callRef is a validated CallRef.
type callRef struct {
	tenant, target, callID, key, runID string
	triageRef                          string
	idempotent                         bool
	origin, deadline                   time.Time
}

// callFromPB validates a CallRef. call_id is required when needCallID.
func callFromPB(field string, c *pb.CallRef, needCallID bool) (callRef, error) {
	if c == nil {
		return callRef{}, invalid(field, "is required")
	}
	var out callRef
	var err error
	if err = checkName(sub(field, ".tenant"), c.GetTenant(), maxTenantLen, true); err != nil {
		return out, err
	}
	if err = checkName(sub(field, ".target"), c.GetTarget(), maxTargetLen, true); err != nil {
		return out, err
	}
	if err = checkName(sub(field, ".call_id"), c.GetCallId(), maxCallIDLen, needCallID); err != nil {
		return out, err
	}
	if err = checkText(sub(field, ".idempotency_key"), c.GetIdempotencyKey(), maxKeyLen); err != nil {
		return out, err
	}
	if err = checkName(sub(field, ".run_id"), c.GetRunId(), maxRunIDLen, false); err != nil {
		return out, err
	}
	if err = checkText(sub(field, ".triage_ref"), c.GetTriageRef(), policy.MaxTriageRefLen); err != nil {
		return out, err
	}
	if out.origin, err = timestamp(sub(field, ".origin_time"), c.GetOriginTime()); err != nil {
		return out, err
	}
	if out.deadline, err = timestamp(sub(field, ".deadline_time"), c.GetDeadlineTime()); err != nil {
		return out, err
	}
	if !out.origin.IsZero() && !out.deadline.IsZero() && out.deadline.Before(out.origin) {
		return out, invalid(field+".deadline_time", "must not be before origin_time")
	}
	out.tenant, out.target, out.callID = c.GetTenant(), c.GetTarget(), c.GetCallId()
	out.key, out.runID, out.idempotent = c.GetIdempotencyKey(), c.GetRunId(), c.GetIdempotent()
	out.triageRef = c.GetTriageRef()
	return out, nil
}

// failureFromPB validates a Failure: exactly one kind, in range.
func failureFromPB(field string, f *pb.Failure) (policy.Failure, error) {
	if f == nil {
		return policy.Failure{}, invalid(field, "is required")
	}
	switch k := f.GetKind().(type) {
	case *pb.Failure_HttpStatus:
		if k.HttpStatus < 100 || k.HttpStatus > 599 {
			return policy.Failure{}, invalid(field+".http_status", "must be 100 to 599, got "+strconv.FormatUint(uint64(k.HttpStatus), 10))
		}
		return policy.Failure{Kind: policy.FailureHTTP, Code: int(k.HttpStatus)}, nil
	case *pb.Failure_GrpcCode:
		if k.GrpcCode < 1 || k.GrpcCode > 16 {
			return policy.Failure{}, invalid(field+".grpc_code", "must be 1 to 16 (OK is not a failure), got "+strconv.FormatUint(uint64(k.GrpcCode), 10))
		}
		return policy.Failure{Kind: policy.FailureGRPC, Code: int(k.GrpcCode)}, nil
	case *pb.Failure_TransportError:
		t, err := enumFromPB[policy.TransportKind](field, ".transport_error", k.TransportError, false)
		if err != nil {
			return policy.Failure{}, err
		}
		return policy.Failure{Kind: policy.FailureTransport, Transport: t}, nil
	case *pb.Failure_LocalError:
		l, err := enumFromPB[policy.LocalKind](field, ".local_error", k.LocalError, false)
		if err != nil {
			return policy.Failure{}, err
		}
		return policy.Failure{Kind: policy.FailureLocal, Local: l}, nil
	}
	return policy.Failure{}, invalid(field, "must set exactly one of http_status, grpc_code, transport_error, local_error")
}

// hintsFromPB validates raw pushback headers (their syntax is policy's job;
// here only their size and encoding).
func hintsFromPB(field string, p *pb.Pushback) (policy.Hints, error) {
	h := policy.Hints{
		RetryAfter:      p.GetRetryAfter(),
		GRPCPushbackMs:  p.GetGrpcRetryPushbackMs(),
		XRateLimitReset: p.GetXRatelimitReset(),
		XAmzRetryAfter:  p.GetXAmzRetryAfter(),
	}
	for _, v := range []struct{ name, val string }{
		{"retry_after", h.RetryAfter}, {"grpc_retry_pushback_ms", h.GRPCPushbackMs},
		{"x_ratelimit_reset", h.XRateLimitReset}, {"x_amz_retry_after", h.XAmzRetryAfter},
	} {
		if err := checkText(sub(field, "."+v.name), v.val, maxHeaderLen); err != nil {
			return h, err
		}
	}
	return h, nil
}

// backoffFromPB overlays b on def.
func backoffFromPB(field string, b *pb.BackoffSettings, def policy.Backoff) (policy.Backoff, error) {
	out := def
	var err error
	if b == nil {
		return out, nil
	}
	if out.Base, err = duration(field+".base_delay", b.GetBaseDelay(), def.Base); err != nil {
		return out, err
	}
	if out.Max, err = duration(field+".max_delay", b.GetMaxDelay(), def.Max); err != nil {
		return out, err
	}
	if b.Factor != nil {
		if err = finite(field+".factor", b.GetFactor()); err != nil {
			return out, err
		}
		out.Factor = b.GetFactor()
	}
	if j := b.GetJitter(); j != pb.Jitter_JITTER_UNSPECIFIED {
		if out.Jitter, err = enumFromPB[policy.Jitter](field, ".jitter", j, true); err != nil {
			return out, err
		}
	}
	return out, nil
}

// policyFromPB converts and validates a Policy; unset fields take defaults.
func policyFromPB(field string, p *pb.Policy) (policy.Policy, error) {
	out := policy.Default()
	if p == nil {
		return out, nil
	}
	var err error
	if out.Backoff, err = backoffFromPB(field+".backoff", p.GetBackoff(), out.Backoff); err != nil {
		return out, err
	}
	if pp := p.GetPushback(); pp != nil {
		if m := pp.GetMode(); m != pb.RetryAfterMode_RETRY_AFTER_MODE_UNSPECIFIED {
			if out.Pushback.Mode, err = enumFromPB[policy.RetryAfterMode](field, ".pushback.mode", m, true); err != nil {
				return out, err
			}
		}
		if pp.SpreadRatio != nil {
			if err = finite(field+".pushback.spread_ratio", pp.GetSpreadRatio()); err != nil {
				return out, err
			}
			out.Pushback.SpreadRatio = pp.GetSpreadRatio()
		}
		if out.Pushback.MinSpread, err = duration(field+".pushback.min_spread", pp.GetMinSpread(), out.Pushback.MinSpread); err != nil {
			return out, err
		}
		if out.Pushback.MaxHint, err = duration(field+".pushback.max_hint", pp.GetMaxHint(), out.Pushback.MaxHint); err != nil {
			return out, err
		}
	}
	if p.MaxAttempts != nil {
		if p.GetMaxAttempts() > maxPolicyAttempts {
			return out, invalid(field+".max_attempts", "must be 1 to 100")
		}
		out.MaxAttempts = int(p.GetMaxAttempts())
	}
	if out.AttemptTimeout, err = duration(field+".attempt_timeout", p.GetAttemptTimeout(), out.AttemptTimeout); err != nil {
		return out, err
	}
	if out.IdempotencyTTL, err = duration(field+".idempotency_ttl", p.GetIdempotencyTtl(), out.IdempotencyTTL); err != nil {
		return out, err
	}
	out.UpstreamDedupesByKey = p.GetUpstreamDedupesByKey()
	if out.CallDeadline, err = duration(field+".call_deadline", p.GetCallDeadline(), out.CallDeadline); err != nil {
		return out, err
	}
	tables := []struct {
		name string
		in   []uint32
		dst  *[]int
	}{
		{"transient_http_statuses", p.GetTransientHttpStatuses(), &out.TransientHTTP},
		{"terminal_http_statuses", p.GetTerminalHttpStatuses(), &out.TerminalHTTP},
		{"transient_grpc_codes", p.GetTransientGrpcCodes(), &out.TransientGRPC},
	}
	for _, t := range tables {
		if len(t.in) == 0 {
			continue
		}
		if len(t.in) > maxTableLen {
			return out, invalid(field+"."+t.name, "must have at most "+strconv.Itoa(maxTableLen)+" entries")
		}
		codes := make([]int, len(t.in))
		for i, c := range t.in {
			codes[i] = int(c)
		}
		*t.dst = codes
	}
	if b := p.GetBreaker(); b != nil {
		if out.Breaker, err = breakerFromPB(field+".breaker", b, out.Breaker); err != nil {
			return out, err
		}
	}
	if f := p.GetFlow(); f != nil {
		if out.Flow, err = flowFromPB(field+".flow", f, out.Flow); err != nil {
			return out, err
		}
	}
	if f := p.GetFallback(); f != nil {
		if out.Fallback, err = fallbackFromPB(field+".fallback", f); err != nil {
			return out, err
		}
	}
	if err := out.Validate(); err != nil {
		return out, invalidFrom(field+".", err)
	}
	return out, nil
}

func breakerFromPB(field string, b *pb.BreakerSettings, def policy.BreakerConfig) (policy.BreakerConfig, error) {
	out := def
	var err error
	if m := b.GetMode(); m != pb.BreakerMode_BREAKER_MODE_UNSPECIFIED {
		if out.Mode, err = enumFromPB[policy.BreakerMode](field, ".mode", m, true); err != nil {
			return out, err
		}
	}
	if s := b.GetScope(); s != pb.BreakerScope_BREAKER_SCOPE_UNSPECIFIED {
		if out.Scope, err = enumFromPB[policy.BreakerScope](field, ".scope", s, true); err != nil {
			return out, err
		}
	}
	if b.ConsecutiveFailures != nil {
		out.ConsecutiveFailures = int(b.GetConsecutiveFailures())
	}
	if b.FailureRate != nil {
		if err = finite(field+".failure_rate", b.GetFailureRate()); err != nil {
			return out, err
		}
		out.FailureRate = b.GetFailureRate()
	}
	if b.MinCalls != nil {
		out.MinCalls = int(b.GetMinCalls())
	}
	if b.HalfOpenProbes != nil {
		out.HalfOpenProbes = int(b.GetHalfOpenProbes())
	}
	if out.Window, err = duration(field+".window", b.GetWindow(), out.Window); err != nil {
		return out, err
	}
	if out.Cooldown, err = duration(field+".cooldown", b.GetCooldown(), out.Cooldown); err != nil {
		return out, err
	}
	if out.ProbeTimeout, err = duration(field+".probe_timeout", b.GetProbeTimeout(), out.ProbeTimeout); err != nil {
		return out, err
	}
	out.CountPushback = b.GetCountPushback()
	return out, nil
}

func policyToPB(p policy.Policy) *pb.Policy {
	u32 := func(v int) *uint32 { x := uint32(v); return &x }
	f64 := func(v float64) *float64 { return &v }
	codes := func(in []int) []uint32 {
		out := make([]uint32, len(in))
		for i, c := range in {
			out[i] = uint32(c)
		}
		return out
	}
	return &pb.Policy{
		Backoff: &pb.BackoffSettings{
			BaseDelay: durationpb.New(p.Backoff.Base),
			Factor:    f64(p.Backoff.Factor),
			MaxDelay:  durationpb.New(p.Backoff.Max),
			Jitter:    enumToPB[pb.Jitter](p.Backoff.Jitter),
		},
		Pushback: &pb.PushbackSettings{
			Mode:        enumToPB[pb.RetryAfterMode](p.Pushback.Mode),
			SpreadRatio: f64(p.Pushback.SpreadRatio),
			MinSpread:   durationpb.New(p.Pushback.MinSpread),
			MaxHint:     durationpb.New(p.Pushback.MaxHint),
		},
		MaxAttempts:           u32(p.MaxAttempts),
		AttemptTimeout:        durationpb.New(p.AttemptTimeout),
		IdempotencyTtl:        durationPB(p.IdempotencyTTL),
		UpstreamDedupesByKey:  p.UpstreamDedupesByKey,
		CallDeadline:          durationpb.New(p.CallDeadline),
		TransientHttpStatuses: codes(p.TransientHTTP),
		TerminalHttpStatuses:  codes(p.TerminalHTTP),
		TransientGrpcCodes:    codes(p.TransientGRPC),
		Breaker: &pb.BreakerSettings{
			Mode:                enumToPB[pb.BreakerMode](p.Breaker.Mode),
			Scope:               enumToPB[pb.BreakerScope](p.Breaker.Scope),
			ConsecutiveFailures: u32(p.Breaker.ConsecutiveFailures),
			FailureRate:         f64(p.Breaker.FailureRate),
			Window:              durationpb.New(p.Breaker.Window),
			MinCalls:            u32(p.Breaker.MinCalls),
			Cooldown:            durationpb.New(p.Breaker.Cooldown),
			HalfOpenProbes:      u32(p.Breaker.HalfOpenProbes),
			ProbeTimeout:        durationpb.New(p.Breaker.ProbeTimeout),
			CountPushback:       p.Breaker.CountPushback,
		},
		Flow:     flowToPB(p.Flow),
		Fallback: fallbackToPB(p.Fallback),
	}
}

// fallbackFromPB converts FallbackSettings: at most policy.MaxFallbacks
// targets, each a valid target name. The rest of the rules (repeats,
// after_attempts against max_attempts, on_circuit_open without targets)
// are policy.Policy.Validate's; the policy's own target and cycles through
// the stored policies are SetPolicy's (checkFallbacks).
func fallbackFromPB(field string, f *pb.FallbackSettings) (policy.Fallback, error) {
	ts := f.GetTargets()
	if len(ts) > policy.MaxFallbacks {
		return policy.Fallback{}, invalid(field+".targets", "must name at most "+strconv.Itoa(policy.MaxFallbacks)+
			" targets, got "+strconv.Itoa(len(ts)))
	}
	out := policy.Fallback{AfterAttempts: int(f.GetAfterAttempts()), OnCircuitOpen: f.GetOnCircuitOpen()}
	for i, t := range ts {
		if err := checkName(field+".targets["+strconv.Itoa(i)+"]", t, maxTargetLen, true); err != nil {
			return policy.Fallback{}, err
		}
	}
	if len(ts) > 0 {
		out.Targets = slices.Clone(ts)
	}
	return out, nil
}

// fallbackToPB converts a Fallback; nil when it escalates nowhere.
func fallbackToPB(f policy.Fallback) *pb.FallbackSettings {
	if len(f.Targets) == 0 && f.AfterAttempts == 0 && !f.OnCircuitOpen {
		return nil
	}
	return &pb.FallbackSettings{Targets: slices.Clone(f.Targets), AfterAttempts: uint32(f.AfterAttempts), OnCircuitOpen: f.OnCircuitOpen}
}

// flowFromPB converts FlowSettings over def. A ceiling that is set must be
// at least 1: leaving it unset is how a policy has none.
func flowFromPB(field string, f *pb.FlowSettings, def policy.FlowConfig) (policy.FlowConfig, error) {
	out := def
	var err error
	if f.MaxInFlight != nil {
		if f.GetMaxInFlight() < 1 || f.GetMaxInFlight() > policy.MaxCeiling {
			return out, invalid(field+".max_in_flight", "must be 1 to "+strconv.Itoa(policy.MaxCeiling)+"; leave it unset for no ceiling")
		}
		out.MaxInFlight = int(f.GetMaxInFlight())
	}
	if out.LeaseSlack, err = duration(field+".lease_slack", f.GetLeaseSlack(), out.LeaseSlack); err != nil {
		return out, err
	}
	if f.MaxRate != nil {
		r := f.GetMaxRate()
		if err := finite(field+".max_rate", r); err != nil {
			return out, err
		}
		if r <= 0 {
			return out, invalid(field+".max_rate", "must be > 0 attempts per second; leave it unset for no rate ceiling")
		}
		out.MaxRate = r
	}
	if f.Burst != nil {
		if f.GetBurst() < 1 || f.GetBurst() > policy.MaxCeiling {
			return out, invalid(field+".burst", "must be 1 to "+strconv.Itoa(policy.MaxCeiling))
		}
		out.Burst = int(f.GetBurst())
	}
	if a := f.GetAdaptive(); a != nil {
		if out.Adaptive, err = adaptiveFromPB(field+".adaptive", a, out.Adaptive); err != nil {
			return out, err
		}
	}
	return out, nil
}

// adaptiveFromPB converts AdaptiveCeiling over def: the message present is
// the ceiling enabled. A field that is set is checked here against what
// the domain reads as unset (0 takes the default there, so an explicit 0
// is refused here); the ranges that depend on max_in_flight are
// policy.Policy.Validate's.
func adaptiveFromPB(field string, a *pb.AdaptiveCeiling, def policy.Adaptive) (policy.Adaptive, error) {
	out := def
	out.Enabled = true
	var err error
	if a.MinInFlight != nil {
		if a.GetMinInFlight() < 1 {
			return out, invalid(field+".min_in_flight", "must be 1 to flow.max_in_flight; leave it unset for 1")
		}
		out.Min = int(min(a.GetMinInFlight(), policy.MaxCeiling+1))
	}
	if a.Decrease != nil {
		d := a.GetDecrease()
		if err := finite(field+".decrease", d); err != nil {
			return out, err
		}
		if d <= 0 || d >= 1 {
			return out, invalid(field+".decrease", "must be above 0 and below 1")
		}
		out.Decrease = d
	}
	if a.Increase != nil {
		i := a.GetIncrease()
		if err := finite(field+".increase", i); err != nil {
			return out, err
		}
		if i <= 0 {
			return out, invalid(field+".increase", "must be above 0 and at most flow.max_in_flight")
		}
		out.Increase = i
	}
	if out.Hold, err = duration(field+".hold", a.GetHold(), out.Hold); err != nil {
		return out, err
	}
	return out, nil
}

// flowToPB converts a FlowConfig; nil when it sets nothing.
func flowToPB(f policy.FlowConfig) *pb.FlowSettings {
	if f == (policy.FlowConfig{}) {
		return nil
	}
	out := &pb.FlowSettings{LeaseSlack: durationpb.New(f.LeaseSlack)}
	if f.MaxInFlight > 0 {
		n := uint32(f.MaxInFlight)
		out.MaxInFlight = &n
	}
	if f.MaxRate > 0 {
		r, b := f.MaxRate, uint32(max(f.Burst, 1))
		out.MaxRate, out.Burst = &r, &b
	}
	if a := f.Adaptive; a.Enabled {
		// The message with every default applied, as FlowLimits resolves it.
		b := (&policy.Policy{Flow: f}).FlowLimits().Adaptive
		lo, dec, inc := uint32(b.Min), b.Decrease, b.Increase
		out.Adaptive = &pb.AdaptiveCeiling{MinInFlight: &lo, Decrease: &dec, Increase: &inc, Hold: durationpb.New(a.Hold)}
	}
	return out
}

func policyEntryToPB(e policy.PolicyEntry) *pb.PolicyEntry {
	return &pb.PolicyEntry{Tenant: e.Tenant, Target: e.Target, Policy: policyToPB(e.Policy), UpdateTime: timePB(e.Updated)}
}

func breakerToPB(s policy.BreakerSnapshot) *pb.Breaker {
	return &pb.Breaker{
		Key:                 &pb.BreakerKey{Tenant: s.Key.Tenant, Target: s.Key.Target},
		State:               enumToPB[pb.BreakerState](s.State),
		Forced:              s.Forced,
		OpenUntilTime:       timePB(s.OpenUntil),
		ConsecutiveFailures: uint32(s.ConsecutiveFailures),
		WindowCalls:         s.WindowCalls,
		WindowFailures:      s.WindowFailures,
		ProbesInFlight:      uint32(s.ProbesInFlight),
		ChangeTime:          timePB(s.Changed),
		CooldownUntilTime:   timePB(s.CooldownUntil),
		Mode:                enumToPB[pb.BreakerMode](s.Mode),
		Degraded:            s.Degraded,
	}
}

// breakerKeyFromPB validates a BreakerKey; the tenant may be empty for a
// target-scoped breaker.
func breakerKeyFromPB(field string, k *pb.BreakerKey) (policy.BreakerKey, error) {
	if k == nil {
		return policy.BreakerKey{}, invalid(field, "is required")
	}
	if err := checkName(field+".tenant", k.GetTenant(), maxTenantLen, false); err != nil {
		return policy.BreakerKey{}, err
	}
	if err := checkName(field+".target", k.GetTarget(), maxTargetLen, true); err != nil {
		return policy.BreakerKey{}, err
	}
	return policy.BreakerKey{Tenant: k.GetTenant(), Target: k.GetTarget()}, nil
}

func budgetToPB(b policy.TenantBudget) *pb.TenantBudget {
	return &pb.TenantBudget{
		Tenant: b.Tenant, Capacity: b.Capacity, DepositRatio: b.DepositRatio,
		MinRetriesPerSecond: b.MinPerSecond, RetryCost: b.RetryCost, TimeoutCost: b.TimeoutCost, DryRun: b.DryRun,
	}
}

func budgetStatusToPB(s policy.BudgetStatus) *pb.TenantBudgetStatus {
	return &pb.TenantBudgetStatus{
		Budget: budgetToPB(s.Budget), Tokens: s.Tokens, RetriesGranted: s.Granted,
		RetriesRefused: s.Refused, DryRunRefusals: s.DryRunRefusals, IsDefault: s.IsDefault,
	}
}

// budgetFromPB validates the request-level shape of a budget; the numbers'
// rules are the store's (it fills defaults first).
func budgetFromPB(field string, b *pb.TenantBudget) (policy.TenantBudget, error) {
	if b == nil {
		return policy.TenantBudget{}, invalid(field, "is required")
	}
	if err := checkName(field+".tenant", b.GetTenant(), maxTenantLen, true); err != nil {
		return policy.TenantBudget{}, err
	}
	for _, v := range []struct {
		name string
		val  float64
	}{
		{"capacity", b.GetCapacity()}, {"deposit_ratio", b.GetDepositRatio()},
		{"min_retries_per_second", b.GetMinRetriesPerSecond()}, {"retry_cost", b.GetRetryCost()},
		{"timeout_cost", b.GetTimeoutCost()},
	} {
		if err := finite(field+"."+v.name, v.val); err != nil {
			return policy.TenantBudget{}, err
		}
		if v.val < 0 {
			return policy.TenantBudget{}, invalid(field+"."+v.name, "must not be negative")
		}
	}
	if b.GetDepositRatio() > 1 {
		return policy.TenantBudget{}, invalid(field+".deposit_ratio", "must be within [0, 1]")
	}
	return policy.TenantBudget{
		Tenant: b.GetTenant(), Capacity: b.GetCapacity(), DepositRatio: b.GetDepositRatio(),
		MinPerSecond: b.GetMinRetriesPerSecond(), RetryCost: b.GetRetryCost(),
		TimeoutCost: b.GetTimeoutCost(), DryRun: b.GetDryRun(),
	}, nil
}

func runToPB(r policy.Run) *pb.Run {
	l := r.Ledger
	return &pb.Run{
		RunId: r.ID, Tenant: r.Tenant, Description: r.Description,
		RetryPool: r.Pool, RetriesSpent: r.Spent,
		CutoffTime: timePB(r.Cutoff), CreateTime: timePB(r.Created),
		Ledger: &pb.RunLedger{
			Succeeded: l.Succeeded, FailedTerminal: l.FailedTerminal,
			DeadLetterExhausted: l.DeadLetterExhausted, DeadLetterBudget: l.DeadLetterBudget,
			DeadLetterNotIdempotent: l.DeadLetterNotIdempotent, DeadLetterPushback: l.DeadLetterPushback,
			CircuitOpen: l.CircuitOpen, DeadlineCut: l.DeadlineCut, DeadLetterDeadline: l.DeadLetterDeadline,
			Deduplicated: l.Deduplicated,
		},
		RedriveOf: r.RedriveOf,
	}
}

// runCallFilterFromPB validates ListRunCalls's filter.
func runCallFilterFromPB(req *pb.ListRunCallsRequest) (policy.RunCallFilter, error) {
	var f policy.RunCallFilter
	for i, d := range req.GetDispositions() {
		v, err := enumFromPB[policy.Disposition]("dispositions", "["+strconv.Itoa(i)+"]", d, true)
		if err != nil {
			return f, err
		}
		f.Dispositions = append(f.Dispositions, v)
	}
	for i, s := range req.GetStopReasons() {
		v, err := enumFromPB[policy.StopReason]("stop_reasons", "["+strconv.Itoa(i)+"]", s, false)
		if err != nil {
			return f, err
		}
		f.Stops = append(f.Stops, v)
	}
	return f, nil
}

func runCallToPB(c policy.RunCall) *pb.RunCall {
	return &pb.RunCall{
		CallId: c.CallID, Disposition: enumToPB[pb.Disposition](c.Disposition), StopReason: enumToPB[pb.StopReason](c.Stop),
		Attempts: c.Attempts, LastClassification: c.Classification, LastDetail: c.Detail,
		FirstAttemptTime: timePB(c.First), LastAttemptTime: timePB(c.Last), Target: c.Target, TriageRef: c.TriageRef,
		PrimaryTarget: c.PrimaryTarget,
	}
}

func planToPB(p policy.Plan) *pb.BudgetPlan {
	delays := make([]*durationpb.Duration, len(p.Delays))
	for i, d := range p.Delays {
		delays[i] = durationpb.New(d)
	}
	return &pb.BudgetPlan{
		MaxAttempts:    uint32(p.MaxAttempts),
		Delays:         delays,
		WorstCaseTotal: durationpb.New(p.WorstCase),
		IdempotencyTtl: durationpb.New(p.IdempotencyTTL),
		Window:         durationpb.New(p.Window),
		Remaining:      durationpb.New(p.Remaining),
		Usable:         durationpb.New(p.Usable),
		Reason:         p.Reason,
	}
}

// pageSize validates a page size; 0 means the default.
func pageSize(field string, n uint32) (int, error) {
	if n > maxPageSize {
		return 0, invalid(field, "must be at most "+strconv.Itoa(maxPageSize))
	}
	if n == 0 {
		return defaultPage, nil
	}
	return int(n), nil
}

// auditQueryFromPB validates a QueryAuditRequest: call_id, tenant or
// start_time (any of them), an optional time range, a page size of at most maxPageSize and a
// page token this server issued.
func auditQueryFromPB(req *pb.QueryAuditRequest) (policy.AuditQuery, error) {
	var q policy.AuditQuery
	if err := checkName("call_id", req.GetCallId(), maxCallIDLen, false); err != nil {
		return q, err
	}
	if err := checkName("tenant", req.GetTenant(), maxTenantLen, false); err != nil {
		return q, err
	}
	if req.GetCallId() == "" && req.GetTenant() == "" && req.GetStartTime() == nil {
		return q, invalid("call_id", "call_id, tenant or start_time is required")
	}
	var err error
	if q.Start, err = timestamp("start_time", req.GetStartTime()); err != nil {
		return q, err
	}
	if q.End, err = timestamp("end_time", req.GetEndTime()); err != nil {
		return q, err
	}
	if !q.Start.IsZero() && !q.End.IsZero() && !q.End.After(q.Start) {
		return q, invalid("end_time", "must be after start_time")
	}
	if q.Limit, err = pageSize("page_size", req.GetPageSize()); err != nil {
		return q, err
	}
	after, err := decodeToken(req.GetPageToken(), 2)
	if err != nil {
		return q, err
	}
	if req.GetPageToken() != "" {
		ns, err1 := strconv.ParseInt(after[0], 10, 64)
		seq, err2 := strconv.ParseUint(after[1], 10, 64)
		if err1 != nil || err2 != nil || ns < 0 {
			return q, invalid("page_token", "is not a token this server issued")
		}
		q.After = policy.AuditCursor{Time: time.Unix(0, ns), Seq: seq}
	}
	q.CallID, q.Tenant = req.GetCallId(), req.GetTenant()
	return q, nil
}

// auditRecordToPB converts an audit record. The record of an attempt's
// outcome keeps the attempt's latency in Delay; it is written out as part
// of the detail ("attempt succeeded in 37ms"), as the API's delay is the
// wait of a RETRY.
func auditRecordToPB(r policy.AuditRecord) *pb.AuditRecord {
	if (r.Event == policy.AuditOutcome || r.Event == policy.AuditFinal) && r.Delay > 0 {
		r.Detail, r.Delay = r.Detail+" in "+r.Delay.String(), 0
	}
	return &pb.AuditRecord{
		RecordTime:     timePB(r.Time),
		Event:          enumToPB[pb.AuditEvent](r.Event),
		Tenant:         r.Tenant,
		Target:         r.Target,
		CallId:         r.CallID,
		RunId:          r.RunID,
		Attempt:        r.Attempt,
		Classification: r.Classification,
		Decision:       enumToPB[pb.Decision](r.Verdict),
		Delay:          durationPB(r.Delay),
		StopReason:     enumToPB[pb.StopReason](r.Stop),
		Disposition:    enumToPB[pb.Disposition](r.Disposition),
		Detail:         r.Detail,
		PrimaryTarget:  r.PrimaryTarget,
	}
}

// refusalToPB reports outcome i of a batch as refused by the state's rules:
// its field path and the rule, as the status of the outcome alone would.
func refusalToPB(i int, err error) *pb.OutcomeRefusal {
	field := "outcomes[" + strconv.Itoa(i) + "]"
	msg := err.Error()
	var fr *fleet.Refusal
	if errors.As(err, &fr) {
		field += "." + fr.Field
		msg = field + ": " + fr.Rule
	}
	return &pb.OutcomeRefusal{Index: uint32(i), Code: int32(codes.FailedPrecondition), Field: field, Message: msg}
}

// nextDelayToPB is the NextDelay response of an answer, explained by why.
func nextDelayToPB(ans *policy.Answer, why string) *pb.NextDelayResponse {
	resp := &pb.NextDelayResponse{
		BreakerState:          enumToPB[pb.BreakerState](ans.Breaker),
		Category:              enumToPB[pb.Category](ans.Category),
		Classification:        ans.Class,
		PushbackNote:          ans.Note,
		Checks:                ans.Checks.Names(),
		Detail:                why,
		TenantBudgetRemaining: ans.TenantTokens,
		RunBudgetRemaining:    ans.RunRemaining,
		FlowControlled:        ans.FlowControlled,
		Degraded:              ans.Degraded,
	}
	if ans.Retry {
		resp.Decision = pb.Decision_DECISION_RETRY
		resp.Delay = durationpb.New(ans.Delay)
		resp.AttemptTimeout = durationPB(ans.AttemptTimeout)
		resp.Target = ans.Target
	} else {
		resp.Decision = pb.Decision_DECISION_STOP
		resp.StopReason = enumToPB[pb.StopReason](ans.Stop)
		resp.Disposition = enumToPB[pb.Disposition](ans.Disposition)
	}
	return resp
}

// admissionToPB is the Admit response of an admission.
func admissionToPB(a *policy.Admission) *pb.AdmitResponse {
	return &pb.AdmitResponse{
		Admitted: a.Admitted, State: enumToPB[pb.BreakerState](a.State), PermitId: a.PermitID,
		RetryAfter: durationPB(a.RetryAfter), Reason: a.Reason, RunCutoffTime: timePB(a.RunCutoff),
		LeaseId: a.LeaseID, LeaseExpireTime: timePB(a.LeaseExpiry), FlowControlled: a.FlowControlled,
		Degraded: a.Degraded, Target: admittedTarget(a),
	}
}

// admittedTarget is AdmitResponse.target: the target admitted, "" for a
// refusal.
func admittedTarget(a *policy.Admission) string {
	if !a.Admitted {
		return ""
	}
	return a.Target
}

// outcomeFromPB validates one Outcome into it; field is its path in the
// request.
func outcomeFromPB(field string, o *pb.Outcome, it *outcomeItem) error {
	*it = outcomeItem{}
	call, err := callFromPB(sub(field, ".call"), o.GetCall(), true)
	if err != nil {
		return err
	}
	if o.GetAttempt() < 1 || o.GetAttempt() > maxAttempt {
		return invalid(field+".attempt", "must be 1 to "+strconv.Itoa(maxAttempt))
	}
	latency, err := duration(sub(field, ".latency"), o.GetLatency(), 0)
	if err != nil {
		return err
	}
	if err := checkName(sub(field, ".permit_id"), o.GetPermitId(), maxCallIDLen, false); err != nil {
		return err
	}
	if err := checkName(sub(field, ".lease_id"), o.GetLeaseId(), maxCallIDLen, false); err != nil {
		return err
	}
	if err := checkName(sub(field, ".attempt_target"), o.GetAttemptTarget(), maxTargetLen, false); err != nil {
		return err
	}
	it.target = call.target
	if t := o.GetAttemptTarget(); t != "" {
		it.target = t
	}
	it.call, it.attempt, it.success, it.alreadyRecorded = call, o.GetAttempt(), o.GetSuccess(), o.GetAlreadyRecorded()
	it.latency, it.permit, it.lease = max(latency, 0), o.GetPermitId(), o.GetLeaseId()
	if !it.success && !it.alreadyRecorded {
		if it.failure, err = failureFromPB(sub(field, ".failure"), o.GetFailure()); err != nil {
			return err
		}
	}
	fd := o.GetFinalDisposition()
	if it.final.Disposition, err = enumFromPB[policy.Disposition](field, ".final_disposition", fd, true); err != nil {
		return err
	}
	if it.final.Stop, err = enumFromPB[policy.StopReason](field, ".final_stop_reason", o.GetFinalStopReason(), true); err != nil {
		return err
	}
	if it.success && fd != pb.Disposition_DISPOSITION_UNSPECIFIED && fd != pb.Disposition_DISPOSITION_SUCCEEDED {
		return invalid(field+".final_disposition", "must be SUCCEEDED or unset when success is true")
	}
	if o.GetDeduplicated() {
		if !it.success || fd != pb.Disposition_DISPOSITION_SUCCEEDED || call.key == "" {
			return invalid(field+".deduplicated", "only with success, final_disposition SUCCEEDED and the call's idempotency key")
		}
		it.final.Deduplicated = true
	}
	return nil
}

// planInputFromPB converts and validates a PlanBudget request; it returns
// the plan input and the number of hops.
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

// keyRefFromPB validates a tenant and an idempotency key.
func keyRefFromPB(tenant, key string) (policy.KeyRef, error) {
	if err := checkName("tenant", tenant, maxTenantLen, true); err != nil {
		return policy.KeyRef{}, err
	}
	if key == "" {
		return policy.KeyRef{}, invalid("idempotency_key", "is required")
	}
	if err := checkText("idempotency_key", key, maxKeyLen); err != nil {
		return policy.KeyRef{}, err
	}
	return policy.KeyRef{Tenant: tenant, Key: key}, nil
}

func keyRecordToPB(v *policy.KeyRecordView) *pb.IdempotencyRecord {
	return &pb.IdempotencyRecord{Tenant: v.Ref.Tenant, IdempotencyKey: v.Ref.Key, State: enumToPB[pb.KeyState](v.State),
		LeaseExpireTime: timePB(v.LeaseUntil), ExpireTime: timePB(v.Expires), ResultRef: v.ResultRef}
}

// forcedStateFromPB validates the state ForceBreaker pins: OPEN, CLOSED
// or DISABLED.
func forcedStateFromPB(field string, st pb.BreakerState) (policy.BreakerState, error) {
	switch st {
	case pb.BreakerState_BREAKER_STATE_OPEN, pb.BreakerState_BREAKER_STATE_CLOSED, pb.BreakerState_BREAKER_STATE_DISABLED:
		return enumFromPB[policy.BreakerState](field, "", st, false)
	}
	return 0, invalid(field, "must be BREAKER_STATE_OPEN, BREAKER_STATE_CLOSED or BREAKER_STATE_DISABLED")
}
