package server

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// The rules of AdviseTargets' advice (advise), in calls of the window.
const (
	// adviseMinCalls is the evidence threshold: below it the advice is
	// "not enough calls" and proposes nothing.
	adviseMinCalls = 50
	// adviseMinReached is how many calls must have reached the attempts
	// beyond k for them to be judged at all.
	adviseMinReached = 10
	// adviseRecovery is what the attempts beyond k must earn to be kept:
	// the share of the calls reaching attempt k+1 that they recover.
	adviseRecovery = 0.01

	defaultAdviseWindow = 24 * time.Hour
	minAdviseWindow     = time.Minute
)

// targetAdvice is what AdviseTargets says of one tenant and target.
type targetAdvice struct {
	stats          policy.TargetStats
	summary        string
	recommendation string
	// proposed is the policy with the change applied, nil when nothing
	// should change; changes lists the fields it changes.
	proposed *policy.Policy
	changes  []string
}

// advise says what the retries of one tenant's target earned over st's
// window and the change to p (the target's stored policy, or the
// effective one) that follows. The rule, in order:
//
//   - below adviseMinCalls calls (successes and final failures) in the
//     window: "not enough calls", nothing proposed;
//   - otherwise k is the smallest attempt count, from 1 to below the
//     highest attempt the policy allows (or that was seen), such that the
//     attempts beyond k recover (succeed on) less than adviseRecovery of
//     the calls that reached attempt k+1, judged only while at least
//     adviseMinReached calls reached it;
//   - with such a k below max_attempts: escalate after k attempts
//     (fallback.after_attempts = k) when p has fallback targets, else
//     max_attempts = k (never below 1); nothing when p says so already;
//   - without one: the retries earn their keep, nothing proposed.
//
// The summary says which share of the successes came on attempt 1 and
// which share of the calls whose first attempt failed the retries
// recovered.
//
// A target that stored policies of its tenant name as a fallback
// (fallbackOf) gets no proposal: the calls escalated to it go by their
// primary's policy, whose advice says what to change.
func advise(st policy.TargetStats, p policy.Policy, fallbackOf []string) targetAdvice {
	ad := targetAdvice{stats: st}
	succ, fail := &st.Successes, &st.Failures
	n := succ.Total() + fail.Total()
	seen := 0 // the highest attempt counted, from 1
	for i := range succ {
		if succ[i]+fail[i] > 0 {
			seen = i + 1
		}
	}
	highest := max(seen, min(p.MaxAttempts, policy.StatsAttempts))
	// reached(k) counts the calls that reached attempt k+1: those that did
	// not end within k attempts; recovered(k) those that then succeeded.
	reached := func(k int) uint64 {
		r := n
		for i := range k {
			r -= succ[i] + fail[i]
		}
		return r
	}
	recovered := func(k int) uint64 {
		var r uint64
		for i := k; i < policy.StatsAttempts; i++ {
			r += succ[i]
		}
		return r
	}

	var sum strings.Builder
	if s := succ.Total(); s > 0 {
		sum.WriteString(percent(succ[0], s) + " of successes on attempt 1")
	} else {
		sum.WriteString("no successes")
	}
	switch r1 := reached(1); {
	case highest < 2:
		sum.WriteString("; no retries")
	case r1 == 0:
		sum.WriteString("; no call reached attempt 2")
	default:
		sum.WriteString("; " + attemptRange(2, highest) + " recovered " + percent(recovered(1), r1) + " of failures")
	}
	ad.summary = sum.String()

	if len(fallbackOf) > 0 {
		ad.recommendation = "a fallback of " + strings.Join(fallbackOf, ", ") +
			": its escalated calls go by their primary's policy; see the primary's advice"
		return ad
	}
	if n < adviseMinCalls {
		ad.recommendation = "not enough calls: " + strconv.FormatUint(n, 10) + " in the window, " +
			strconv.Itoa(adviseMinCalls) + " needed"
		return ad
	}
	k := 0
	for j := 1; j < highest; j++ {
		r := reached(j)
		if r < adviseMinReached {
			break
		}
		if float64(recovered(j)) < adviseRecovery*float64(r) {
			k = j
			break
		}
	}
	keep := "keep max_attempts " + strconv.Itoa(p.MaxAttempts)
	switch {
	case k == 0 && reached(1) < adviseMinReached:
		ad.recommendation = keep + ": too few calls reached attempt 2 to judge the retries"
		return ad
	case k == 0 || k >= p.MaxAttempts:
		ad.recommendation = keep + ": the retries earn their keep"
		return ad
	}
	earned := ": " + attemptRange(k+1, highest) + " recovered " + percent(recovered(k), reached(k)) +
		" of the calls that reached them"
	next := p
	if len(p.Fallback.Targets) > 0 {
		ad.recommendation = "escalate after " + plural(k, "attempt") + earned
		if p.Fallback.AfterAttempts == k {
			ad.recommendation += " (it does already)"
			return ad
		}
		next.Fallback.Targets = append([]string(nil), p.Fallback.Targets...)
		next.Fallback.AfterAttempts = k
		ad.changes = []string{"fallback.after_attempts: " + strconv.Itoa(p.Fallback.AfterAttempts) + " -> " + strconv.Itoa(k)}
	} else {
		ad.recommendation = "max_attempts " + strconv.Itoa(k) + earned
		next.MaxAttempts = k
		ad.changes = []string{"max_attempts: " + strconv.Itoa(p.MaxAttempts) + " -> " + strconv.Itoa(k)}
	}
	ad.proposed = &next
	return ad
}

