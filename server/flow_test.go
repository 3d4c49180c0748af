package server_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

func setCeiling(t *testing.T, h *harness, n uint32) {
	t.Helper()
	if _, err := h.admin.SetPolicy(context.Background(), &pb.SetPolicyRequest{Tenant: "acme", Target: "portal",
		Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: &n}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
}

func TestConcurrencyCeiling(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	setCeiling(t, h, 2)
	admit := func(id string) *pb.AdmitResponse {
		t.Helper()
		a, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "portal", id), Attempt: 1})
		if err != nil {
			t.Fatalf("Admit(%s): %v", id, err)
		}
		if !a.GetFlowControlled() {
			t.Fatalf("Admit(%s): flow_controlled false, want true", id)
		}
		return a
	}
	a1, a2 := admit("doc-1"), admit("doc-2")
	for _, a := range []*pb.AdmitResponse{a1, a2} {
		if !a.GetAdmitted() || len(a.GetLeaseId()) != 32 {
			t.Fatalf("under the ceiling: %v, want admitted with a 32-hex-digit lease", a)
		}
		if got, want := a.GetLeaseExpireTime().AsTime(), h.clock.Now().Add(15*time.Second); !got.Equal(want) {
			t.Fatalf("lease expires %v, want %v (attempt timeout 10s + slack 5s)", got, want)
		}
	}
	if a1.GetLeaseId() == a2.GetLeaseId() {
		t.Fatalf("two leases share the id %s", a1.GetLeaseId())
	}
	a3 := admit("doc-3")
	if a3.GetAdmitted() || a3.GetReason() != "concurrency:full" || a3.GetRetryAfter().AsDuration() != 500*time.Millisecond {
		t.Fatalf("at the ceiling: %v, want refused concurrency:full, retry after the 500ms backoff base", a3)
	}

	// The failed attempt's NextDelay returns its lease.
	nd, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "portal", "doc-1"), Attempt: 1,
		Failure: http(503), LeaseId: a1.GetLeaseId()})
	if err != nil {
		t.Fatalf("NextDelay: %v", err)
	}
	if !nd.GetFlowControlled() {
		t.Fatalf("NextDelay: flow_controlled false, want true")
	}
	a4 := admit("doc-1")
	if !a4.GetAdmitted() {
		t.Fatalf("after NextDelay returned a lease: %v, want admitted", a4)
	}

	// The successful attempt's outcome returns its lease; the report says
	// which targets are flow-controlled.
	rep, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("acme", "portal", "doc-2"), Attempt: 1, Success: true, LeaseId: a2.GetLeaseId()},
		{Call: call("acme", "elsewhere", "doc-9"), Attempt: 1, Success: true},
	}})
	if err != nil {
		t.Fatalf("ReportOutcome: %v", err)
	}
	if got := rep.GetFlowControlledTargets(); len(got) != 1 || got[0] != "portal" {
		t.Fatalf("flow_controlled_targets %v, want [portal]", got)
	}
	// An explicit release; a release of a lease not held is ignored.
	rel, err := h.workers.ReleaseLease(ctx, &pb.ReleaseLeaseRequest{Call: call("acme", "portal", "doc-1"), LeaseId: a4.GetLeaseId()})
	if err != nil || !rel.GetReleased() {
		t.Fatalf("ReleaseLease of a live lease: %v, %v; want released", rel, err)
	}
	rel, err = h.workers.ReleaseLease(ctx, &pb.ReleaseLeaseRequest{Call: call("acme", "portal", "doc-2"), LeaseId: a2.GetLeaseId()})
	if err != nil || rel.GetReleased() {
		t.Fatalf("ReleaseLease of a lease already returned: %v, %v; want OK, released false", rel, err)
	}

	// Leases nobody returns expire.
	admit("doc-5")
	admit("doc-6")
	br, err := h.admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "portal"}})
	if err != nil {
		t.Fatalf("GetBreaker: %v", err)
	}
	if b := br.GetBreaker(); b.GetLeasesInFlight() != 2 || b.GetStrayReleases() != 1 {
		t.Fatalf("GetBreaker: %d leases in flight, %d stray releases; want 2 and 1", b.GetLeasesInFlight(), b.GetStrayReleases())
	}
	if a := admit("doc-7"); a.GetAdmitted() {
		t.Fatalf("ceiling full again: %v, want refused", a)
	}
	h.clock.Advance(15 * time.Second)
	if a := admit("doc-7"); !a.GetAdmitted() {
		t.Fatalf("after the leases' life: %v, want admitted", a)
	}
}

