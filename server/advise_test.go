package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// adviseScenario drives 1002 calls of tenant acme through the API:
// on target geo 960 succeed on attempt 1, 40 fail three times (NextDelay
// STOPs the third; the call's DEAD_LETTER is reported after, and the
// third NextDelay sent twice) and one fails terminally on attempt 1 with
// no NextDelay; one call escalated to geo-b succeeds there on attempt 2.
func adviseScenario(t *testing.T, h *harness) {
	t.Helper()
	ctx := context.Background()
	attempts, never := uint32(3), uint32(10000)
	if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "geo", Policy: &pb.Policy{
		MaxAttempts: &attempts, Breaker: &pb.BreakerSettings{ConsecutiveFailures: &never}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "acme", Capacity: 1e6}}); err != nil {
		t.Fatal(err)
	}
	req := &pb.ReportOutcomeRequest{}
	for i := range 960 {
		req.Outcomes = append(req.Outcomes, &pb.Outcome{Call: call("acme", "geo", fmt.Sprint("ok-", i)), Attempt: 1, Success: true,
			FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED})
	}
	req.Outcomes = append(req.Outcomes,
		&pb.Outcome{Call: call("acme", "geo", "terminal"), Attempt: 1, Failure: http(404),
			FinalDisposition: pb.Disposition_DISPOSITION_FAILED_TERMINAL},
		&pb.Outcome{Call: call("acme", "geo", "escalated"), Attempt: 2, Success: true, AttemptTarget: "geo-b",
			FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED})
	if _, err := h.workers.ReportOutcome(ctx, req); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		c := call("acme", "geo", fmt.Sprint("dead-", i))
		for a := uint32(1); a <= 3; a++ {
			resp, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: a, Failure: http(503)})
			if err != nil {
				t.Fatal(err)
			}
			if stop := resp.GetDecision() == pb.Decision_DECISION_STOP; stop != (a == 3) {
				t.Fatalf("NextDelay(%s, attempt %d) = %v, want STOP only on attempt 3", c.GetCallId(), a, resp.GetDecision())
			}
		}
		if _, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: 3, Failure: http(503)}); err != nil {
			t.Fatalf("NextDelay again (a replay) = %v", err)
		}
		if _, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: c, Attempt: 3,
			AlreadyRecorded: true, FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER,
			FinalStopReason: pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdviseTargets: the statistics of calls reported through the API,
// each call counted once on its attempt target, and the advice drawn from
// them over real gRPC with a bbolt store: geo's retries earn nothing
// (max_attempts 3 -> 1), geo-b has too few calls; the proposal applies
// through SetPolicy.
func TestAdviseTargets(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	adviseScenario(t, h)
	h.clock.Advance(time.Minute)

	resp, err := h.admin.AdviseTargets(ctx, &pb.AdviseTargetsRequest{Tenant: "acme", Since: durationOf(time.Hour)})
	if err != nil {
		t.Fatalf("AdviseTargets = %v, want nil", err)
	}
	adv := resp.GetAdvice()
	if len(adv) != 2 || adv[0].GetTarget() != "geo" || adv[1].GetTarget() != "geo-b" {
		t.Fatalf("AdviseTargets = %v, want geo then geo-b", adv)
	}
	geo, fallback := adv[0], adv[1]
	wantCounts := func(name string, got []uint64, want map[int]uint64) {
		t.Helper()
		if len(got) != 16 {
			t.Fatalf("%s has %d attempt buckets, want 16", name, len(got))
		}
		for i, n := range got {
			if n != want[i] {
				t.Errorf("%s = %v, want %v (index: attempt - 1)", name, got, want)
				return
			}
		}
	}
	wantCounts("geo successes_by_attempt", geo.GetSuccessesByAttempt(), map[int]uint64{0: 960})
	wantCounts("geo failures_by_attempt", geo.GetFailuresByAttempt(), map[int]uint64{0: 1, 2: 40})
	wantCounts("geo-b successes_by_attempt", fallback.GetSuccessesByAttempt(), map[int]uint64{1: 1})
	wantCounts("geo-b failures_by_attempt", fallback.GetFailuresByAttempt(), nil)

	if got, want := geo.GetSummary(), "100% of successes on attempt 1; attempts 2-3 recovered 0% of failures"; got != want {
		t.Errorf("geo summary = %q, want %q", got, want)
	}
	if got := geo.GetRecommendation(); !strings.HasPrefix(got, "max_attempts 1") {
		t.Errorf("geo recommendation = %q, want max_attempts 1", got)
	}
	if got := geo.GetChanges(); !slices.Equal(got, []string{"max_attempts: 3 -> 1"}) {
		t.Errorf("geo changes = %q, want max_attempts: 3 -> 1", got)
	}
	if p := geo.GetProposedPolicy(); p.GetMaxAttempts() != 1 || p.GetBreaker().GetConsecutiveFailures() != 10000 {
		t.Errorf("geo proposed policy = %v, want the stored one (consecutive failures 10000) with max_attempts 1", p)
	}
	if got := fallback.GetRecommendation(); !strings.HasPrefix(got, "not enough calls") || fallback.GetProposedPolicy() != nil {
		t.Errorf("geo-b recommendation = %q, proposal %v; want not enough calls and none", got, fallback.GetProposedPolicy())
	}
	start, end := geo.GetStartTime().AsTime(), geo.GetEndTime().AsTime()
	if !end.Equal(h.clock.Now()) || start.After(h.clock.Now().Add(-time.Hour)) || start.Before(h.clock.Now().Add(-2*time.Hour)) {
		t.Errorf("window %v to %v, want the hour buckets of the last hour to now (%v)", start, end, h.clock.Now())
	}

	// The target filter, and a window that starts after the calls.
	only, err := h.admin.AdviseTargets(ctx, &pb.AdviseTargetsRequest{Target: "geo-b"})
	if err != nil || len(only.GetAdvice()) != 1 || only.GetAdvice()[0].GetTarget() != "geo-b" {
		t.Errorf("AdviseTargets(target geo-b) = %v, %v; want geo-b only", only.GetAdvice(), err)
	}
	h.clock.Advance(2 * time.Hour)
	none, err := h.admin.AdviseTargets(ctx, &pb.AdviseTargetsRequest{Since: durationOf(time.Hour)})
	if err != nil || len(none.GetAdvice()) != 0 {
		t.Errorf("AdviseTargets over the last hour, 2 h after the calls = %v, %v; want nothing", none.GetAdvice(), err)
	}

	// Applying the proposal is SetPolicy's business.
	if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "geo", Policy: geo.GetProposedPolicy()}); err != nil {
		t.Fatalf("SetPolicy(proposed) = %v, want nil", err)
	}
	got, err := h.admin.GetPolicy(ctx, &pb.GetPolicyRequest{Tenant: "acme", Target: "geo"})
	if err != nil || got.GetEntry().GetPolicy().GetMaxAttempts() != 1 {
		t.Errorf("GetPolicy after applying = %v, %v; want max_attempts 1", got.GetEntry().GetPolicy(), err)
	}
}

