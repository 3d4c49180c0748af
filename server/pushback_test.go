package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestPushbackIsNotAnOutage: 20 concurrent first attempts answered 503 with
// Retry-After: 1 tripped the default breaker (5 in a row) and sent all 20
// to CIRCUIT_OPEN for 60 s, although each would have succeeded a second
// later. By default a pushback-bearing failure now sets the fleet-wide
// cool-down and counts nothing; breaker.count_pushback restores the count.
func TestPushbackIsNotAnOutage(t *testing.T) {
	tests := []struct {
		name        string
		count       bool
		wantBreaker pb.BreakerState
	}{
		{"by default the cool-down holds the fleet and the breaker stays CLOSED", false, pb.BreakerState_BREAKER_STATE_CLOSED},
		{"count_pushback counts it toward the breaker", true, pb.BreakerState_BREAKER_STATE_OPEN},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			if tt.count {
				if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "portal",
					Policy: &pb.Policy{Breaker: &pb.BreakerSettings{CountPushback: true}}}); err != nil {
					t.Fatalf("SetPolicy: %v", err)
				}
			}
			var wg sync.WaitGroup
			answers := make([]*pb.NextDelayResponse, 20)
			errs := make([]error, 20)
			for i := range answers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					answers[i], errs[i] = h.workers.NextDelay(ctx, &pb.NextDelayRequest{
						Call: call("acme", "portal", fmt.Sprint("doc-", i)), Attempt: 1, Failure: http(503),
						Pushback: &pb.Pushback{RetryAfter: "1"}})
				}()
			}
			wg.Wait()
			retried := 0
			for i, a := range answers {
				if errs[i] != nil {
					t.Fatalf("NextDelay %d: %v", i, errs[i])
				}
				if a.GetDecision() == pb.Decision_DECISION_RETRY {
					retried++
					if a.GetDelay().AsDuration() < time.Second {
						t.Errorf("NextDelay %d: delay %v, want >= the hint's 1s", i, a.GetDelay().AsDuration())
					}
				}
			}
			br, err := h.admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "portal"}})
			if err != nil {
				t.Fatalf("GetBreaker: %v", err)
			}
			if got := br.GetBreaker().GetState(); got != tt.wantBreaker {
				t.Fatalf("breaker %v after 20 pushbacks, want %v", got, tt.wantBreaker)
			}
			if tt.count {
				if retried == 20 {
					t.Fatalf("all 20 retried with count_pushback; want the tripped breaker to stop some")
				}
				return
			}
			if retried != 20 {
				t.Fatalf("%d of 20 retried, want all", retried)
			}
			if br.GetBreaker().GetConsecutiveFailures() != 0 {
				t.Fatalf("consecutive failures %d, want 0: pushback counts nothing", br.GetBreaker().GetConsecutiveFailures())
			}
			// The fleet waits out the cool-down, then goes ahead.
			a, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "portal", "doc-0"), Attempt: 2})
			if err != nil {
				t.Fatalf("Admit: %v", err)
			}
			if a.GetAdmitted() || a.GetReason() != "cooldown:pushback" {
				t.Fatalf("Admit during the cool-down = %v %s, want refused cooldown:pushback", a.GetAdmitted(), a.GetReason())
			}
			h.clock.Advance(a.GetRetryAfter().AsDuration())
			if a, err = h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "portal", "doc-0"), Attempt: 2}); err != nil || !a.GetAdmitted() {
				t.Fatalf("Admit after the cool-down = %v, %v; want admitted", a, err)
			}
		})
	}
}

// TestPushbackOnTheLastAttemptStillCoolsTheFleet: a last attempt answered
// with Retry-After stops (attempts exhausted), counts nothing toward the
// breaker, and still sets the cool-down the rest of the fleet waits for.
func TestPushbackOnTheLastAttemptStillCoolsTheFleet(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "portal", "doc-1"), Attempt: 3,
		Failure: http(429), Pushback: &pb.Pushback{RetryAfter: "30"}})
	if err != nil {
		t.Fatalf("NextDelay: %v", err)
	}
	if a.GetStopReason() != pb.StopReason_STOP_REASON_ATTEMPTS_EXHAUSTED {
		t.Fatalf("stop %v, want ATTEMPTS_EXHAUSTED", a.GetStopReason())
	}
	br, err := h.admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "portal"}})
	if err != nil {
		t.Fatalf("GetBreaker: %v", err)
	}
	if c := br.GetBreaker().GetConsecutiveFailures(); c != 0 {
		t.Fatalf("consecutive failures %d, want 0", c)
	}
	if got := br.GetBreaker().GetCooldownUntilTime().AsTime(); !got.Equal(h.clock.Now().Add(30 * time.Second)) {
		t.Fatalf("cool-down until %v, want %v", got, h.clock.Now().Add(30*time.Second))
	}
}
