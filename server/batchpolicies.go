package server

import "github.com/policyd/policyd/policy"

// batchPolicies resolves each tenant and target of one ReportOutcome batch
// once: an outcome's breaker, classification and lease follow the
// effective policies of its call's primary and its attempt's target, and a
// batch of a hundred outcomes names a few of them. It is working memory of
// outcomeScratch, reused from request to request; it is not safe for
// concurrent use.
type batchPolicies struct {
	index   map[policy.PolicyScope]int // into entries
	entries []batchPolicy
	last    int // the entry the last resolve returned: consecutive outcomes often share one
}

// batchPolicy is the effective policy of one tenant and target.
type batchPolicy struct {
	scope policy.PolicyScope
	p     policy.Policy
}

// resolve returns the index in b.entries of the effective policy of tenant
// and target, resolving it from st the first time the batch names them.
// It returns an index, not a pointer: a later resolve may move b.entries.
func (b *batchPolicies) resolve(st Policies, tenant, target string) int {
	k := policy.PolicyScope{Tenant: tenant, Target: target}
	if b.last < len(b.entries) && b.entries[b.last].scope == k {
		return b.last
	}
	if i, ok := b.index[k]; ok {
		b.last = i
		return i
	}
	if b.index == nil {
		b.index = make(map[policy.PolicyScope]int)
	}
	p, _ := st.Resolve(tenant, target)
	b.entries = append(b.entries, batchPolicy{scope: k, p: p})
	b.last = len(b.entries) - 1
	b.index[k] = b.last
	return b.last
}

// at returns the policy of entry i.
func (b *batchPolicies) at(i int) *policy.Policy { return &b.entries[i].p }

// reset empties b for the next batch, keeping its memory but no request's
// strings or policies.
func (b *batchPolicies) reset() {
	clear(b.index)
	clear(b.entries)
	b.entries, b.last = b.entries[:0], 0
}
