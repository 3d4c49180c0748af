package policy

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Errors of hint parsing. Returned errors wrap one of them; match with
// errors.Is.
var (
	// ErrHintUnparseable reports a hint that is not a valid value of its
	// header.
	ErrHintUnparseable = errors.New("policy: unparseable hint")
	// ErrHintNegative reports a hint with a negative value.
	ErrHintNegative = errors.New("policy: negative hint")
)

// MaxHintDelay is the longest wait a server hint is read as, 10^9 seconds
// (about 31.7 years). A valid hint asking for longer, however many digits it
// has, saturates at MaxHintDelay: it is still a valid hint, and
// Pushback.MaxHint caps what is honoured far below this (Hint.Capped).
const MaxHintDelay = 1_000_000_000 * time.Second

// The errors below are built once so that parsing never allocates to report
// a bad value.
var (
	errHintEmpty  = fmt.Errorf("%w: empty value", ErrHintUnparseable)
	errHintSyntax = fmt.Errorf("%w: not an integer", ErrHintUnparseable)
	errHintDate   = fmt.Errorf("%w: neither delta-seconds nor an HTTP-date", ErrHintUnparseable)
	errHintNeg    = fmt.Errorf("%w: below zero", ErrHintNegative)
)

// Sources of hints, as Hint.Source names them.
const (
	SourceRetryAfter          = "retry_after"
	SourceGRPCRetryPushbackMs = "grpc_retry_pushback_ms"
	SourceXRateLimitReset     = "x_ratelimit_reset"
	SourceXAmzRetryAfter      = "x_amz_retry_after"
)

// Hints are the raw values of a response's pushback headers, as received.
// An empty string means the header was absent.
type Hints struct {
	RetryAfter      string // HTTP Retry-After: delta-seconds or an HTTP-date
	GRPCPushbackMs  string // grpc-retry-pushback-ms: integer milliseconds; negative means do not retry
	XRateLimitReset string // X-RateLimit-Reset: seconds until reset, or Unix seconds above 10^9
	XAmzRetryAfter  string // x-amz-retry-after: integer milliseconds
}

// Hint is what the server asked for, parsed from Hints.
type Hint struct {
	// Present is true when a usable hint was found, including a do-not-retry.
	Present bool
	// Delay is the server's requested wait, in [0, MaxHintDelay], before
	// spreading and capping.
	Delay time.Duration
	// Capped is true when Delay is longer than the maximum hint honoured,
	// so that the wait is cut to that maximum.
	Capped bool
	// DoNotRetry is true when grpc-retry-pushback-ms was negative.
	DoNotRetry bool
	// Source names the header the hint came from, e.g. "retry_after"; empty
	// without a usable hint.
	Source string
	// Note says, machine-readably, how each given header was used or why it
	// was ignored, e.g. "retry_after:used" or
	// "retry_after:ignored:unparseable,x_amz_retry_after:used", in the order
	// of the Hints fields. A valid hint that lost to a larger one or to a
	// do-not-retry is "superseded"; a used hint cut to the maximum hint is
	// "used:capped". Empty when no header was given.
	Note string
}

// hintState is the outcome of parsing one header.
type hintState uint8

const (
	hintAbsent hintState = iota
	hintOK
	hintUnparseable
	hintNegative
	hintDoNotRetry
	hintSuperseded // set after comparison
	hintCapped     // used, and longer than the maximum hint; set after comparison
)

// Indexes of the sources, in the order of the Hints fields.
const (
	idxRetryAfter = iota
	idxGRPCPushback
	idxRateLimitReset
	idxAmzRetryAfter
)

// hintSources names the sources by index.
var hintSources = [...]string{
	idxRetryAfter:     SourceRetryAfter,
	idxGRPCPushback:   SourceGRPCRetryPushbackMs,
	idxRateLimitReset: SourceXRateLimitReset,
	idxAmzRetryAfter:  SourceXAmzRetryAfter,
}

// hintNotes holds the note of every source and outcome; hintOK means used.
var hintNotes = func() (t [len(hintSources)][hintCapped + 1]string) {
	for i, s := range hintSources {
		t[i][hintOK] = s + ":used"
		t[i][hintUnparseable] = s + ":ignored:unparseable"
		t[i][hintNegative] = s + ":ignored:negative"
		t[i][hintDoNotRetry] = s + ":do_not_retry"
		t[i][hintSuperseded] = s + ":superseded"
		t[i][hintCapped] = s + ":used:capped"
	}
	return t
}()