// TestAdviseTargetsSurvivesRestart: the statistics are stored, not only
// counted in memory: a daemon started over the same file advises alike.
func TestAdviseTargetsSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/policyd.db"
	h := newHarness(t, func(_ *server.Config, o *breakerstore.Options) { o.Path = path })
	adviseScenario(t, h)
	before, err := h.admin.AdviseTargets(context.Background(), &pb.AdviseTargetsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	h.conn.Close()
	h.gs.Stop()
	if err := h.store.Close(); err != nil {
		t.Fatal(err)
	}
	h2 := newHarness(t, func(_ *server.Config, o *breakerstore.Options) { o.Path = path })
	after, err := h2.admin.AdviseTargets(context.Background(), &pb.AdviseTargetsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(after.GetAdvice()) != len(before.GetAdvice()) {
		t.Fatalf("after a restart: %d entries, want %d", len(after.GetAdvice()), len(before.GetAdvice()))
	}
	for i, b := range before.GetAdvice() {
		a := after.GetAdvice()[i]
		if !slices.Equal(a.GetSuccessesByAttempt(), b.GetSuccessesByAttempt()) || !slices.Equal(a.GetFailuresByAttempt(), b.GetFailuresByAttempt()) {
			t.Errorf("after a restart: %s = %v / %v, want %v / %v", b.GetTarget(), a.GetSuccessesByAttempt(), a.GetFailuresByAttempt(),
				b.GetSuccessesByAttempt(), b.GetFailuresByAttempt())
		}
	}
}

// TestAdviseTargetsBadInput: INVALID_ARGUMENT naming the field and the
// rule.
func TestAdviseTargetsBadInput(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name      string
		req       *pb.AdviseTargetsRequest
		field     string
		ruleInMsg string
	}{
		{"since under a minute", &pb.AdviseTargetsRequest{Since: durationOf(30 * time.Second)}, "since", "1m to 168h"},
		{"since beyond the retention", &pb.AdviseTargetsRequest{Since: durationOf(169 * time.Hour)}, "since", "1m to 168h"},
		{"since negative", &pb.AdviseTargetsRequest{Since: durationOf(-time.Hour)}, "since", "negative"},
		{"a tenant with a control byte", &pb.AdviseTargetsRequest{Tenant: "ac\x00me"}, "tenant", ""},
		{"a target with a leading space", &pb.AdviseTargetsRequest{Target: " geo"}, "target", ""},
		{"a target too long", &pb.AdviseTargetsRequest{Target: strings.Repeat("g", 257)}, "target", "at most 256 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.admin.AdviseTargets(context.Background(), tc.req)
			msg := wantCode(t, err, codes.InvalidArgument)
			if !strings.HasPrefix(msg, tc.field+": ") || !strings.Contains(msg, tc.ruleInMsg) {
				t.Errorf("message %q, want it to name %s and %q", msg, tc.field, tc.ruleInMsg)
			}
		})
	}
}

