package policy_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

func TestValidatePolicy(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	tests := []struct {
		name   string
		change func(*policy.Policy)
		want   string // "" means valid
	}{
		{"default", func(*policy.Policy) {}, ""},
		{"unspecified enums select defaults", func(p *policy.Policy) {
			p.Backoff.Jitter, p.Pushback.Mode = policy.JitterUnspecified, policy.RetryAfterUnspecified
			p.Breaker.Mode, p.Breaker.Scope = policy.BreakerModeUnspecified, policy.ScopeUnspecified
		}, ""},
		{"every limit at its edge", func(p *policy.Policy) {
			p.Backoff = policy.Backoff{Base: 1, Factor: 100, Max: 1, Jitter: policy.JitterDecorrelated}
			p.Pushback = policy.Pushback{Mode: policy.RetryAfterOverride, SpreadRatio: 1, MaxHint: 1}
			p.MaxAttempts, p.AttemptTimeout, p.CallDeadline = 100, 0, 1
			p.Breaker = policy.BreakerConfig{Mode: policy.BreakerFailureRate, Scope: policy.ScopeTarget, ConsecutiveFailures: 10000,
				FailureRate: 1, Window: 1, MinCalls: 1, Cooldown: 1, HalfOpenProbes: 1000, ProbeTimeout: 1}
		}, ""},
		{"base zero", func(p *policy.Policy) { p.Backoff.Base = 0 }, "backoff.base_delay: must be > 0"},
		{"base negative", func(p *policy.Policy) { p.Backoff.Base = -time.Second }, "backoff.base_delay: must be > 0"},
		{"max below base", func(p *policy.Policy) { p.Backoff.Max = 100 * time.Millisecond }, "backoff.max_delay: must be >= backoff.base_delay"},
		{"factor NaN", func(p *policy.Policy) { p.Backoff.Factor = nan }, "backoff.factor: must be a finite number, not NaN"},
		{"factor +Inf", func(p *policy.Policy) { p.Backoff.Factor = inf }, "backoff.factor: must be a finite number, not +Inf"},
		{"factor -Inf", func(p *policy.Policy) { p.Backoff.Factor = -inf }, "backoff.factor: must be a finite number, not -Inf"},
		{"factor 1", func(p *policy.Policy) { p.Backoff.Factor = 1 }, "backoff.factor: must be > 1"},
		{"factor below 1", func(p *policy.Policy) { p.Backoff.Factor = 0.5 }, "backoff.factor: must be > 1"},
		{"factor negative", func(p *policy.Policy) { p.Backoff.Factor = -2 }, "backoff.factor: must be > 1"},
		{"factor above 100", func(p *policy.Policy) { p.Backoff.Factor = 100.5 }, "backoff.factor: must be <= 100"},
		{"jitter unknown", func(p *policy.Policy) { p.Backoff.Jitter = 9 }, "backoff.jitter: must be a known value, not 9"},
		{"pushback mode unknown", func(p *policy.Policy) { p.Pushback.Mode = 5 }, "pushback.mode: must be a known value, not 5"},
		{"spread ratio NaN", func(p *policy.Policy) { p.Pushback.SpreadRatio = nan }, "pushback.spread_ratio: must be a finite number, not NaN"},
		{"spread ratio -Inf", func(p *policy.Policy) { p.Pushback.SpreadRatio = -inf }, "pushback.spread_ratio: must be a finite number, not -Inf"},
		{"spread ratio above 1", func(p *policy.Policy) { p.Pushback.SpreadRatio = 1.5 }, "pushback.spread_ratio: must be between 0 and 1"},
		{"spread ratio negative", func(p *policy.Policy) { p.Pushback.SpreadRatio = -0.1 }, "pushback.spread_ratio: must be between 0 and 1"},
		{"min spread negative", func(p *policy.Policy) { p.Pushback.MinSpread = -1 }, "pushback.min_spread: must be >= 0"},
		{"max hint zero", func(p *policy.Policy) { p.Pushback.MaxHint = 0 }, "pushback.max_hint: must be > 0"},
		{"max attempts zero", func(p *policy.Policy) { p.MaxAttempts = 0 }, "max_attempts: must be between 1 and 100"},
		{"max attempts 101", func(p *policy.Policy) { p.MaxAttempts = 101 }, "max_attempts: must be between 1 and 100"},
		{"attempt timeout negative", func(p *policy.Policy) { p.AttemptTimeout = -1 }, "attempt_timeout: must be >= 0"},
		{"call deadline negative", func(p *policy.Policy) { p.CallDeadline = -1 }, "call_deadline: must be >= 0"},
		{"base beyond call deadline", func(p *policy.Policy) { p.CallDeadline = 400 * time.Millisecond }, "backoff.base_delay: must not exceed call_deadline"},
		{"max beyond call deadline", func(p *policy.Policy) { p.CallDeadline = 20 * time.Second }, "backoff.max_delay: must not exceed call_deadline"},
		{"attempt timeout beyond call deadline", func(p *policy.Policy) { p.CallDeadline = 30 * time.Second; p.AttemptTimeout = time.Minute },
			"attempt_timeout: must not exceed call_deadline"},
		{"transient http out of range", func(p *policy.Policy) { p.TransientHTTP = []int{503, 42} }, "transient_http_statuses: code 42 must be between 100 and 599"},
		{"terminal http out of range", func(p *policy.Policy) { p.TerminalHTTP = []int{600} }, "terminal_http_statuses: code 600 must be between 100 and 599"},
		{"http code in both tables", func(p *policy.Policy) { p.TerminalHTTP = []int{400, 503} }, "terminal_http_statuses: code 503 must not also be in transient_http_statuses"},
		{"grpc code 0", func(p *policy.Policy) { p.TransientGRPC = []int{0} }, "transient_grpc_codes: code 0 must be between 1 and 16"},
		{"grpc code 17", func(p *policy.Policy) { p.TransientGRPC = []int{14, 17} }, "transient_grpc_codes: code 17 must be between 1 and 16"},
		{"breaker mode unknown", func(p *policy.Policy) { p.Breaker.Mode = 3 }, "breaker.mode: must be a known value, not 3"},
		{"breaker scope unknown", func(p *policy.Policy) { p.Breaker.Scope = 3 }, "breaker.scope: must be a known value, not 3"},
		{"consecutive failures zero", func(p *policy.Policy) { p.Breaker.ConsecutiveFailures = 0 }, "breaker.consecutive_failures: must be between 1 and 10000"},
		{"consecutive failures too many", func(p *policy.Policy) { p.Breaker.ConsecutiveFailures = 10001 }, "breaker.consecutive_failures: must be between 1 and 10000"},
		{"failure rate NaN", func(p *policy.Policy) { p.Breaker.FailureRate = nan }, "breaker.failure_rate: must be a finite number, not NaN"},
		{"failure rate +Inf", func(p *policy.Policy) { p.Breaker.FailureRate = inf }, "breaker.failure_rate: must be a finite number, not +Inf"},
		{"failure rate zero", func(p *policy.Policy) { p.Breaker.FailureRate = 0 }, "breaker.failure_rate: must be > 0 and <= 1"},
		{"failure rate above 1", func(p *policy.Policy) { p.Breaker.FailureRate = 1.01 }, "breaker.failure_rate: must be > 0 and <= 1"},
		{"window zero", func(p *policy.Policy) { p.Breaker.Window = 0 }, "breaker.window: must be > 0"},
		{"min calls zero", func(p *policy.Policy) { p.Breaker.MinCalls = 0 }, "breaker.min_calls: must be >= 1"},
		{"cooldown negative", func(p *policy.Policy) { p.Breaker.Cooldown = -time.Second }, "breaker.cooldown: must be > 0"},
		{"half-open probes zero", func(p *policy.Policy) { p.Breaker.HalfOpenProbes = 0 }, "breaker.half_open_probes: must be between 1 and 1000"},
		{"half-open probes too many", func(p *policy.Policy) { p.Breaker.HalfOpenProbes = 1001 }, "breaker.half_open_probes: must be between 1 and 1000"},
		{"probe timeout zero", func(p *policy.Policy) { p.Breaker.ProbeTimeout = 0 }, "breaker.probe_timeout: must be > 0"},
		{"first error wins", func(p *policy.Policy) { p.Backoff.Factor = 0; p.MaxAttempts = 0 }, "backoff.factor: must be > 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policy.Default()
			tt.change(&p)
			err := p.Validate()
			checkFieldError(t, err, tt.want)
		})
	}
	t.Run("nil policy", func(t *testing.T) {
		var p *policy.Policy
		checkFieldError(t, p.Validate(), "policy: must be set")
	})
}

