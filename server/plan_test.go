package server_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// grantWindow is the 72 h grant-submission window of TestPlanBudgetKnownSchedule
// (policy package): 82 attempts fit it whole.
func grantWindow() *pb.PlanBudgetRequest {
	f := 2.0
	return &pb.PlanBudgetRequest{
		Window:         durationpb.New(72 * time.Hour),
		Backoff:        &pb.BackoffSettings{BaseDelay: durationpb.New(2 * time.Second), Factor: &f, MaxDelay: durationpb.New(time.Hour)},
		AttemptTimeout: durationpb.New(30 * time.Second),
		TtlMargin:      durationpb.New(6 * time.Hour),
	}
}

func TestPlanBudgetRemaining(t *testing.T) {
	h := newHarness(t)
	now := h.clock.Now()
	tests := []struct {
		name      string
		origin    time.Time
		reserve   float64
		attempts  uint32
		remaining time.Duration
		usable    time.Duration
		ttl       time.Duration
		reason    string
	}{
		{"no origin", time.Time{}, 0, 82, 72 * time.Hour, 72 * time.Hour, 78 * time.Hour, ""},
		{"71h into 72h", now.Add(-71 * time.Hour), 0, 11, time.Hour, time.Hour, 7 * time.Hour, ""},
		{"reserve half", time.Time{}, 0.5, 46, 72 * time.Hour, 36 * time.Hour, 78 * time.Hour, ""},
		{"origin within the skew", now.Add(4 * time.Minute), 0, 82, 72 * time.Hour, 72 * time.Hour, 78 * time.Hour, ""},
		{"spent", now.Add(-73 * time.Hour), 0, 0, 0, 0, 6 * time.Hour, "window:spent"},
		{"no room", now.Add(-72*time.Hour + 10*time.Second), 0, 0, 10 * time.Second, 10 * time.Second, 6*time.Hour + 10*time.Second, "window:no_room"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := grantWindow()
			if !tt.origin.IsZero() {
				req.OriginTime = timestamppb.New(tt.origin)
			}
			req.Reserve = tt.reserve
			resp, err := h.workers.PlanBudget(context.Background(), req)
			if err != nil {
				t.Fatalf("PlanBudget: %v, want a plan", err)
			}
			p := resp.GetPlan()
			if p.GetMaxAttempts() != tt.attempts || p.GetRemaining().AsDuration() != tt.remaining || p.GetUsable().AsDuration() != tt.usable ||
				p.GetIdempotencyTtl().AsDuration() != tt.ttl || p.GetReason() != tt.reason {
				t.Errorf("plan: got %d attempts, remaining %v, usable %v, TTL %v, reason %q; want %d, %v, %v, %v, %q",
					p.GetMaxAttempts(), p.GetRemaining().AsDuration(), p.GetUsable().AsDuration(), p.GetIdempotencyTtl().AsDuration(), p.GetReason(),
					tt.attempts, tt.remaining, tt.usable, tt.ttl, tt.reason)
			}
			if len(p.GetDelays()) != max(int(p.GetMaxAttempts())-1, 0) || p.GetWorstCaseTotal().AsDuration() > p.GetUsable().AsDuration() {
				t.Errorf("plan: %d delays and worst case %v for %d attempts in %v usable", len(p.GetDelays()), p.GetWorstCaseTotal().AsDuration(), p.GetMaxAttempts(), p.GetUsable().AsDuration())
			}
		})
	}
}

func TestPlanBudgetRemainingInvalid(t *testing.T) {
	h := newHarness(t)
	now := h.clock.Now()
	tests := []struct {
		name   string
		edit   func(*pb.PlanBudgetRequest)
		prefix string
	}{
		{"reserve 1", func(r *pb.PlanBudgetRequest) { r.Reserve = 1 }, "reserve: must be in [0, 1)"},
		{"negative reserve", func(r *pb.PlanBudgetRequest) { r.Reserve = -0.25 }, "reserve: must be in [0, 1)"},
		{"NaN reserve", func(r *pb.PlanBudgetRequest) { r.Reserve = math.NaN() }, "reserve: must be in [0, 1)"},
		{"origin beyond the skew", func(r *pb.PlanBudgetRequest) { r.OriginTime = timestamppb.New(now.Add(6 * time.Minute)) },
			"origin_time: must not be more than 5m0s after the daemon's clock"},
		{"invalid origin", func(r *pb.PlanBudgetRequest) { r.OriginTime = &timestamppb.Timestamp{Nanos: -1} }, "origin_time: must be a valid timestamp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := grantWindow()
			tt.edit(req)
			_, err := h.workers.PlanBudget(context.Background(), req)
			if msg := wantCode(t, err, codes.InvalidArgument); !strings.HasPrefix(msg, tt.prefix) {
				t.Errorf("PlanBudget: got %q, want it to start %q", msg, tt.prefix)
			}
		})
	}
}