// TestAdviseTargetsAuth: an admin token, or a tenant token for its own
// tenant, as for ListRunCalls.
func TestAdviseTargetsAuth(t *testing.T) {
	h := newHarness(t, func(c *server.Config, _ *breakerstore.Options) {
		c.Auth = server.NewAuth(server.AuthConfig{
			AdminTokens:  []string{"admin-secret"},
			TenantTokens: map[string]string{"tok-a": "tenant-a"},
		})
	})
	advise := func(tok, tenant string) error {
		_, err := h.admin.AdviseTargets(withToken(tok), &pb.AdviseTargetsRequest{Tenant: tenant})
		return err
	}
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"admin, every tenant", advise("admin-secret", ""), codes.OK},
		{"tenant token, its own tenant", advise("tok-a", "tenant-a"), codes.OK},
		{"tenant token, another tenant", advise("tok-a", "tenant-b"), codes.PermissionDenied},
		{"tenant token, every tenant", advise("tok-a", ""), codes.PermissionDenied},
		{"no credential", advise("", "tenant-a"), codes.Unauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want == codes.OK {
				if tc.err != nil {
					t.Fatalf("got %v, want OK", tc.err)
				}
				return
			}
			wantCode(t, tc.err, tc.want)
		})
	}
}

// TestAttemptTargetBadInput: an attempt target that is not a valid name
// is INVALID_ARGUMENT naming it, on NextDelay and on ReportOutcome.
func TestAttemptTargetBadInput(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo", "c"), Attempt: 1, Failure: http(503),
		AttemptTarget: "geo\x00b"})
	if msg := wantCode(t, err, codes.InvalidArgument); !strings.HasPrefix(msg, "attempt_target: ") {
		t.Errorf("NextDelay: message %q, want it to name attempt_target", msg)
	}
	_, err = h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("acme", "geo", "c"), Attempt: 1, Success: true, AttemptTarget: strings.Repeat("b", 257)}}})
	if msg := wantCode(t, err, codes.InvalidArgument); !strings.HasPrefix(msg, "outcomes[0].attempt_target: ") {
		t.Errorf("ReportOutcome: message %q, want it to name outcomes[0].attempt_target", msg)
	}
}

// TestAdviseTargetsEscalation: with fallback targets in geo's policy, the
// advice is to escalate after 1 attempt (fallback.after_attempts), the
// proposal keeps the chain and max_attempts, and geo-b, the fallback,
// gets none of its own.
func TestAdviseTargetsEscalation(t *testing.T) {
	h := newHarness(t)
	adviseScenario(t, h)
	attempts, never := uint32(3), uint32(10000)
	if _, err := h.admin.SetPolicy(context.Background(), &pb.SetPolicyRequest{Tenant: "acme", Target: "geo", Policy: &pb.Policy{
		MaxAttempts: &attempts, Breaker: &pb.BreakerSettings{ConsecutiveFailures: &never},
		Fallback: &pb.FallbackSettings{Targets: []string{"geo-b"}}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := h.admin.AdviseTargets(context.Background(), &pb.AdviseTargetsRequest{Tenant: "acme"})
	if err != nil || len(resp.GetAdvice()) != 2 {
		t.Fatalf("AdviseTargets = %v, %v; want geo and geo-b", resp.GetAdvice(), err)
	}
	geo, fallback := resp.GetAdvice()[0], resp.GetAdvice()[1]
	if got := geo.GetRecommendation(); !strings.HasPrefix(got, "escalate after 1 attempt: ") {
		t.Errorf("geo recommendation = %q, want escalate after 1 attempt", got)
	}
	if got := geo.GetChanges(); !slices.Equal(got, []string{"fallback.after_attempts: 0 -> 1"}) || geo.GetProposedPolicy().GetMaxAttempts() != 3 {
		t.Errorf("geo changes = %q (max_attempts %d), want fallback.after_attempts: 0 -> 1 and max_attempts kept at 3",
			got, geo.GetProposedPolicy().GetMaxAttempts())
	}
	if fb := geo.GetProposedPolicy().GetFallback(); fb.GetAfterAttempts() != 1 || !slices.Equal(fb.GetTargets(), []string{"geo-b"}) {
		t.Errorf("geo proposed fallback = %v, want geo-b after 1 attempt", fb)
	}
	if got := fallback.GetRecommendation(); !strings.HasPrefix(got, "a fallback of geo") || fallback.GetProposedPolicy() != nil {
		t.Errorf("geo-b recommendation = %q, proposal %v; want a fallback of geo and none", got, fallback.GetProposedPolicy())
	}
}