// parseInteger parses a decimal integer with an optional leading '-' and
// surrounding white space. A negative value gives errHintNeg whatever its
// magnitude, but "-0" is 0; a value above limit, however many digits it has,
// saturates at limit.
func parseInteger(s string, limit int64) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, errHintEmpty
	}
	neg := s[0] == '-'
	if neg {
		s = s[1:]
	}
	if s == "" {
		return 0, errHintSyntax
	}
	var v int64
	over := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, errHintSyntax
		}
		if !over {
			v = v*10 + int64(c-'0')
			over = v > limit
		}
	}
	switch {
	case neg && v != 0:
		return 0, errHintNeg
	case over:
		return limit, nil
	}
	return v, nil
}

// hintUntil returns the wait from now until t: 0 for a past t, saturating
// at MaxHintDelay (t.Sub itself saturates, so no distance overflows).
func hintUntil(t, now time.Time) time.Duration {
	return min(max(t.Sub(now), 0), MaxHintDelay)
}

// Layouts of the three HTTP-date forms of RFC 9110, section 5.6.7. "GMT" is
// literal text here, so parsing never consults the local time zone.
const (
	layoutIMFFixdate = "Mon, 02 Jan 2006 15:04:05 GMT"
	layoutRFC850     = "Monday, 02-Jan-06 15:04:05 GMT"
	layoutASCTime    = "Mon Jan _2 15:04:05 2006"
)

// parseHTTPDate parses s in any of the three HTTP-date forms. A two-digit
// RFC 850 year is read as RFC 9110 asks: a year more than 50 years after
// now's is taken from the previous century.
func parseHTTPDate(s string, now time.Time) (time.Time, error) {
	comma := strings.IndexByte(s, ',')
	switch {
	case comma == 3:
		return time.Parse(layoutIMFFixdate, s)
	case comma > 3:
		t, err := time.Parse(layoutRFC850, s)
		if err != nil {
			return t, err
		}
		ny := now.Year()
		year := ny - ny%100 + t.Year()%100
		switch {
		case year > ny+50:
			year -= 100
		case year <= ny-50:
			year += 100
		}
		return time.Date(year, t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), 0, time.UTC), nil
	default:
		return time.Parse(layoutASCTime, s)
	}
}

// ParseRetryAfter parses an HTTP Retry-After value v at time now and returns
// the wait it asks for. v is delta-seconds (a non-negative decimal integer) or
// an HTTP-date in any of the three RFC 9110 forms: IMF-fixdate ("Sun, 06 Nov
// 1994 08:49:37 GMT"), obsolete RFC 850 ("Sunday, 06-Nov-94 08:49:37 GMT") or
// ANSI C asctime ("Sun Nov  6 08:49:37 1994"). Surrounding white space is
// ignored. A date in the past gives 0; a wait beyond MaxHintDelay (a delta of
// any length, a date in year 9999) gives MaxHintDelay.
//
// Errors wrap ErrHintNegative for a negative delta and ErrHintUnparseable for
// anything else that is not valid.
func ParseRetryAfter(v string, now time.Time) (time.Duration, error) {
	s := strings.TrimSpace(v)
	if s == "" {
		return 0, errHintEmpty
	}
	if c := s[0]; c == '-' || (c >= '0' && c <= '9') {
		n, err := parseInteger(s, int64(MaxHintDelay/time.Second))
		if err != nil {
			return 0, err
		}
		return time.Duration(n) * time.Second, nil
	}
	t, err := parseHTTPDate(s, now)
	if err != nil {
		return 0, errHintDate
	}
	return hintUntil(t, now), nil
}

// parseMillis parses an integer count of milliseconds, saturating at
// MaxHintDelay.
func parseMillis(v string) (time.Duration, error) {
	n, err := parseInteger(v, int64(MaxHintDelay/time.Millisecond))
	if err != nil {
		return 0, err
	}
	return time.Duration(n) * time.Millisecond, nil
}

// unixThreshold is the X-RateLimit-Reset value above which it is a Unix time
// in seconds rather than a count of seconds.
const unixThreshold = 1_000_000_000