// checkFieldError checks that err is nil when want is empty, and otherwise a
// *FieldError reading want that matches policy.ErrInvalid.
func checkFieldError(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Errorf("Validate() = %v, want nil", err)
		}
		return
	}
	var fe *policy.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("Validate() = %v (%T), want *FieldError %q", err, err, want)
	}
	if got := err.Error(); got != want {
		t.Errorf("Validate() = %q, want %q", got, want)
	}
	if !errors.Is(err, policy.ErrInvalid) {
		t.Errorf("errors.Is(%v, ErrInvalid) = false, want true", err)
	}
}

func TestValidatePlanInput(t *testing.T) {
	valid := policy.PlanInput{
		Window:         time.Minute,
		Backoff:        policy.Backoff{Base: time.Second, Factor: 2, Max: 30 * time.Second},
		AttemptTimeout: 5 * time.Second,
		TTLMargin:      time.Hour,
	}
	tests := []struct {
		name   string
		change func(*policy.PlanInput)
		want   string
	}{
		{"valid", func(*policy.PlanInput) {}, ""},
		{"max attempts 100", func(in *policy.PlanInput) { in.MaxAttempts = 100 }, ""},
		{"jitter is ignored", func(in *policy.PlanInput) { in.Backoff.Jitter = 77 }, ""},
		{"base and max equal to window", func(in *policy.PlanInput) { in.Backoff.Base, in.Backoff.Max = time.Minute, time.Minute }, ""},
		{"window zero", func(in *policy.PlanInput) { in.Window = 0 }, "window: must be > 0"},
		{"window negative", func(in *policy.PlanInput) { in.Window = -time.Minute }, "window: must be > 0"},
		{"base zero", func(in *policy.PlanInput) { in.Backoff.Base = 0 }, "backoff.base_delay: must be > 0"},
		{"max below base", func(in *policy.PlanInput) { in.Backoff.Max = time.Millisecond }, "backoff.max_delay: must be >= backoff.base_delay"},
		{"factor NaN", func(in *policy.PlanInput) { in.Backoff.Factor = math.NaN() }, "backoff.factor: must be a finite number, not NaN"},
		{"factor Inf", func(in *policy.PlanInput) { in.Backoff.Factor = math.Inf(1) }, "backoff.factor: must be a finite number, not +Inf"},
		{"factor 1", func(in *policy.PlanInput) { in.Backoff.Factor = 1 }, "backoff.factor: must be > 1"},
		{"base beyond window", func(in *policy.PlanInput) { in.Backoff.Base, in.Backoff.Max = 2*time.Minute, 2*time.Minute }, "backoff.base_delay: must not exceed window"},
		{"max beyond window", func(in *policy.PlanInput) { in.Backoff.Max = 2 * time.Minute }, "backoff.max_delay: must not exceed window"},
		{"attempt timeout negative", func(in *policy.PlanInput) { in.AttemptTimeout = -1 }, "attempt_timeout: must be >= 0"},
		{"ttl margin negative", func(in *policy.PlanInput) { in.TTLMargin = -1 }, "ttl_margin: must be >= 0"},
		{"ttl overflows", func(in *policy.PlanInput) { in.TTLMargin = maxDuration - time.Minute + 1 }, "ttl_margin: must not make window + ttl_margin overflow a duration"},
		{"max attempts negative", func(in *policy.PlanInput) { in.MaxAttempts = -1 }, "max_attempts: must be between 0 and 100"},
		{"max attempts 101", func(in *policy.PlanInput) { in.MaxAttempts = 101 }, "max_attempts: must be between 0 and 100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := valid
			tt.change(&in)
			checkFieldError(t, in.Validate(), tt.want)
		})
	}
}
