package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// TestListRunCalls: a run's call table is fed by NextDelay and by final
// dispositions, and lists per call its disposition, stop reason, attempts,
// last classification and detail, attempt times, target and triage
// reference, filtered and paged; a tenant token lists its own runs only.
func TestListRunCalls(t *testing.T) {
	h := newHarness(t, func(c *server.Config, _ *breakerstore.Options) {
		c.Auth = server.NewAuth(server.AuthConfig{
			AdminTokens:  []string{"admin-secret"},
			TenantTokens: map[string]string{"tok-a": "acme", "tok-b": "other"},
		})
	})
	admin, worker := withToken("admin-secret"), withToken("tok-a")
	if _, err := h.admin.OpenRun(admin, &pb.OpenRunRequest{RunId: "nightly", Tenant: "acme", RetryPool: 100,
		CutoffTime: timestamppb.New(h.clock.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	ref := func(id string) *pb.CallRef {
		c := call("acme", "grants", id)
		c.RunId, c.Idempotent, c.TriageRef = "nightly", true, "s3://inbox/"+id+".pdf"
		return c
	}
	start := h.clock.Now()
	// doc-1: 503, retry, 503, retry, 503: policyd stops (attempts), the
	// worker reports the dead letter.
	for attempt := uint32(1); attempt <= 3; attempt++ {
		if _, err := h.workers.NextDelay(worker, &pb.NextDelayRequest{Call: ref("doc-1"), Attempt: attempt, Failure: http(503)}); err != nil {
			t.Fatal(err)
		}
		h.clock.Advance(time.Second)
	}
	// doc-2 succeeds at once; doc-3 fails for good (422).
	outs := []*pb.Outcome{
		{Call: ref("doc-1"), Attempt: 3, AlreadyRecorded: true, FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER,
			FinalStopReason: pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED},
		{Call: ref("doc-2"), Attempt: 1, Success: true, FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED},
		{Call: ref("doc-3"), Attempt: 1, Failure: http(422), FinalDisposition: pb.Disposition_DISPOSITION_FAILED_TERMINAL,
			FinalStopReason: pb.StopReason_STOP_REASON_TERMINAL},
	}
	if _, err := h.workers.ReportOutcome(worker, &pb.ReportOutcomeRequest{Outcomes: outs}); err != nil {
		t.Fatal(err)
	}

	resp, err := h.admin.ListRunCalls(admin, &pb.ListRunCallsRequest{RunId: "nightly"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range resp.GetCalls() {
		got = append(got, fmt.Sprintf("%s %v %v %d %s %s", c.GetCallId(), c.GetDisposition(), c.GetStopReason(),
			c.GetAttempts(), c.GetLastClassification(), c.GetTriageRef()))
	}
	want := []string{
		"doc-1 DISPOSITION_DEAD_LETTER STOP_REASON_ATTEMPTS_EXHAUSTED 3 transient:503 s3://inbox/doc-1.pdf",
		"doc-2 DISPOSITION_SUCCEEDED STOP_REASON_UNSPECIFIED 1  s3://inbox/doc-2.pdf",
		"doc-3 DISPOSITION_FAILED_TERMINAL STOP_REASON_TERMINAL 1 terminal:422 s3://inbox/doc-3.pdf",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	d1 := resp.GetCalls()[0]
	if !d1.GetFirstAttemptTime().AsTime().Equal(start) || !d1.GetLastAttemptTime().AsTime().Equal(start.Add(3*time.Second)) ||
		d1.GetTarget() != "grants" || d1.GetLastDetail() != "final disposition DEAD_LETTER (ATTEMPTS_EXHAUSTED)" {
		t.Errorf("doc-1: %v, want first attempt %v, last %v, target grants, the final's detail", d1, start, start.Add(3*time.Second))
	}

	// Filtered and paged; a tenant token for its own run.
	dl, err := h.admin.ListRunCalls(worker, &pb.ListRunCallsRequest{RunId: "nightly", Tenant: "acme",
		Dispositions: []pb.Disposition{pb.Disposition_DISPOSITION_DEAD_LETTER, pb.Disposition_DISPOSITION_FAILED_TERMINAL}, PageSize: 1})
	if err != nil || len(dl.GetCalls()) != 1 || dl.GetCalls()[0].GetCallId() != "doc-1" || dl.GetNextPageToken() == "" {
		t.Fatalf("first page of dead letters: %v, %v", dl, err)
	}
	dl, err = h.admin.ListRunCalls(worker, &pb.ListRunCallsRequest{RunId: "nightly", Tenant: "acme", PageToken: dl.GetNextPageToken(),
		Dispositions: []pb.Disposition{pb.Disposition_DISPOSITION_DEAD_LETTER, pb.Disposition_DISPOSITION_FAILED_TERMINAL}, PageSize: 1})
	if err != nil || len(dl.GetCalls()) != 1 || dl.GetCalls()[0].GetCallId() != "doc-3" || dl.GetNextPageToken() != "" {
		t.Fatalf("second page: %v, %v", dl, err)
	}
	byStop, err := h.admin.ListRunCalls(admin, &pb.ListRunCallsRequest{RunId: "nightly",
		StopReasons: []pb.StopReason{pb.StopReason_STOP_REASON_TERMINAL}})
	if err != nil || len(byStop.GetCalls()) != 1 || byStop.GetCalls()[0].GetCallId() != "doc-3" {
		t.Errorf("by stop reason: %v, %v, want doc-3", byStop, err)
	}

	// Tenant-scoped: another tenant's run is NOT_FOUND, as an unknown one;
	// a tenant token must name its own tenant.
	for _, tt := range []struct {
		name string
		ctx  context.Context
		req  *pb.ListRunCallsRequest
		code codes.Code
		msg  string
	}{
		{"unknown run", admin, &pb.ListRunCallsRequest{RunId: "nope"}, codes.NotFound, `run_id: run "nope" not found`},
		{"another tenant's run", withToken("tok-b"), &pb.ListRunCallsRequest{RunId: "nightly", Tenant: "other"}, codes.NotFound,
			`run_id: run "nightly" not found for tenant "other"`},
		{"an unknown run of the tenant", withToken("tok-b"), &pb.ListRunCallsRequest{RunId: "nope", Tenant: "other"}, codes.NotFound,
			`run_id: run "nope" not found for tenant "other"`},
		{"a tenant token naming no tenant", worker, &pb.ListRunCallsRequest{RunId: "nightly"}, codes.PermissionDenied, "tenant"},
		{"a tenant token naming another", worker, &pb.ListRunCallsRequest{RunId: "nightly", Tenant: "other"}, codes.PermissionDenied, "tenant"},
		{"an unknown disposition", admin, &pb.ListRunCallsRequest{RunId: "nightly", Dispositions: []pb.Disposition{42}},
			codes.InvalidArgument, "dispositions[0]"},
	} {
		_, err := h.admin.ListRunCalls(tt.ctx, tt.req)
		if msg := wantCode(t, err, tt.code); !strings.HasPrefix(msg, tt.msg) {
			t.Errorf("%s: %q, want %q", tt.name, msg, tt.msg)
		}
	}
}

// TestTriageRefAndRedriveOfAreChecked: a triage reference over 1 KiB is
// INVALID_ARGUMENT naming the field; a run re-driving an unknown run, or
// another tenant's, is NOT_FOUND naming redrive_of; a re-drive keeps its
// link.
func TestTriageRefAndRedriveOfAreChecked(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	c := call("acme", "grants", "doc-1")
	c.TriageRef = strings.Repeat("x", 1025)
	_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: 1, Failure: http(503)})
	if msg := wantCode(t, err, codes.InvalidArgument); !strings.HasPrefix(msg, "call.triage_ref: must be at most 1024 bytes") {
		t.Errorf("oversized triage_ref: %q", msg)
	}
	cutoff := timestamppb.New(h.clock.Now().Add(time.Hour))
	if _, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "old", Tenant: "acme", RetryPool: 1, CutoffTime: cutoff}); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"acme", "other"} {
		run := "new-" + tenant
		redrive := "nope"
		if tenant == "other" {
			redrive = "old"
		}
		_, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: run, Tenant: tenant, RetryPool: 1, CutoffTime: cutoff, RedriveOf: redrive})
		if msg := wantCode(t, err, codes.NotFound); !strings.HasPrefix(msg, "redrive_of: run "+`"`+redrive+`"`) {
			t.Errorf("redrive_of %s for %s: %q", redrive, tenant, msg)
		}
	}
	r, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "new", Tenant: "acme", RetryPool: 1, CutoffTime: cutoff, RedriveOf: "old"})
	if err != nil || r.GetRun().GetRedriveOf() != "old" {
		t.Fatalf("OpenRun re-driving old: %v, %v", r, err)
	}
	got, err := h.admin.GetRun(ctx, &pb.GetRunRequest{RunId: "new"})
	if err != nil || got.GetRun().GetRedriveOf() != "old" {
		t.Errorf("GetRun: %v, %v, want redrive_of old", got, err)
	}
}
