package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// auditLine renders a record compactly for comparisons.
func auditLine(r *pb.AuditRecord) string {
	s := fmt.Sprintf("%s#%d", strings.TrimPrefix(r.GetEvent().String(), "AUDIT_EVENT_"), r.GetAttempt())
	switch r.GetEvent() {
	case pb.AuditEvent_AUDIT_EVENT_DECISION:
		s += fmt.Sprintf(" %s %s", r.GetClassification(), strings.TrimPrefix(r.GetDecision().String(), "DECISION_"))
		if r.GetDecision() == pb.Decision_DECISION_STOP {
			s += " " + strings.TrimPrefix(r.GetStopReason().String(), "STOP_REASON_")
		}
	case pb.AuditEvent_AUDIT_EVENT_FINAL:
		s += " " + strings.TrimPrefix(r.GetDisposition().String(), "DISPOSITION_")
	case pb.AuditEvent_AUDIT_EVENT_OUTCOME:
		s += " " + r.GetDetail()
	}
	return s
}

// queryAll pages through a query and renders every record.
func queryAll(t *testing.T, h *harness, req *pb.QueryAuditRequest) []string {
	t.Helper()
	var out []string
	for range 100 {
		resp, err := h.admin.QueryAudit(context.Background(), req)
		if err != nil {
			t.Fatalf("QueryAudit(%v): %v", req, err)
		}
		for _, r := range resp.GetRecords() {
			out = append(out, auditLine(r))
		}
		if resp.GetNextPageToken() == "" {
			return out
		}
		req.PageToken = resp.GetNextPageToken()
	}
	t.Fatal("QueryAudit never ended")
	return nil
}

func TestAuditTrailOfARetrySequence(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	c := call("acme", "geo", "doc-17")
	for attempt := uint32(1); attempt <= 2; attempt++ {
		resp, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: attempt, Failure: http(503)})
		if err != nil || resp.GetDecision() != pb.Decision_DECISION_RETRY {
			t.Fatalf("NextDelay attempt %d: got %v, %v; want RETRY", attempt, resp, err)
		}
		h.clock.Advance(resp.GetDelay().AsDuration())
	}
	_, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{
		Call: c, Attempt: 3, Success: true, Latency: durationpb.New(120 * time.Millisecond),
		FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED,
	}}})
	if err != nil {
		t.Fatalf("ReportOutcome: %v", err)
	}
	// Another call of the same tenant, stopped for good.
	if _, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo", "doc-18"), Attempt: 1, Failure: http(422)}); err != nil {
		t.Fatalf("NextDelay: %v", err)
	}

	want := []string{
		"DECISION#1 transient:503 RETRY",
		"DECISION#2 transient:503 RETRY",
		"FINAL#3 SUCCEEDED", // one record for the success that ended the call
	}
	tests := []struct {
		name string
		req  *pb.QueryAuditRequest
		want []string
	}{
		{"by call id", &pb.QueryAuditRequest{CallId: "doc-17"}, want},
		{"by call id, pages of one", &pb.QueryAuditRequest{CallId: "doc-17", PageSize: 1}, want},
		{"by call id and tenant", &pb.QueryAuditRequest{CallId: "doc-17", Tenant: "acme"}, want},
		{"by call id, another tenant", &pb.QueryAuditRequest{CallId: "doc-17", Tenant: "beta"}, nil},
		{"by tenant", &pb.QueryAuditRequest{Tenant: "acme", PageSize: 3},
			append(append([]string(nil), want...), "DECISION#1 terminal:422 STOP TERMINAL")},
		{"by tenant, before the first decision", &pb.QueryAuditRequest{Tenant: "acme",
			EndTime: timestamppb.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := queryAll(t, h, tt.req)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("records:\n got %q\nwant %q", got, tt.want)
			}
		})
	}

	resp, err := h.admin.QueryAudit(ctx, &pb.QueryAuditRequest{CallId: "doc-17", PageSize: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := resp.GetRecords()[0]
	if r.GetTenant() != "acme" || r.GetTarget() != "geo" || r.GetDelay().AsDuration() <= 0 ||
		!r.GetRecordTime().AsTime().Equal(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)) || r.GetDetail() == "" {
		t.Errorf("first record: got %v, want tenant acme, target geo, a delay, the decision's time and a detail", r)
	}
}

func TestAuditRecordsRefusedAdmission(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	if _, err := h.admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{
		Key: &pb.BreakerKey{Tenant: "acme", Target: "geo"}, State: pb.BreakerState_BREAKER_STATE_OPEN,
	}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", ""} { // a refusal without a call id is kept by tenant
		a, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "geo", id), Attempt: 2})
		if err != nil || a.GetAdmitted() {
			t.Fatalf("Admit: got %v, %v; want a refusal", a, err)
		}
	}
	resp, err := h.admin.QueryAudit(ctx, &pb.QueryAuditRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range resp.GetRecords() {
		got = append(got, fmt.Sprintf("%s %q %s", auditLine(r), r.GetCallId(), r.GetDetail()))
	}
	want := `[ADMIT#2 "a" refused: breaker:forced_open ADMIT#2 "" refused: breaker:forced_open]`
	if fmt.Sprint(got) != want {
		t.Errorf("records: got %s, want %s", got, want)
	}
}

func TestQueryAuditRejectsBadInput(t *testing.T) {
	h := newHarness(t)
	start := timestamppb.New(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	tests := []struct {
		name  string
		req   *pb.QueryAuditRequest
		field string
	}{
		{"neither call id nor tenant", &pb.QueryAuditRequest{}, "call_id"},
		{"only an end time", &pb.QueryAuditRequest{EndTime: start}, "call_id"}, // a start time alone selects every tenant: TestQueryAuditByTimeAlone
		{"call id too long", &pb.QueryAuditRequest{CallId: strings.Repeat("x", 129)}, "call_id"},
		{"control character in tenant", &pb.QueryAuditRequest{Tenant: "a\x01b"}, "tenant"},
		{"page size over 1000", &pb.QueryAuditRequest{CallId: "c", PageSize: 1001}, "page_size"},
		{"page token not issued here", &pb.QueryAuditRequest{CallId: "c", PageToken: "!!"}, "page_token"},
		{"page token of another query kind", &pb.QueryAuditRequest{CallId: "c", PageToken: "YQ"}, "page_token"},
		{"bad start time", &pb.QueryAuditRequest{CallId: "c", StartTime: &timestamppb.Timestamp{Nanos: -1}}, "start_time"},
		{"end not after start", &pb.QueryAuditRequest{CallId: "c", StartTime: start, EndTime: start}, "end_time"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.admin.QueryAudit(context.Background(), tt.req)
			msg := wantCode(t, err, codes.InvalidArgument)
			if !strings.HasPrefix(msg, tt.field+":") {
				t.Errorf("message: got %q, want it to name %s", msg, tt.field)
			}
		})
	}
}