// TestNoCeilingNoLease: a policy without a ceiling hands out no lease and
// tells the client it may skip Admit while CLOSED.
func TestNoCeilingNoLease(t *testing.T) {
	h := newHarness(t)
	a, err := h.workers.Admit(context.Background(), &pb.AdmitRequest{Call: call("acme", "portal", "doc-1"), Attempt: 1})
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	if !a.GetAdmitted() || a.GetLeaseId() != "" || a.GetFlowControlled() {
		t.Fatalf("Admit without a ceiling: %v, want admitted, no lease, not flow-controlled", a)
	}
}

func TestFlowBadInput(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	zero, huge, ten := uint32(0), uint32(2_000_000), uint32(10)
	f64 := func(v float64) *float64 { return &v }
	setAdaptive := func(maxInFlight *uint32, a *pb.AdaptiveCeiling) error {
		_, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Target: "portal",
			Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: maxInFlight, Adaptive: a}}})
		return err
	}
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"a ceiling of 0", func() error {
			_, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Target: "portal", Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: &zero}}})
			return err
		}, "policy.flow.max_in_flight"},
		{"a ceiling above 1000000", func() error {
			_, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Target: "portal", Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: &huge}}})
			return err
		}, "policy.flow.max_in_flight"},
		{"a negative lease slack", func() error {
			_, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Target: "portal", Policy: &pb.Policy{Flow: &pb.FlowSettings{LeaseSlack: durationOf(-time.Second)}}})
			return err
		}, "policy.flow.lease_slack"},
		{"a rate of 0", func() error {
			r := 0.0
			_, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Target: "portal", Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxRate: &r}}})
			return err
		}, "policy.flow.max_rate"},
		{"a NaN rate", func() error {
			r := math.NaN()
			_, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Target: "portal", Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxRate: &r}}})
			return err
		}, "policy.flow.max_rate"},
		{"a burst of 0", func() error {
			r := 5.0
			_, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Target: "portal", Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxRate: &r, Burst: &zero}}})
			return err
		}, "policy.flow.burst"},
		{"adaptive without max_in_flight", func() error {
			return setAdaptive(nil, &pb.AdaptiveCeiling{})
		}, "policy.flow.adaptive"},
		{"adaptive min_in_flight 0", func() error {
			return setAdaptive(&ten, &pb.AdaptiveCeiling{MinInFlight: &zero})
		}, "policy.flow.adaptive.min_in_flight"},
		{"adaptive min_in_flight above max_in_flight", func() error {
			eleven := uint32(11)
			return setAdaptive(&ten, &pb.AdaptiveCeiling{MinInFlight: &eleven})
		}, "policy.flow.adaptive.min_in_flight"},
		{"adaptive decrease 0", func() error {
			return setAdaptive(&ten, &pb.AdaptiveCeiling{Decrease: f64(0)})
		}, "policy.flow.adaptive.decrease"},
		{"adaptive decrease 1", func() error {
			return setAdaptive(&ten, &pb.AdaptiveCeiling{Decrease: f64(1)})
		}, "policy.flow.adaptive.decrease"},
		{"adaptive decrease NaN", func() error {
			return setAdaptive(&ten, &pb.AdaptiveCeiling{Decrease: f64(math.NaN())})
		}, "policy.flow.adaptive.decrease"},
		{"adaptive increase 0", func() error {
			return setAdaptive(&ten, &pb.AdaptiveCeiling{Increase: f64(0)})
		}, "policy.flow.adaptive.increase"},
		{"adaptive increase NaN", func() error {
			return setAdaptive(&ten, &pb.AdaptiveCeiling{Increase: f64(math.NaN())})
		}, "policy.flow.adaptive.increase"},
		{"adaptive increase above max_in_flight", func() error {
			return setAdaptive(&ten, &pb.AdaptiveCeiling{Increase: f64(10.5)})
		}, "policy.flow.adaptive.increase"},
		{"adaptive hold negative", func() error {
			return setAdaptive(&ten, &pb.AdaptiveCeiling{Hold: durationOf(-time.Second)})
		}, "policy.flow.adaptive.hold"},
		{"adaptive hold above 1h", func() error {
			return setAdaptive(&ten, &pb.AdaptiveCeiling{Hold: durationOf(time.Hour + time.Second)})
		}, "policy.flow.adaptive.hold"},
		{"a release without a lease id", func() error {
			_, err := h.workers.ReleaseLease(ctx, &pb.ReleaseLeaseRequest{Call: call("acme", "portal", "doc-1")})
			return err
		}, "lease_id"},
		{"an oversized lease id on NextDelay", func() error {
			_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "portal", "doc-1"), Attempt: 1,
				Failure: http(503), LeaseId: strings.Repeat("a", 200)})
			return err
		}, "lease_id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := wantCode(t, tt.call(), codes.InvalidArgument)
			if !strings.Contains(msg, tt.field) {
				t.Fatalf("message %q does not name %s", msg, tt.field)
			}
		})
	}
}