// maxUnixSeconds is where X-RateLimit-Reset values saturate as Unix times
// (year 2286): from any now before year 2255 that is beyond MaxHintDelay.
const maxUnixSeconds = 9_999_999_999

// parseRateLimitReset parses X-RateLimit-Reset: seconds until the reset, or
// a Unix time in seconds when the value exceeds 10^9 (a past time gives 0,
// a far one MaxHintDelay).
func parseRateLimitReset(v string, now time.Time) (time.Duration, error) {
	n, err := parseInteger(v, maxUnixSeconds)
	if err != nil {
		return 0, err
	}
	if n > unixThreshold {
		return hintUntil(time.Unix(n, 0), now), nil
	}
	return time.Duration(n) * time.Second, nil
}

// stateOf maps a parse error to its outcome.
func stateOf(err error) hintState {
	switch {
	case err == nil:
		return hintOK
	case errors.Is(err, ErrHintNegative):
		return hintNegative
	default:
		return hintUnparseable
	}
}

// ParseHints parses every given header of h at time now and combines them.
// When several give a valid delay, the largest wins (no server is undercut;
// ties go to the first in field order); a negative grpc-retry-pushback-ms
// means do not retry and wins over everything. Unparseable and negative
// values are ignored, and Note says so. A winning delay longer than maxHint
// (when maxHint > 0) is Capped, and its note says "used:capped"; Delay keeps
// the server's value. ParseHints does not allocate when at most one header is
// given.
func ParseHints(h Hints, now time.Time, maxHint time.Duration) Hint {
	if h == (Hints{}) {
		return Hint{}
	}
	values := [len(hintSources)]string{
		idxRetryAfter:     h.RetryAfter,
		idxGRPCPushback:   h.GRPCPushbackMs,
		idxRateLimitReset: h.XRateLimitReset,
		idxAmzRetryAfter:  h.XAmzRetryAfter,
	}
	var (
		states [len(hintSources)]hintState
		delays [len(hintSources)]time.Duration
		err    error
	)
	given, last, best := 0, 0, -1
	dnr := false
	for i, v := range values {
		if v == "" {
			continue
		}
		given, last = given+1, i
		switch i {
		case idxRetryAfter:
			delays[i], err = ParseRetryAfter(v, now)
		case idxRateLimitReset:
			delays[i], err = parseRateLimitReset(v, now)
		default: // idxGRPCPushback, idxAmzRetryAfter
			delays[i], err = parseMillis(v)
		}
		states[i] = stateOf(err)
		if states[i] == hintNegative && i == idxGRPCPushback {
			states[i] = hintDoNotRetry
			dnr = true
			best = i
		}
		if states[i] == hintOK && !dnr && (best < 0 || delays[i] > delays[best]) {
			best = i
		}
	}
	var out Hint
	if best >= 0 {
		out = Hint{Present: true, DoNotRetry: dnr, Source: hintSources[best]}
		if !dnr {
			out.Delay = delays[best]
			out.Capped = maxHint > 0 && out.Delay > maxHint
		}
	}
	for i := range states {
		switch {
		case states[i] == hintOK && i != best:
			states[i] = hintSuperseded
		case states[i] == hintOK && out.Capped:
			states[i] = hintCapped
		}
	}
	if given == 1 {
		out.Note = hintNotes[last][states[last]]
		return out
	}
	var b strings.Builder
	for i, s := range states {
		if s == hintAbsent {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(hintNotes[i][s])
	}
	out.Note = b.String()
	return out
}

// SpreadHint widens the server's requested wait h into a wait in
// [h, h+spread], with spread = max(p.SpreadRatio*h, p.MinSpread) and u in
// [0, 1) choosing the point, so that callers given the same hint do not all
// wake at one instant. h is first capped at p.MaxHint (when > 0); the result
// is never below the capped h. A negative h counts as 0.
func SpreadHint(p Pushback, h time.Duration, u float64) time.Duration {
	if h < 0 {
		h = 0
	}
	if p.MaxHint > 0 && h > p.MaxHint {
		h = p.MaxHint
	}
	spread := durationOf(p.SpreadRatio * float64(h))
	if spread < p.MinSpread {
		spread = p.MinSpread
	}
	return addSat(h, scale(spread, unit(u)))
}
