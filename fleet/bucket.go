package fleet

import "github.com/policyd/policyd/policy"

// Bucket is a tenant's retry token bucket: retries withdraw tokens,
// successes deposit a fraction of one, and a floor of tokens per second
// flows in over time, up to the budget's capacity. Last is the time (Unix
// ns) of the last refill. The budget itself is configuration the engine
// passes to every method, so one value serves an explicit budget and the
// default alike.
type Bucket struct {
	Tokens  float64
	Last    int64
	Granted uint64
	Refused uint64
	DryRun  uint64 // retries granted in dry run that the budget would have refused
}

// NewBucket returns a full bucket of budget b at now.
func NewBucket(b *policy.TenantBudget, now int64) Bucket {
	return Bucket{Tokens: b.Capacity, Last: now}
}

// Refill adds the tokens earned since the last refill, up to capacity.
func (k *Bucket) Refill(now int64, b *policy.TenantBudget) {
	if now > k.Last {
		k.Tokens += b.MinPerSecond * float64(now-k.Last) / 1e9
		k.Last = now
	}
	k.Tokens = min(k.Tokens, b.Capacity)
}

// Withdrawal is the answer of Withdraw.
type Withdrawal struct {
	Granted bool
	// DryRunRefused: granted only because the budget is in dry run.
	DryRunRefused bool
}

// Withdraw takes one retry at now: RetryCost tokens, TimeoutCost after a
// timeout. Without enough tokens the retry is refused, unless the budget is
// in dry run, where it is granted and counted, and the tokens stop at zero.
// Tokens never go below zero.
func (k *Bucket) Withdraw(now int64, b *policy.TenantBudget, timeout bool) Withdrawal {
	k.Refill(now, b)
	cost := b.RetryCost
	if timeout {
		cost = b.TimeoutCost
	}
	switch {
	case k.Tokens >= cost:
		k.Tokens -= cost
		k.Granted++
		return Withdrawal{Granted: true}
	case b.DryRun:
		k.Tokens = max(k.Tokens-cost, 0)
		k.Granted++
		k.DryRun++
		return Withdrawal{Granted: true, DryRunRefused: true}
	}
	k.Refused++
	return Withdrawal{}
}

// Deposit credits DepositRatio tokens per success at now, up to capacity.
func (k *Bucket) Deposit(now int64, b *policy.TenantBudget, successes int) {
	k.Refill(now, b)
	k.Tokens = min(k.Tokens+b.DepositRatio*float64(successes), b.Capacity)
}

// TokensAt returns the tokens the bucket holds at now without changing it.
func (k Bucket) TokensAt(now int64, b *policy.TenantBudget) float64 {
	t := k.Tokens
	if now > k.Last {
		t += b.MinPerSecond * float64(now-k.Last) / 1e9
	}
	return min(t, b.Capacity)
}

// Rebudget switches the bucket from budget old to budget new at now: tokens
// are refilled under old, then a full bucket stays full and others are
// capped at the new capacity.
func (k *Bucket) Rebudget(now int64, old, new *policy.TenantBudget) {
	k.Refill(now, old)
	if k.Tokens >= old.Capacity {
		k.Tokens = new.Capacity
	} else {
		k.Tokens = min(k.Tokens, new.Capacity)
	}
}

// Loaded clamps tokens read back from disk into [0, capacity].
func (k *Bucket) Loaded(b *policy.TenantBudget) {
	k.Tokens = min(max(k.Tokens, 0), b.Capacity)
}
