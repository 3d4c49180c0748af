package fleet

import "github.com/policyd/policyd/policy"

// BreakerResult returns what a failed attempt means to its breaker: a
// terminal (or unclassified) failure means the upstream answered
// (policy.ResultTerminal); a transient one is a failure
// (policy.ResultTransientFailure), unless it carried a pushback hint
// (hinted: a usable Retry-After, grpc-retry-pushback-ms, X-RateLimit-Reset
// or x-amz-retry-after) and cfg.CountPushback is off. Then it is
// policy.ResultPushback: the upstream is up and asked for time, the
// fleet-wide cool-down makes every worker wait for it, and the breaker
// counts nothing, so 20 workers told "503, Retry-After: 1" at once do not
// trip a breaker of threshold 5 and stay out for its whole cool-down.
func BreakerResult(c policy.Category, hinted bool, cfg *policy.BreakerConfig) policy.Result {
	switch {
	case c != policy.CategoryTransient:
		return policy.ResultTerminal
	case hinted && !cfg.CountPushback:
		return policy.ResultPushback
	}
	return policy.ResultTransientFailure
}
