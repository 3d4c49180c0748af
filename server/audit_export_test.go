package server_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestQueryAuditByTimeAlone is the query `policyd audit export` pages
// through: every tenant's records from start_time on.
func TestQueryAuditByTimeAlone(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	start := h.clock.Now()
	for _, c := range []*pb.CallRef{call("acme", "geo", "doc-1"), call("beta", "geo", "doc-2"), call("gamma", "pay", "doc-3")} {
		if _, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: 1, Failure: http(422)}); err != nil {
			t.Fatalf("NextDelay: %v", err)
		}
		h.clock.Advance(time.Second)
	}
	var tenants []string
	req := &pb.QueryAuditRequest{StartTime: timestamppb.New(start.Add(time.Second)), PageSize: 1}
	for range 10 {
		resp, err := h.admin.QueryAudit(ctx, req)
		if err != nil {
			t.Fatalf("QueryAudit(%v): %v", req, err)
		}
		for _, r := range resp.GetRecords() {
			tenants = append(tenants, r.GetTenant())
		}
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	if want := []string{"beta", "gamma"}; !slices.Equal(tenants, want) {
		t.Errorf("records from start_time on: got tenants %v, want %v", tenants, want)
	}
	_, err := h.admin.QueryAudit(ctx, &pb.QueryAuditRequest{})
	if msg := wantCode(t, err, codes.InvalidArgument); msg != "call_id: call_id, tenant or start_time is required" {
		t.Errorf("QueryAudit with no selection: got %q", msg)
	}
}