// percent formats part of whole as a percentage: whole numbers from 10%,
// one decimal below.
func percent(part, whole uint64) string {
	if whole == 0 {
		return "0%"
	}
	v := 100 * float64(part) / float64(whole)
	if v >= 10 || v == 0 {
		return strconv.FormatFloat(v, 'f', 0, 64) + "%"
	}
	s := strconv.FormatFloat(v, 'f', 1, 64)
	return strings.TrimSuffix(s, ".0") + "%"
}

// attemptRange names attempts from to to ("attempt 2", "attempts 2-3"),
// the last bucket as "16+".
func attemptRange(from, to int) string {
	name := func(a int) string {
		if a >= policy.StatsAttempts {
			return strconv.Itoa(policy.StatsAttempts) + "+"
		}
		return strconv.Itoa(a)
	}
	if from >= to {
		return "attempt " + name(from)
	}
	return "attempts " + name(from) + "-" + name(to)
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

// AdviseTargets says, per tenant and target with calls in the window,
// what the retries earned and the policy change that follows (advise). It
// changes nothing. A tenant token must set tenant to its own (auth.go).
func (a *Admin) AdviseTargets(ctx context.Context, req *pb.AdviseTargetsRequest) (*pb.AdviseTargetsResponse, error) {
	if err := checkName("tenant", req.GetTenant(), maxTenantLen, false); err != nil {
		return nil, err
	}
	if err := checkName("target", req.GetTarget(), maxTargetLen, false); err != nil {
		return nil, err
	}
	since, err := duration("since", req.GetSince(), defaultAdviseWindow)
	if err != nil {
		return nil, err
	}
	if since < minAdviseWindow || since > policy.StatsRetention {
		return nil, invalid("since", "must be 1m to 168h (the statistics' retention), got "+since.String())
	}
	advice, err := a.adviseTargets(ctx, req.GetTenant(), req.GetTarget(), a.cfg.Clock.Now().Add(-since))
	if err != nil {
		return nil, err
	}
	return adviceToPB(advice), nil
}

// adviseTargets is AdviseTargets' decision, in domain types: the
// statistics of the window from since, and for each tenant and target
// the advice on its stored policy (the effective one when none is
// stored), knowing which targets the stored policies name as fallbacks.
func (a *Admin) adviseTargets(ctx context.Context, tenant, target string, since time.Time) ([]targetAdvice, error) {
	stats, err := a.store.AttemptStats(tenant, target, since)
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "attempt statistics", err)
	}
	fallbacks, err := a.fallbacks()
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "policies", err)
	}
	out := make([]targetAdvice, 0, len(stats))
	for _, st := range stats {
		p, _ := a.store.Resolve(st.Tenant, st.Target)
		if e, err := a.store.Policy(st.Tenant, st.Target); err == nil {
			p = e.Policy
		} else if !notFound(err) {
			return nil, storeError(ctx, a.cfg.Logger, "policy", err)
		}
		out = append(out, advise(st, p, fallbacks.of(st.Tenant, st.Target)))
	}
	return out, nil
}

// fallbackBook is which targets the stored policies name as fallbacks:
// per scope (tenant, or "" for every tenant) the fallback target and the
// primaries naming it.
type fallbackBook map[policy.PolicyScope][]string

// of returns the primaries whose stored policy names target as a fallback
// for tenant's calls, sorted and without repeats.
func (b fallbackBook) of(tenant, target string) []string {
	out := append(b[policy.PolicyScope{Tenant: tenant, Target: target}], b[policy.PolicyScope{Target: target}]...)
	slices.Sort(out)
	return slices.Compact(out)
}

// fallbacks reads the stored policies' fallback chains.
func (a *Admin) fallbacks() (fallbackBook, error) {
	book := fallbackBook{}
	var after policy.PolicyScope
	for {
		page, err := a.store.Policies(after, maxPageSize)
		if err != nil {
			return nil, err
		}
		for _, e := range page {
			for _, fb := range e.Policy.Fallback.Targets {
				primary := e.Target
				if primary == "" {
					primary = "every target of the scope"
				}
				k := policy.PolicyScope{Tenant: e.Tenant, Target: fb}
				book[k] = append(book[k], primary)
			}
		}
		if len(page) < maxPageSize {
			return book, nil
		}
		after = policy.PolicyScope{Tenant: page[len(page)-1].Tenant, Target: page[len(page)-1].Target}
	}
}