// TestRateCeiling: max_rate 2/s with burst 2 over gRPC: two admitted at
// once, the third refused with the exact wait, admitted once it has passed.
func TestRateCeiling(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	rate, burst := 2.0, uint32(2)
	if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "portal",
		Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxRate: &rate, Burst: &burst}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	admit := func() *pb.AdmitResponse {
		t.Helper()
		a, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "portal", "doc-1"), Attempt: 1})
		if err != nil {
			t.Fatalf("Admit: %v", err)
		}
		return a
	}
	for i := range 2 {
		if a := admit(); !a.GetAdmitted() || !a.GetFlowControlled() || a.GetLeaseId() != "" {
			t.Fatalf("burst %d: %v, want admitted, flow-controlled, no lease (no concurrency ceiling)", i, a)
		}
	}
	a := admit()
	if a.GetAdmitted() || a.GetReason() != "rate:limited" || a.GetRetryAfter().AsDuration() != 500*time.Millisecond {
		t.Fatalf("past the burst: %v, want refused rate:limited after exactly 500ms", a)
	}
	h.clock.Advance(499 * time.Millisecond)
	if a := admit(); a.GetAdmitted() || a.GetRetryAfter().AsDuration() != time.Millisecond {
		t.Fatalf("1ms early: %v, want refused after exactly 1ms", a)
	}
	h.clock.Advance(time.Millisecond)
	if a := admit(); !a.GetAdmitted() {
		t.Fatalf("after the wait: %v, want admitted", a)
	}
	got, err := h.admin.GetPolicy(ctx, &pb.GetPolicyRequest{Tenant: "acme", Target: "portal"})
	if err != nil {
		t.Fatalf("GetPolicy: %v", err)
	}
	if f := got.GetEntry().GetPolicy().GetFlow(); f.GetMaxRate() != 2 || f.GetBurst() != 2 {
		t.Fatalf("GetPolicy flow %v, want max_rate 2 burst 2", f)
	}
}

// TestAdaptivePolicy: an adaptive ceiling set with some fields reads back
// with every default applied, and a policy without one reads back without.
func TestAdaptivePolicy(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	n, lo := uint32(20), uint32(4)
	if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "portal", Policy: &pb.Policy{
		Flow: &pb.FlowSettings{MaxInFlight: &n, Adaptive: &pb.AdaptiveCeiling{MinInFlight: &lo, Hold: durationOf(time.Second)}}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	got, err := h.admin.GetPolicy(ctx, &pb.GetPolicyRequest{Tenant: "acme", Target: "portal"})
	if err != nil {
		t.Fatalf("GetPolicy: %v", err)
	}
	a := got.GetEntry().GetPolicy().GetFlow().GetAdaptive()
	if a.GetMinInFlight() != 4 || a.GetDecrease() != 0.7 || a.GetIncrease() != 0.5 || a.GetHold().AsDuration() != time.Second {
		t.Fatalf("GetPolicy adaptive %v, want min 4, decrease 0.7, increase 0.5, hold 1s", a)
	}
	setCeiling(t, h, 20)
	if got, err = h.admin.GetPolicy(ctx, &pb.GetPolicyRequest{Tenant: "acme", Target: "portal"}); err != nil {
		t.Fatalf("GetPolicy: %v", err)
	}
	if a := got.GetEntry().GetPolicy().GetFlow().GetAdaptive(); a != nil {
		t.Fatalf("a fixed ceiling reads back adaptive %v, want none", a)
	}
}
