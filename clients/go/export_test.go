package policyclient

import (
	"context"
	"errors"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// WaitBreakerState blocks until c's breaker cache shows target in state st.
func WaitBreakerState(ctx context.Context, c *Client, target string, st pb.BreakerState) error {
	for {
		ch := c.breakers.next()
		if b, ok := c.breakers.lookup(target); ok && b.state == st {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

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
