package policyclient

import (
	"context"

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
