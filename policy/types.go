package policy

import "time"

// Category is the verdict of classification on a failure.
type Category uint8

// Categories of failures.
const (
	CategoryUnspecified  Category = iota
	CategoryTransient             // may succeed when tried again
	CategoryTerminal              // cannot succeed when repeated
	CategoryUnclassified          // outside every table; treated as terminal
)

// FailureKind says which field of a Failure is meaningful.
type FailureKind uint8

// Kinds of failures.
const (
	FailureUnspecified FailureKind = iota
	FailureHTTP                    // Failure.Code is an HTTP status
	FailureGRPC                    // Failure.Code is a gRPC code
	FailureTransport               // Failure.Transport is set
	FailureLocal                   // Failure.Local is set
)

// TransportKind names a failure below the application protocol.
type TransportKind uint8

// Transport failures.
const (
	TransportUnspecified TransportKind = iota
	TransportTimeout
	TransportConnectionReset
	TransportConnectionRefused
	TransportDNS
	TransportTLS
)

// LocalKind names a failure inside the caller.
type LocalKind uint8

// Local failures.
const (
	LocalUnspecified LocalKind = iota
	LocalParse
	LocalValidation
)

// Failure is how one attempt failed. Exactly one of Code (for HTTP and gRPC),
// Transport or Local is meaningful, as Kind says.
type Failure struct {
	Kind      FailureKind
	Code      int
	Transport TransportKind
	Local     LocalKind
}

// Jitter is the randomisation applied to a nominal delay.
type Jitter uint8

// Jitter modes. JitterFull is the default.
const (
	JitterUnspecified Jitter = iota
	JitterNone
	JitterFull
	JitterEqual
	JitterDecorrelated
)

// RetryAfterMode says how a pushback hint combines with backoff.
type RetryAfterMode uint8

// Pushback modes. RetryAfterMax is the default.
const (
	RetryAfterUnspecified RetryAfterMode = iota
	RetryAfterMax
	RetryAfterOverride
)

// BreakerMode selects the rule that trips a breaker.
type BreakerMode uint8

// Breaker modes. BreakerConsecutive is the default.
const (
	BreakerModeUnspecified BreakerMode = iota
	BreakerConsecutive
	BreakerFailureRate
)

// BreakerScope selects the key a breaker is shared under.
type BreakerScope uint8

// Breaker scopes. ScopeTenantTarget is the default.
const (
	ScopeUnspecified BreakerScope = iota
	ScopeTenantTarget
	ScopeTarget
)

// StopReason says which rule ended a call.
type StopReason uint8

// Stop reasons; StopNone means the decision is to retry.
const (
	StopNone StopReason = iota
	StopTerminal
	StopNotIdempotent
	StopAttemptsExhausted
	StopDeadline
	StopBudgetExhausted
	StopCircuitOpen
	StopServerPushback
)

// Disposition is the final state of a call.
type Disposition uint8

// Dispositions; DispositionNone means the call is not final.
const (
	DispositionNone Disposition = iota
	DispositionSucceeded
	DispositionFailedTerminal
	DispositionDeadLetter
	DispositionDeadlineCut
	DispositionCircuitOpen
)

// Backoff shapes the delays between attempts: nominal(n) = min(Max, Base *
// Factor^n) for retry n counted from 0.
type Backoff struct {
	Base   time.Duration
	Factor float64
	Max    time.Duration
	Jitter Jitter
}

// Pushback says how server hints are honoured. A hint h becomes a wait in
// [h, h+spread] with spread = max(SpreadRatio*h, MinSpread); hints longer
// than MaxHint are capped to it.
type Pushback struct {
	Mode        RetryAfterMode
	SpreadRatio float64
	MinSpread   time.Duration
	MaxHint     time.Duration
}

// BreakerConfig configures a circuit breaker.
type BreakerConfig struct {
	Mode                BreakerMode
	Scope               BreakerScope
	ConsecutiveFailures int
	FailureRate         float64 // in (0, 1]
	Window              time.Duration
	MinCalls            int
	Cooldown            time.Duration
	HalfOpenProbes      int
	ProbeTimeout        time.Duration
	// CountPushback counts a transient failure that carried a pushback
	// hint toward the breaker; by default it only sets the fleet-wide
	// cool-down (fleet.BreakerResult).
	CountPushback bool `json:",omitempty"`
}

