package policy

import "strconv"

// Classification is the verdict on one failure.
type Classification struct {
	// Retryable is true when the failure is transient and repeating the
	// operation is safe.
	Retryable bool
	// Category is the failure's class. A transient failure that is unsafe to
	// repeat keeps CategoryTransient and has Retryable false.
	Category Category
	// Reason is machine-readable, e.g. "transient:503", "terminal:grpc_not_found",
	// "transport:timeout", "unclassified:418" or "unsafe:not_idempotent".
	Reason string
}

// ReasonNotIdempotent is the reason of a transient failure that is not
// retried because the operation is neither idempotent nor carries an
// idempotency key.
const ReasonNotIdempotent = "unsafe:not_idempotent"

// Reasons of failures outside every table whose kind carries no code.
const (
	reasonUnspecified      = "unclassified:unspecified"
	reasonTransportUnknown = "unclassified:transport"
	reasonLocalUnknown     = "unclassified:local"
)

// HTTP statuses with precomputed reasons; the tables are what keeps Classify
// free of allocations.
const (
	httpFirst = 100
	httpLast  = 599
)

// grpcNames are the gRPC status codes 1..16 in lower snake case.
var grpcNames = [...]string{
	1:  "canceled",
	2:  "unknown",
	3:  "invalid_argument",
	4:  "deadline_exceeded",
	5:  "not_found",
	6:  "already_exists",
	7:  "permission_denied",
	8:  "resource_exhausted",
	9:  "failed_precondition",
	10: "aborted",
	11: "out_of_range",
	12: "unimplemented",
	13: "internal",
	14: "unavailable",
	15: "data_loss",
	16: "unauthenticated",
}

const grpcLast = len(grpcNames) - 1

// reasonTables holds every reason Classify returns for a code, indexed by
// category and code, built once at package initialisation.
type reasonTables struct {
	http [CategoryUnclassified + 1][httpLast - httpFirst + 1]string
	grpc [CategoryUnclassified + 1][grpcLast + 1]string
}

var reasons = buildReasons()

var categoryPrefixes = [CategoryUnclassified + 1]string{
	CategoryTransient:    "transient:",
	CategoryTerminal:     "terminal:",
	CategoryUnclassified: "unclassified:",
}

func buildReasons() *reasonTables {
	t := new(reasonTables)
	for c := CategoryTransient; c <= CategoryUnclassified; c++ {
		for code := httpFirst; code <= httpLast; code++ {
			t.http[c][code-httpFirst] = categoryPrefixes[c] + strconv.Itoa(code)
		}
		for code := 0; code <= grpcLast; code++ {
			name := grpcNames[code]
			if name == "" {
				name = strconv.Itoa(code)
			}
			t.grpc[c][code] = categoryPrefixes[c] + "grpc_" + name
		}
	}
	return t
}

// httpReason returns the reason for HTTP status code in category c; it
// allocates only for codes outside 100..599.
func httpReason(c Category, code int) string {
	if code >= httpFirst && code <= httpLast {
		return reasons.http[c][code-httpFirst]
	}
	return categoryPrefixes[c] + strconv.Itoa(code)
}

// grpcReason returns the reason for gRPC code in category c; it allocates
// only for codes outside 0..16.
func grpcReason(c Category, code int) string {
	if code >= 0 && code <= grpcLast {
		return reasons.grpc[c][code]
	}
	return categoryPrefixes[c] + "grpc_" + strconv.Itoa(code)
}

var transportClasses = [...]Classification{
	TransportTimeout:           {Retryable: true, Category: CategoryTransient, Reason: "transport:timeout"},
	TransportConnectionReset:   {Retryable: true, Category: CategoryTransient, Reason: "transport:connection_reset"},
	TransportConnectionRefused: {Retryable: true, Category: CategoryTransient, Reason: "transport:connection_refused"},
	TransportDNS:               {Retryable: true, Category: CategoryTransient, Reason: "transport:dns"},
	TransportTLS:               {Category: CategoryTerminal, Reason: "transport:tls"},
}

var localClasses = [...]Classification{
	LocalParse:      {Category: CategoryTerminal, Reason: "local:parse"},
	LocalValidation: {Category: CategoryTerminal, Reason: "local:validation"},
}

// defaultPolicy stands in for a nil *Policy. It is never modified.
var defaultPolicy = Default()

func containsCode(table []int, code int) bool {
	for _, c := range table {
		if c == code {
			return true
		}
	}
	return false
}

// neverSent reports whether f proves that the request never left the caller,
// which makes repeating it safe even for a non-idempotent operation.
func neverSent(f Failure) bool {
	return f.Kind == FailureTransport &&
		(f.Transport == TransportConnectionRefused || f.Transport == TransportDNS)
}

// Classify applies p's classification tables to failure f. HTTP statuses in
// p.TransientHTTP are transient, those in p.TerminalHTTP terminal (the
// transient table wins when a code is in both), and any other status
// unclassified. gRPC codes 1..16 are transient when in p.TransientGRPC and
// terminal otherwise; any other code is unclassified. Timeouts, connection
// resets, refused connections and DNS failures are transient; TLS failures and
// local parse and validation errors are terminal.
//
// A transient failure of an operation that is neither idempotent nor carries
// an idempotency key is not retryable (Reason "unsafe:not_idempotent"), except
// a refused connection or a DNS failure: that request never left the caller.
//
// The tables are used as given: an empty table classifies nothing, so callers
// fill defaults first. A nil p means Default(). Classify does not allocate for
// HTTP statuses 100..599 and gRPC codes 0..16.
func Classify(p *Policy, f Failure, idempotent, hasIdempotencyKey bool) Classification {
	if p == nil {
		p = &defaultPolicy
	}
	var c Classification
	switch f.Kind {
	case FailureHTTP:
		switch {
		case containsCode(p.TransientHTTP, f.Code):
			c = Classification{Retryable: true, Category: CategoryTransient}
		case containsCode(p.TerminalHTTP, f.Code):
			c.Category = CategoryTerminal
		default:
			c.Category = CategoryUnclassified
		}
		c.Reason = httpReason(c.Category, f.Code)
	case FailureGRPC:
		switch {
		case f.Code < 1 || f.Code > grpcLast:
			c.Category = CategoryUnclassified
		case containsCode(p.TransientGRPC, f.Code):
			c = Classification{Retryable: true, Category: CategoryTransient}
		default:
			c.Category = CategoryTerminal
		}
		c.Reason = grpcReason(c.Category, f.Code)
	case FailureTransport:
		if int(f.Transport) < len(transportClasses) && transportClasses[f.Transport].Reason != "" {
			c = transportClasses[f.Transport]
		} else {
			c = Classification{Category: CategoryUnclassified, Reason: reasonTransportUnknown}
		}
	case FailureLocal:
		if int(f.Local) < len(localClasses) && localClasses[f.Local].Reason != "" {
			c = localClasses[f.Local]
		} else {
			c = Classification{Category: CategoryUnclassified, Reason: reasonLocalUnknown}
		}
	default:
		c = Classification{Category: CategoryUnclassified, Reason: reasonUnspecified}
	}
	if c.Category == CategoryTransient && !idempotent && !hasIdempotencyKey && !neverSent(f) {
		c.Retryable = false
		c.Reason = ReasonNotIdempotent
	}
	return c
}
