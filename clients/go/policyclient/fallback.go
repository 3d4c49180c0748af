package policyclient

import (
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// localPolicy is the copy of policyd's default policy the client decides
// with while policyd cannot be reached. It keeps to the same rules (tables,
// FULL jitter, hints never undercut, deadline checked before the wait) and
// adds a local retry budget so a fleet cut off from policyd cannot storm.
type localPolicy struct {
	base, max   time.Duration
	factor      float64
	maxAttempts int
	budget      *localBudget
}

func newLocalPolicy(cfg Config) *localPolicy {
	return &localPolicy{
		base: 500 * time.Millisecond, max: 30 * time.Second, factor: 2,
		maxAttempts: 3,
		budget:      &localBudget{capacity: cfg.LocalBudget, tokens: cfg.LocalBudget, perSecond: cfg.LocalBudgetPerSecond},
	}
}

// classify returns the category and reason policyd's default tables give.
func (p *localPolicy) classify(f *pb.Failure, idempotent, hasKey bool) (pb.Category, string) {
	cat, reason, safeUnsent := classifyDefault(f)
	if cat == pb.Category_CATEGORY_TRANSIENT && !idempotent && !hasKey && !safeUnsent {
		return cat, "unsafe:not_idempotent"
	}
	return cat, reason
}

func classifyDefault(f *pb.Failure) (cat pb.Category, reason string, safeUnsent bool) {
	switch k := f.GetKind().(type) {
	case *pb.Failure_HttpStatus:
		c := strconv.Itoa(int(k.HttpStatus))
		switch k.HttpStatus {
		case 429, 500, 502, 503, 504:
			return pb.Category_CATEGORY_TRANSIENT, "transient:" + c, false
		case 400, 401, 403, 404, 422:
			return pb.Category_CATEGORY_TERMINAL, "terminal:" + c, false
		}
		return pb.Category_CATEGORY_UNCLASSIFIED, "unclassified:" + c, false
	case *pb.Failure_GrpcCode:
		name := "grpc_" + strings.ToLower(grpcCodeName(k.GrpcCode))
		switch k.GrpcCode {
		case 14, 8, 4, 10:
			return pb.Category_CATEGORY_TRANSIENT, "transient:" + name, false
		}
		return pb.Category_CATEGORY_TERMINAL, "terminal:" + name, false
	case *pb.Failure_TransportError:
		switch k.TransportError {
		case pb.TransportError_TRANSPORT_ERROR_TIMEOUT:
			return pb.Category_CATEGORY_TRANSIENT, "transport:timeout", false
		case pb.TransportError_TRANSPORT_ERROR_CONNECTION_RESET:
			return pb.Category_CATEGORY_TRANSIENT, "transport:connection_reset", false
		case pb.TransportError_TRANSPORT_ERROR_CONNECTION_REFUSED:
			return pb.Category_CATEGORY_TRANSIENT, "transport:connection_refused", true
		case pb.TransportError_TRANSPORT_ERROR_DNS:
			return pb.Category_CATEGORY_TRANSIENT, "transport:dns", true
		}
		return pb.Category_CATEGORY_TERMINAL, "transport:tls", false
	case *pb.Failure_LocalError:
		if k.LocalError == pb.LocalError_LOCAL_ERROR_VALIDATION {
			return pb.Category_CATEGORY_TERMINAL, "local:validation", false
		}
		return pb.Category_CATEGORY_TERMINAL, "local:parse", false
	}
	return pb.Category_CATEGORY_UNCLASSIFIED, "unclassified:unknown", false
}

var grpcCodeNames = [...]string{"OK", "CANCELED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
	"ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"}

func grpcCodeName(c uint32) string {
	if int(c) < len(grpcCodeNames) {
		return grpcCodeNames[c]
	}
	return strconv.Itoa(int(c))
}

// decide is NextDelay, locally. attempt is the attempt that failed;
// attemptTimeout is the timeout the next attempt would get, reserved before
// the wait as policyd does.
func (p *localPolicy) decide(now, deadline time.Time, attempt int, f failure, idempotent, hasKey bool, timeout bool,
	attemptTimeout time.Duration) decision {
	cat, reason := p.classify(f.pb, idempotent, hasKey)
	d := decision{reason: reason, fallback: true, attemptTimeout: attemptTimeout}
	switch {
	case cat != pb.Category_CATEGORY_TRANSIENT:
		return d.stop(pb.StopReason_STOP_REASON_TERMINAL, pb.Disposition_DISPOSITION_FAILED_TERMINAL)
	case reason == "unsafe:not_idempotent":
		return d.stop(pb.StopReason_STOP_REASON_NOT_IDEMPOTENT, pb.Disposition_DISPOSITION_DEAD_LETTER)
	case attempt >= p.maxAttempts:
		return d.stop(pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED, pb.Disposition_DISPOSITION_DEAD_LETTER)
	}
	hint, doNotRetry := parseHints(f.pushback, now)
	if doNotRetry {
		return d.stop(pb.StopReason_STOP_REASON_SERVER_PUSHBACK, pb.Disposition_DISPOSITION_DEAD_LETTER)
	}
	nominal := float64(p.base) * math.Pow(p.factor, float64(attempt-1))
	delay := time.Duration(rand.Float64() * min(nominal, float64(p.max)))
	if hint > 0 {
		spread := max(hint/10, 250*time.Millisecond)
		delay = max(delay, hint+time.Duration(rand.Float64()*float64(spread)))
	}
	if !deadline.IsZero() && now.Add(delay+attemptTimeout).After(deadline) {
		return d.stop(pb.StopReason_STOP_REASON_DEADLINE, pb.Disposition_DISPOSITION_DEAD_LETTER)
	}
	cost := 1.0
	if timeout {
		cost = 2
	}
	if !p.budget.take(now, cost) {
		return d.stop(pb.StopReason_STOP_REASON_BUDGET_EXHAUSTED, pb.Disposition_DISPOSITION_DEAD_LETTER)
	}
	d.retry, d.delay = true, delay
	return d
}

// maxHint caps a server's hint, as policyd's default max_hint does.
const maxHint = time.Hour

// parseHints reads every pushback header as policyd does: the largest
// valid hint wins (capped at maxHint, however large the value), a negative
// grpc-retry-pushback-ms means do not retry ("-0" is zero), and anything
// unparseable is ignored.
func parseHints(p *pb.Pushback, now time.Time) (hint time.Duration, doNotRetry bool) {
	if p == nil {
		return 0, false
	}
	const maxMs = int64(maxHint / time.Millisecond)
	if ms, ok := parseHintInt(p.GetGrpcRetryPushbackMs()); ok {
		if ms < 0 {
			return 0, true
		}
		hint = max(hint, time.Duration(min(ms, maxMs))*time.Millisecond)
	}
	if d, ok := parseRetryAfter(p.GetRetryAfter(), now); ok {
		hint = max(hint, d)
	}
	if ms, ok := parseHintInt(p.GetXAmzRetryAfter()); ok && ms >= 0 {
		hint = max(hint, time.Duration(min(ms, maxMs))*time.Millisecond)
	}
	if v, ok := parseHintInt(p.GetXRatelimitReset()); ok && v >= 0 {
		if v > 1e9 { // a Unix time
			hint = max(hint, time.Unix(min(v, 1<<40), 0).Sub(now))
		} else {
			hint = max(hint, time.Duration(v)*time.Second)
		}
	}
	return min(hint, maxHint), false
}

// parseHintInt reads a decimal integer with an optional '-' and surrounding
// white space, saturating at the int64 limits however many digits it has;
// "-0" is 0.
func parseHintInt(v string) (int64, bool) {
	v = strings.TrimSpace(v)
	neg := strings.HasPrefix(v, "-")
	if neg {
		v = v[1:]
	}
	if v == "" {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n <= (math.MaxInt64-9)/10 {
			n = n*10 + int64(c-'0')
		} else {
			n = math.MaxInt64
		}
	}
	if neg {
		return -n, true
	}
	return n, true
}

// parseRetryAfter reads delta-seconds (of any length, capped at maxHint) or
// an HTTP-date (all three RFC 9110 forms, via net/http); anything else is
// ignored.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, ok := parseHintInt(v); ok {
		// A negative delay is no hint.
		return time.Duration(min(s, int64(maxHint/time.Second))) * time.Second, s >= 0
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// localBudget is a token bucket for retries decided locally.
type localBudget struct {
	mu        sync.Mutex
	capacity  float64
	tokens    float64
	perSecond float64
	last      time.Time
}

func (b *localBudget) take(now time.Time, cost float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.last.IsZero() && now.After(b.last) {
		b.tokens = min(b.capacity, b.tokens+now.Sub(b.last).Seconds()*b.perSecond)
	}
	b.last = now
	if b.tokens < cost {
		return false
	}
	b.tokens -= cost
	return true
}

func (b *localBudget) deposit(n float64) {
	b.mu.Lock()
	b.tokens = min(b.capacity, b.tokens+n)
	b.mu.Unlock()
}
