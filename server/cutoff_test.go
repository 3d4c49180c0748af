package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestAdmitHoldsTheRunsCutoff: Admit tells a call of a run its cut-off,
// refuses it past the cut-off (run:cutoff) whatever the breaker says, and
// an unknown run, or another tenant's, is NOT_FOUND.
func TestAdmitHoldsTheRunsCutoff(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	cutoff := h.clock.Now().Add(time.Minute)
	if _, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "r1", Tenant: "acme", RetryPool: 5,
		CutoffTime: timestamppb.New(cutoff)}); err != nil {
		t.Fatal(err)
	}
	admit := func(tenant, run string) (*pb.AdmitResponse, error) {
		c := call(tenant, "geo", "c1")
		c.RunId = run
		return h.workers.Admit(ctx, &pb.AdmitRequest{Call: c, Attempt: 1})
	}
	resp, err := admit("acme", "r1")
	if err != nil || !resp.GetAdmitted() || !resp.GetRunCutoffTime().AsTime().Equal(cutoff) {
		t.Fatalf("before the cut-off: %v, %v, want admitted with run_cutoff_time %v", resp, err, cutoff)
	}
	h.clock.Advance(time.Minute)
	resp, err = admit("acme", "r1")
	if err != nil || resp.GetAdmitted() || resp.GetReason() != "run:cutoff" || !resp.GetRunCutoffTime().AsTime().Equal(cutoff) {
		t.Fatalf("at the cut-off: %v, %v, want refused run:cutoff with run_cutoff_time %v", resp, err, cutoff)
	}
	for _, tt := range []struct{ name, tenant, run string }{
		{"unknown run", "acme", "nope"},
		{"another tenant's run", "other", "r1"},
	} {
		_, err := admit(tt.tenant, tt.run)
		if msg := wantCode(t, err, codes.NotFound); !strings.HasPrefix(msg, "call.run_id: ") {
			t.Errorf("%s: %q, want NOT_FOUND naming call.run_id", tt.name, msg)
		}
	}
}
