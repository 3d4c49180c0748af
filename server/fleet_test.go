package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// watchStates follows WatchBreakers and counts the state changes of one
// breaker. It returns after the snapshot, so no change is missed.
func watchStates(t *testing.T, h *harness, tenant, target string) (counts func(pb.BreakerState) int, next func() pb.BreakerState) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := h.workers.WatchBreakers(ctx, &pb.WatchBreakersRequest{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if msg.GetSnapshotComplete() {
			break
		}
	}
	var mu sync.Mutex
	seen := map[pb.BreakerState]int{}
	changes := make(chan pb.BreakerState, 1024)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				close(changes)
				return
			}
			if msg.GetBreaker().GetKey().GetTarget() != target {
				continue
			}
			mu.Lock()
			seen[msg.GetBreaker().GetState()]++
			mu.Unlock()
			changes <- msg.GetBreaker().GetState()
		}
	}()
	counts = func(s pb.BreakerState) int {
		mu.Lock()
		defer mu.Unlock()
		return seen[s]
	}
	next = func() pb.BreakerState {
		select {
		case s := <-changes:
			return s
		case <-time.After(10 * time.Second):
			t.Fatal("no breaker change within 10s")
			return 0
		}
	}
	return counts, next
}

// TestFleetBreakerOverGRPC: 64 workers hit one upstream that starts failing.
// The breaker opens once for all of them; after the cooldown exactly N
// probes are admitted fleet-wide; a probe failure reopens, a probe success
// closes; an unreported permit expires.
func TestFleetBreakerOverGRPC(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	const probes = 3
	n := uint32(probes)
	if _, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "portal", Policy: &pb.Policy{
		Breaker: &pb.BreakerSettings{HalfOpenProbes: &n, Cooldown: durationpb.New(time.Minute), ProbeTimeout: durationpb.New(10 * time.Second)},
	}}); err != nil {
		t.Fatal(err)
	}
	counts, next := watchStates(t, h, "acme", "portal")

	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 4 {
				_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{
					Call: call("acme", "portal", fmt.Sprintf("w%d-%d", w, i)), Attempt: 1, Failure: http(503)})
				if err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if got := next(); got != pb.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("first change: got %v, want OPEN", got)
	}

	admitAll := func() (admitted []string) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		for w := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call("acme", "portal", fmt.Sprint(w)), Attempt: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if resp.GetAdmitted() {
					mu.Lock()
					admitted = append(admitted, resp.GetPermitId())
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return admitted
	}
	if got := admitAll(); len(got) != 0 {
		t.Fatalf("admitted while OPEN: %d", len(got))
	}
	h.clock.Advance(61 * time.Second)
	permits := admitAll()
	if len(permits) != probes {
		t.Fatalf("probes admitted fleet-wide: got %d, want %d", len(permits), probes)
	}
	if got := next(); got != pb.BreakerState_BREAKER_STATE_HALF_OPEN {
		t.Fatalf("change after cooldown: got %v, want HALF_OPEN", got)
	}
	// One probe fails: the breaker reopens for everyone.
	if _, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "portal", "probe"), Attempt: 1,
		Failure: http(503), PermitId: permits[0]}); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != pb.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("after a failed probe: got %v, want OPEN", got)
	}

	// Next cooldown: the probes never report; their permits expire and
	// free their slots for new probes.
	h.clock.Advance(61 * time.Second)
	if got := len(admitAll()); got != probes {
		t.Fatalf("second round of probes: got %d, want %d", got, probes)
	}
	next() // HALF_OPEN
	if got := len(admitAll()); got != 0 {
		t.Fatalf("probes beyond N while permits are out: %d", got)
	}
	h.clock.Advance(11 * time.Second)
	permits = admitAll()
	if len(permits) != probes {
		t.Fatalf("after the permits expired: got %d probes, want %d", len(permits), probes)
	}
	// The probes succeed: the breaker closes.
	var outs []*pb.Outcome
	for i, p := range permits {
		outs = append(outs, &pb.Outcome{Call: call("acme", "portal", fmt.Sprint("probe", i)), Attempt: 1, Success: true, PermitId: p})
	}
	if _, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: outs}); err != nil {
		t.Fatal(err)
	}
	if got := next(); got != pb.BreakerState_BREAKER_STATE_CLOSED {
		t.Fatalf("after successful probes: got %v, want CLOSED", got)
	}
	if c := counts(pb.BreakerState_BREAKER_STATE_OPEN); c != 2 {
		t.Errorf("OPEN transitions: got %d, want 2 (the outage, the failed probe)", c)
	}
}

// TestNoisyTenantLeavesOthersAlone: one tenant floods failures; another
// tenant's budget and breakers on the same target are untouched.
func TestNoisyTenantLeavesOthersAlone(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	var stops atomic.Int32
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20 {
				resp, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{
					Call: call("noisy", fmt.Sprintf("t%d", i%3), fmt.Sprint(w, i)), Attempt: 1, Failure: http(503)})
				if err != nil {
					t.Error(err)
					return
				}
				if resp.GetDecision() == pb.Decision_DECISION_STOP {
					stops.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if stops.Load() == 0 {
		t.Fatal("the noisy tenant was never stopped")
	}
	quiet, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("quiet", "t0", "q"), Attempt: 1, Failure: http(503)})
	if err != nil {
		t.Fatal(err)
	}
	if quiet.GetDecision() != pb.Decision_DECISION_RETRY || quiet.GetBreakerState() != pb.BreakerState_BREAKER_STATE_CLOSED {
		t.Errorf("quiet tenant: got %v with breaker %v, want RETRY with a CLOSED breaker", quiet.GetDecision(), quiet.GetBreakerState())
	}
	st, err := h.admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: "quiet"})
	if err != nil {
		t.Fatal(err)
	}
	if got := st.GetStatus().GetTokens(); got != 99 {
		t.Errorf("quiet tenant's tokens: got %v, want 99 (100 less its one retry)", got)
	}
}
