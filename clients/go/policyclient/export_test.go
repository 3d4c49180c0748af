package policyclient

import (
	"context"
	"errors"
	"slices"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// ClassifyLocal is the local fallback's classification of f, for the shared
// test vectors.
func ClassifyLocal(f *pb.Failure, idempotent, hasKey bool) (pb.Category, string) {
	return (&localPolicy{}).classify(f, idempotent, hasKey)
}

// LocalHint is the local fallback's reading of the pushback headers of
// an HTTP error err (from HTTPError) received at now: the hint it honours
// and whether the server said not to retry, for the shared test vectors.
func LocalHint(err error, now time.Time) (time.Duration, bool) {
	var he *HTTPStatusError
	if !errors.As(err, &he) {
		return 0, false
	}
	return parseHints(&pb.Pushback{RetryAfter: he.RetryAfter, GrpcRetryPushbackMs: he.GRPCPushbackMs,
		XRatelimitReset: he.XRateLimitReset, XAmzRetryAfter: he.XAmzRetryAfter}, now)
}

// WatchReconnects runs c's breaker watch (c made with NoWatch, so it runs
// no watch of its own) on a fake clock until it has waited n times, and
// returns the waits. draw is the jitter's source of numbers in [0, 1).
func WatchReconnects(c *Client, n int, draw func() float64) []time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var waits []time.Duration
	sleep := func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		if len(waits) == n {
			cancel()
		}
		return ctx.Err()
	}
	c.breakers.watch(ctx, c, sleep, draw)
	return waits
}

// LocalVerdict is how the client reads an error fn returned (err, received
// at now) and how its local fallback classifies it: category, reason, the
// hint it honours and whether the server said not to retry, for the shared
// test vectors.
func LocalVerdict(err error, idempotent bool, now time.Time) (pb.Category, string, time.Duration, bool) {
	f := classifyError(err, false)
	cat, reason := (&localPolicy{}).classify(f.pb, idempotent, false)
	hint, dnr := time.Duration(0), false
	if f.pushback != nil {
		hint, dnr = parseHints(f.pushback, now)
	}
	return cat, reason, hint, dnr
}

// LocalChainRoute is the local fallback's target for attempt of a call to
// primary under the fallback fb with the breakers of open open (ok false:
// the call stops CIRCUIT_OPEN), for the shared test vectors.
func LocalChainRoute(primary string, fb *pb.FallbackSettings, attempt int, open []string) (string, bool) {
	ch := chainFromPB(fb)
	return ch.route(primary, attempt, func(t string) bool { return slices.Contains(open, t) })
}
