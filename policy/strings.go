package policy

import "strconv"

// enumString returns names[v] when v indexes a non-empty name, and
// "prefix(v)" otherwise, the way stringer spells unknown values.
func enumString(names []string, prefix string, v uint8) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return prefix + "(" + strconv.Itoa(int(v)) + ")"
}

var categoryNames = []string{
	CategoryUnspecified:  "UNSPECIFIED",
	CategoryTransient:    "TRANSIENT",
	CategoryTerminal:     "TERMINAL",
	CategoryUnclassified: "UNCLASSIFIED",
}

// String returns the category's name as the API spells it, e.g. "TRANSIENT".
func (c Category) String() string { return enumString(categoryNames, "Category", uint8(c)) }

var failureKindNames = []string{
	FailureUnspecified: "UNSPECIFIED",
	FailureHTTP:        "HTTP",
	FailureGRPC:        "GRPC",
	FailureTransport:   "TRANSPORT",
	FailureLocal:       "LOCAL",
}

// String returns the failure kind's name, e.g. "HTTP".
func (k FailureKind) String() string { return enumString(failureKindNames, "FailureKind", uint8(k)) }

var transportKindNames = []string{
	TransportUnspecified:       "UNSPECIFIED",
	TransportTimeout:           "TIMEOUT",
	TransportConnectionReset:   "CONNECTION_RESET",
	TransportConnectionRefused: "CONNECTION_REFUSED",
	TransportDNS:               "DNS",
	TransportTLS:               "TLS",
}

// String returns the transport failure's name as the API spells it, e.g.
// "CONNECTION_RESET".
func (k TransportKind) String() string {
	return enumString(transportKindNames, "TransportKind", uint8(k))
}

var localKindNames = []string{
	LocalUnspecified: "UNSPECIFIED",
	LocalParse:       "PARSE",
	LocalValidation:  "VALIDATION",
}

// String returns the local failure's name as the API spells it, e.g. "PARSE".
func (k LocalKind) String() string { return enumString(localKindNames, "LocalKind", uint8(k)) }

var jitterNames = []string{
	JitterUnspecified:  "UNSPECIFIED",
	JitterNone:         "NONE",
	JitterFull:         "FULL",
	JitterEqual:        "EQUAL",
	JitterDecorrelated: "DECORRELATED",
}

// String returns the jitter mode's name as the API spells it, e.g. "FULL".
func (j Jitter) String() string { return enumString(jitterNames, "Jitter", uint8(j)) }

var retryAfterModeNames = []string{
	RetryAfterUnspecified: "UNSPECIFIED",
	RetryAfterMax:         "MAX",
	RetryAfterOverride:    "OVERRIDE",
}

// String returns the pushback mode's name as the API spells it, e.g. "MAX".
func (m RetryAfterMode) String() string {
	return enumString(retryAfterModeNames, "RetryAfterMode", uint8(m))
}

var breakerModeNames = []string{
	BreakerModeUnspecified: "UNSPECIFIED",
	BreakerConsecutive:     "CONSECUTIVE",
	BreakerFailureRate:     "FAILURE_RATE",
}

// String returns the breaker mode's name as the API spells it, e.g.
// "CONSECUTIVE".
func (m BreakerMode) String() string { return enumString(breakerModeNames, "BreakerMode", uint8(m)) }

var breakerScopeNames = []string{
	ScopeUnspecified:  "UNSPECIFIED",
	ScopeTenantTarget: "TENANT_TARGET",
	ScopeTarget:       "TARGET",
}

// String returns the breaker scope's name as the API spells it, e.g.
// "TENANT_TARGET".
func (s BreakerScope) String() string {
	return enumString(breakerScopeNames, "BreakerScope", uint8(s))
}

var stopReasonNames = []string{
	StopNone:              "NONE",
	StopTerminal:          "TERMINAL",
	StopNotIdempotent:     "NOT_IDEMPOTENT",
	StopAttemptsExhausted: "ATTEMPTS_EXHAUSTED",
	StopDeadline:          "DEADLINE",
	StopBudgetExhausted:   "BUDGET_EXHAUSTED",
	StopCircuitOpen:       "CIRCUIT_OPEN",
	StopServerPushback:    "SERVER_PUSHBACK",
}

// String returns the stop reason's name as the API spells it, e.g.
// "ATTEMPTS_EXHAUSTED"; StopNone is "NONE".
func (r StopReason) String() string { return enumString(stopReasonNames, "StopReason", uint8(r)) }

var dispositionNames = []string{
	DispositionNone:           "NONE",
	DispositionSucceeded:      "SUCCEEDED",
	DispositionFailedTerminal: "FAILED_TERMINAL",
	DispositionDeadLetter:     "DEAD_LETTER",
	DispositionDeadlineCut:    "DEADLINE_CUT",
	DispositionCircuitOpen:    "CIRCUIT_OPEN",
}

// String returns the disposition's name as the API spells it, e.g.
// "DEAD_LETTER"; DispositionNone is "NONE".
func (d Disposition) String() string {
	return enumString(dispositionNames, "Disposition", uint8(d))
}
