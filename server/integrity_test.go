package server_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// twoTenants is a harness whose workers authenticate as tenant-a (token
// tok-a) or tenant-b (tok-b), as with --tenant-tokens-file.
func twoTenants(t *testing.T) *harness {
	t.Helper()
	return newHarness(t, func(c *server.Config, _ *breakerstore.Options) {
		c.Auth = server.NewAuth(server.AuthConfig{
			AdminTokens:  []string{"admin-secret"},
			TenantTokens: map[string]string{"tok-a": "tenant-a", "tok-b": "tenant-b"},
		})
	})
}

// halfOpenTargetBreaker puts target's breaker, shared by every tenant, in
// HALF_OPEN with one probe permit, handed to tenant-a, and returns it.
func halfOpenTargetBreaker(t *testing.T, h *harness, target string) string {
	t.Helper()
	one := uint32(1)
	if _, err := h.admin.SetPolicy(withToken("admin-secret"), &pb.SetPolicyRequest{Target: target, Policy: &pb.Policy{
		Breaker: &pb.BreakerSettings{Scope: pb.BreakerScope_BREAKER_SCOPE_TARGET, ConsecutiveFailures: &one,
			HalfOpenProbes: &one, Cooldown: durationpb.New(time.Minute), ProbeTimeout: durationpb.New(10 * time.Minute)},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.workers.NextDelay(withToken("tok-a"), &pb.NextDelayRequest{Call: call("tenant-a", target, "trip"),
		Attempt: 1, Failure: http(503)}); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(61 * time.Second)
	a, err := h.workers.Admit(withToken("tok-a"), &pb.AdmitRequest{Call: call("tenant-a", target, "probe"), Attempt: 1})
	if err != nil || !a.GetAdmitted() || a.GetPermitId() == "" {
		t.Fatalf("Admit after the cooldown: %v, %v; want a probe permit", a, err)
	}
	return a.GetPermitId()
}

func breakerState(t *testing.T, h *harness, target string) pb.BreakerState {
	t.Helper()
	b, err := h.admin.GetBreaker(withToken("admin-secret"), &pb.GetBreakerRequest{Key: &pb.BreakerKey{Target: target}})
	if err != nil {
		t.Fatal(err)
	}
	return b.GetBreaker().GetState()
}

// TestForgedPermitCannotSettleAProbe: tenant-b cannot close (or reopen) the
// target-scoped breaker tenant-a is probing, neither with an invented
// permit nor with the permit of another breaker; the refusal is
// FAILED_PRECONDITION naming permit_id, and in a batch the other outcomes
// still apply. Before permits were checked, tenant-b's made-up permit
// closed the breaker.
func TestForgedPermitCannotSettleAProbe(t *testing.T) {
	h := twoTenants(t)
	probe := halfOpenTargetBreaker(t, h, "geo")
	otherPermit := halfOpenTargetBreaker(t, h, "maps")
	b := withToken("tok-b")

	invented := strings.Repeat("ab", 16)
	for _, forged := range []string{invented, "1", otherPermit} {
		resp, err := h.workers.ReportOutcome(b, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
			{Call: call("tenant-b", "elsewhere", "fine"), Attempt: 1, Success: true},
			{Call: call("tenant-b", "geo", "forger"), Attempt: 1, Success: true, PermitId: forged},
		}})
		if err != nil {
			t.Fatalf("ReportOutcome with permit %q: %v", forged, err)
		}
		if resp.GetAccepted() != 1 || len(resp.GetRefused()) != 1 {
			t.Fatalf("permit %q: accepted %d, refused %v; want 1 and the second outcome", forged, resp.GetAccepted(), resp.GetRefused())
		}
		r := resp.GetRefused()[0]
		if r.GetIndex() != 1 || codes.Code(r.GetCode()) != codes.FailedPrecondition || r.GetField() != "outcomes[1].permit_id" ||
			!strings.HasPrefix(r.GetMessage(), "outcomes[1].permit_id: ") {
			t.Fatalf("permit %q: refusal %v; want outcome 1, FAILED_PRECONDITION, outcomes[1].permit_id", forged, r)
		}
		if got := breakerState(t, h, "geo"); got != pb.BreakerState_BREAKER_STATE_HALF_OPEN {
			t.Fatalf("after a success with permit %q from tenant-b: %v, want HALF_OPEN", forged, got)
		}

		_, err = h.workers.NextDelay(b, &pb.NextDelayRequest{Call: call("tenant-b", "geo", "forger-"+forged),
			Attempt: 1, Failure: http(503), PermitId: forged})
		if msg := wantCode(t, err, codes.FailedPrecondition); !strings.Contains(msg, "permit_id") {
			t.Fatalf("NextDelay with permit %q: %q, want it to name permit_id", forged, msg)
		}
		if got := breakerState(t, h, "geo"); got != pb.BreakerState_BREAKER_STATE_HALF_OPEN {
			t.Fatalf("after a failure with permit %q from tenant-b: %v, want HALF_OPEN", forged, got)
		}
	}
	// A failure reported without any permit does not reopen it either.
	if _, err := h.workers.ReportOutcome(b, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("tenant-b", "geo", "no-permit"), Attempt: 1, Failure: http(503)}}}); err != nil {
		t.Fatal(err)
	}
	if got := breakerState(t, h, "geo"); got != pb.BreakerState_BREAKER_STATE_HALF_OPEN {
		t.Fatalf("after a failure without a permit: %v, want HALF_OPEN", got)
	}

	// The real probe settles it.
	if _, err := h.workers.ReportOutcome(withToken("tok-a"), &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("tenant-a", "geo", "probe"), Attempt: 1, Success: true, PermitId: probe}}}); err != nil {
		t.Fatal(err)
	}
	if got := breakerState(t, h, "geo"); got != pb.BreakerState_BREAKER_STATE_CLOSED {
		t.Fatalf("after the probe's success: %v, want CLOSED", got)
	}
	// Its permit is spent: presented again (now CLOSED) it is ignored.
	if _, err := h.workers.ReportOutcome(withToken("tok-a"), &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("tenant-a", "geo", "probe"), Attempt: 1, Success: true, PermitId: probe}}}); err != nil {
		t.Fatal(err)
	}
}