// Policy is a complete retry policy. Every number of the decision rules is a
// field here; Default returns the documented defaults.
type Policy struct {
	Backoff        Backoff
	Pushback       Pushback
	MaxAttempts    int           // counting the first attempt
	AttemptTimeout time.Duration // reserved before each retry; 0 reserves nothing
	CallDeadline   time.Duration // from the origin time; 0 means none

	// Classification tables. Codes in neither HTTP table are unclassified.
	TransientHTTP []int
	TerminalHTTP  []int
	TransientGRPC []int

	Breaker BreakerConfig

	// IdempotencyTTL is how long an idempotency record is kept (ClaimKey),
	// never less than the call's remaining schedule; 0 means
	// DefaultIdempotencyTTL.
	IdempotencyTTL time.Duration
	// UpstreamDedupesByKey lets a call whose previous attempt's outcome was
	// lost be retried with the same key; without it the call is
	// dead-lettered.
	UpstreamDedupesByKey bool
	// Flow sets the fleet-wide ceilings; the zero value sets none.
	Flow FlowConfig `json:",omitzero"`
	// Fallback escalates a call to other providers; the zero value never
	// does.
	Fallback Fallback `json:",omitzero"`
}

// MaxFallbacks is the most fallback targets a policy may name.
const MaxFallbacks = 4

// Fallback escalates a call from its primary target to other providers
// (the proto's FallbackSettings has the whole rule): the chain is the
// primary, then Targets in order; each gets AfterAttempts attempts before
// the next takes over, and the last keeps the rest. OnCircuitOpen skips a
// target whose breaker (or ceiling) refuses for the next one.
type Fallback struct {
	Targets       []string `json:",omitempty"`
	AfterAttempts int      `json:",omitempty"`
	OnCircuitOpen bool     `json:",omitempty"`
}

// FlowConfig sets the fleet-wide ceilings of a target, keyed as its breaker
// is (BreakerConfig.Scope).
type FlowConfig struct {
	// MaxInFlight is the concurrency ceiling: at most this many attempts
	// hold a lease at once, fleet-wide; 0 means none.
	MaxInFlight int `json:",omitempty"`
	// LeaseSlack is added to the attempt timeout (to the breaker's probe
	// timeout when that is 0) to give a lease's life; 0 means
	// DefaultLeaseSlack.
	LeaseSlack time.Duration `json:",omitempty"`
	// MaxRate is the rate ceiling, in attempts per second fleet-wide, kept
	// by GCRA; 0 means none.
	MaxRate float64 `json:",omitempty"`
	// Burst is how many attempts the rate ceiling admits at once; 0 means 1.
	Burst int `json:",omitempty"`
	// Adaptive lets the concurrency ceiling learn from the upstream
	// between a floor and MaxInFlight; the zero value keeps it fixed.
	Adaptive Adaptive `json:",omitzero"`
}

// Adaptive is an AIMD concurrency ceiling (fleet.AdaptiveLimit has the
// rules). Enabled turns it on; a zero field takes its default.
type Adaptive struct {
	Enabled  bool          `json:",omitempty"`
	Min      int           `json:",omitempty"` // floor; 0 means 1
	Decrease float64       `json:",omitempty"` // factor on congestion; 0 means DefaultAdaptiveDecrease
	Increase float64       `json:",omitempty"` // per window of successes; 0 means DefaultAdaptiveIncrease
	Hold     time.Duration `json:",omitempty"` // least time between two decreases, besides a window of outcomes
}

// Defaults of an adaptive ceiling's fields.
const (
	DefaultAdaptiveDecrease = 0.7
	DefaultAdaptiveIncrease = 0.5
)

// FlowLimits are a policy's ceilings as an engine applies them (see
// Policy.FlowLimits): Ceiling leases at most (0: no concurrency ceiling),
// each living LeaseTTL, a full ceiling answering "ask again after
// FullWait"; one attempt per Interval with Burst at once (Interval 0: no
// rate ceiling).
type FlowLimits struct {
	Ceiling  int
	LeaseTTL time.Duration
	FullWait time.Duration
	Interval time.Duration
	Burst    int
	// Adaptive, when its Max is set, makes the concurrency ceiling the
	// adaptive limit's current value (fleet.AdaptiveLimit) instead of
	// Ceiling, which is then its maximum.
	Adaptive AdaptiveBounds
}

// AdaptiveBounds are a policy's adaptive ceiling with every default
// applied (see Policy.FlowLimits): the floor and the maximum, the factor
// of a decrease and the increase per window, and the least time between
// two decreases. The zero value (Max 0) is no adaptive ceiling.
type AdaptiveBounds struct {
	Min, Max int
	Decrease float64
	Increase float64
	Hold     time.Duration
}

// FlowLimits returns p's ceilings for an engine: the concurrency ceiling
// with its lease life (LeaseTTL) and the backoff base delay as the wait
// of a full ceiling, and the rate ceiling as an emission interval
// (1/MaxRate) and burst.
func (p *Policy) FlowLimits() FlowLimits {
	l := FlowLimits{Ceiling: p.Flow.MaxInFlight, LeaseTTL: p.LeaseTTL(), FullWait: p.Backoff.Base, Burst: max(p.Flow.Burst, 1)}
	if p.Flow.MaxRate > 0 {
		l.Interval = max(time.Duration(float64(time.Second)/p.Flow.MaxRate), 1)
	}
	if a := p.Flow.Adaptive; a.Enabled && p.Flow.MaxInFlight > 0 {
		l.Adaptive = AdaptiveBounds{Min: min(max(a.Min, 1), p.Flow.MaxInFlight), Max: p.Flow.MaxInFlight,
			Decrease: a.Decrease, Increase: a.Increase, Hold: a.Hold}
		if l.Adaptive.Decrease <= 0 || l.Adaptive.Decrease >= 1 {
			l.Adaptive.Decrease = DefaultAdaptiveDecrease
		}
		if l.Adaptive.Increase <= 0 {
			l.Adaptive.Increase = DefaultAdaptiveIncrease
		}
	}
	return l
}

// DefaultLeaseSlack is the lease slack of a policy that sets none.
const DefaultLeaseSlack = 5 * time.Second

// MaxCeiling is the largest concurrency ceiling a policy may set.
const MaxCeiling = 1_000_000

// FlowControlled reports whether the policy has a fleet-wide ceiling
// (concurrency or rate), so
// every attempt asks Admit, even while the breaker is CLOSED.
func (p *Policy) FlowControlled() bool { return p.Flow.MaxInFlight > 0 || p.Flow.MaxRate > 0 }

// LeaseTTL is the life of a concurrency lease under p: the attempt timeout
// (the breaker's probe timeout when that is 0) plus the lease slack.
func (p *Policy) LeaseTTL() time.Duration {
	t := p.AttemptTimeout
	if t <= 0 {
		t = p.Breaker.ProbeTimeout
	}
	slack := p.Flow.LeaseSlack
	if slack <= 0 {
		slack = DefaultLeaseSlack
	}
	return t + slack
}

// DefaultIdempotencyTTL is the idempotency TTL of a policy that sets none.
const DefaultIdempotencyTTL = 24 * time.Hour

// Defaults of DESIGN.md.
var (
	DefaultTransientHTTP = []int{429, 500, 502, 503, 504}
	DefaultTerminalHTTP  = []int{400, 401, 403, 404, 422}
	// DefaultTransientGRPC: UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, ABORTED.
	DefaultTransientGRPC = []int{14, 8, 4, 10}
)

// Default returns the default policy. The slices are fresh copies the caller
// may modify.
func Default() Policy {
	return Policy{
		Backoff: Backoff{Base: 500 * time.Millisecond, Factor: 2, Max: 30 * time.Second, Jitter: JitterFull},
		Pushback: Pushback{
			Mode:        RetryAfterMax,
			SpreadRatio: 0.1,
			MinSpread:   250 * time.Millisecond,
			MaxHint:     time.Hour,
		},
		MaxAttempts:    3,
		AttemptTimeout: 10 * time.Second,
		TransientHTTP:  append([]int(nil), DefaultTransientHTTP...),
		TerminalHTTP:   append([]int(nil), DefaultTerminalHTTP...),
		TransientGRPC:  append([]int(nil), DefaultTransientGRPC...),
		Breaker: BreakerConfig{
			Mode:                BreakerConsecutive,
			Scope:               ScopeTenantTarget,
			ConsecutiveFailures: 5,
			FailureRate:         0.5,
			Window:              time.Minute,
			MinCalls:            20,
			Cooldown:            time.Minute,
			HalfOpenProbes:      1,
			ProbeTimeout:        30 * time.Second,
		},
	}
}
