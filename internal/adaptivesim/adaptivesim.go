// Package adaptivesim is the scenario of issue 15's adaptive-ceiling goal,
// run through a real policyd: simulated workers take leases (Admit), call
// a fake upstream that answers 429 with a Retry-After above a hidden
// capacity of concurrent requests, and report what came of each attempt
// (NextDelay for a 429, a ReportOutcome batch per step for the successes),
// while the time moves in steps. The server test drives it on the
// daemon's fake clock (server/adaptive_test.go); `policybench adaptive`
// drives it in real time against a spawned daemon. It is test and
// benchmark scaffolding: the daemon does not link it.
//
// The model, per step (the time one upstream request takes): every idle
// worker whose wait is over asks Admit for its call's next attempt; an
// admitted one calls the upstream, which takes the request while fewer
// than Capacity are in flight and answers 429 + Retry-After at once
// otherwise (the worker tells NextDelay, with its lease, and waits the
// delay it answers, or starts a new call on STOP); a refused one waits
// the retry_after Admit answered. At the end of the step the time moves
// on, the requests taken succeed and are reported in one batch, with
// their leases, and their workers start new calls. Workers are taken in
// order within a step, so a run is deterministic on a fake clock.
package adaptivesim

import (
	"context"
	"fmt"
	"strconv"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// Clock is the scenario's time: Now, and Advance, which moves it one step
// on (a fake clock) or waits until it has passed (real time).
type Clock interface {
	Now() time.Time
	Advance(d time.Duration)
}

// Config is a scenario.
type Config struct {
	Tenant, Target string
	Workers        int           // simulated workers, each one call at a time
	Capacity       int           // concurrent requests the upstream takes; above it, 429
	RetryAfter     string        // the Retry-After of its 429s (delta-seconds)
	Step           time.Duration // how long an upstream request takes; the step of the simulation
	Steps          int
}

// Sample is the state after one step.
type Sample struct {
	Elapsed    time.Duration // since the start, at the end of the step
	Ceiling    int           // the ceiling in force (Breaker.ceiling) after the step
	Adaptive   float64       // its exact value (Breaker.adaptive_limit)
	Requests   int           // upstream requests in the step
	Congested  int           // of them answered 429
	MostInside int           // the most requests the upstream held at once
	Refused    int           // Admits refused in the step
}

// worker is one simulated worker's call.
type worker struct {
	call    int // the call's number; a new call gets a new id
	attempt uint32
	wake    time.Time
	lease   string // the lease of the request the upstream holds, if any
}

// Run plays cfg through workers (RetryPolicyService) and admin
// (AdminService, for GetBreaker), on clock, and returns a sample per step.
// The policy with the adaptive ceiling must be set beforehand.
func Run(ctx context.Context, cfg Config, workers pb.RetryPolicyServiceClient, admin pb.AdminServiceClient, clock Clock) ([]Sample, error) {
	ws := make([]worker, cfg.Workers)
	next := 0
	for i := range ws {
		ws[i] = worker{call: next, attempt: 1, wake: clock.Now()}
		next++
	}
	ref := func(w *worker) *pb.CallRef {
		return &pb.CallRef{Tenant: cfg.Tenant, Target: cfg.Target, CallId: "call-" + strconv.Itoa(w.call), Idempotent: true}
	}
	start := clock.Now()
	samples := make([]Sample, 0, cfg.Steps)
	for range cfg.Steps {
		var s Sample
		inside := 0
		for i := range ws {
			w := &ws[i]
			now := clock.Now()
			if w.lease != "" || w.wake.After(now) {
				continue
			}
			a, err := workers.Admit(ctx, &pb.AdmitRequest{Call: ref(w), Attempt: w.attempt})
			if err != nil {
				return samples, fmt.Errorf("Admit: %w", err)
			}
			if !a.GetAdmitted() {
				s.Refused++
				w.wake = now.Add(max(a.GetRetryAfter().AsDuration(), time.Millisecond))
				continue
			}
			s.Requests++
			if inside < cfg.Capacity {
				inside++
				s.MostInside = max(s.MostInside, inside)
				w.lease = a.GetLeaseId()
				continue
			}
			s.Congested++
			nd, err := workers.NextDelay(ctx, &pb.NextDelayRequest{Call: ref(w), Attempt: w.attempt,
				Failure:  &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 429}},
				Pushback: &pb.Pushback{RetryAfter: cfg.RetryAfter}, LeaseId: a.GetLeaseId()})
			if err != nil {
				return samples, fmt.Errorf("NextDelay: %w", err)
			}
			if nd.GetDecision() == pb.Decision_DECISION_RETRY {
				w.attempt++
				w.wake = now.Add(nd.GetDelay().AsDuration())
			} else {
				*w = worker{call: next, attempt: 1, wake: now}
				next++
			}
		}
		clock.Advance(cfg.Step)
		var outs []*pb.Outcome
		for i := range ws {
			w := &ws[i]
			if w.lease == "" {
				continue
			}
			outs = append(outs, &pb.Outcome{Call: ref(w), Attempt: w.attempt, Success: true, LeaseId: w.lease,
				FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED})
			*w = worker{call: next, attempt: 1, wake: clock.Now()}
			next++
		}
		if len(outs) > 0 {
			if _, err := workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: outs}); err != nil {
				return samples, fmt.Errorf("ReportOutcome: %w", err)
			}
		}
		br, err := admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: cfg.Tenant, Target: cfg.Target}})
		if err != nil {
			return samples, fmt.Errorf("GetBreaker: %w", err)
		}
		s.Elapsed = clock.Now().Sub(start)
		s.Ceiling, s.Adaptive = int(br.GetBreaker().GetCeiling()), br.GetBreaker().GetAdaptiveLimit()
		samples = append(samples, s)
	}
	return samples, nil
}

// Summary is a run's second half (from the step after half the steps):
// the ceiling's range and the share of upstream requests answered 429.
type Summary struct {
	Lo, Hi              int
	Requests, Congested int
	MostInside          int
}

// Share is the share of requests answered 429, 0 to 1.
func (s Summary) Share() float64 {
	if s.Requests == 0 {
		return 0
	}
	return float64(s.Congested) / float64(s.Requests)
}

// SecondHalf summarises the second half of samples.
func SecondHalf(samples []Sample) Summary {
	sum := Summary{Lo: 1 << 30}
	for _, s := range samples[len(samples)/2:] {
		sum.Lo, sum.Hi = min(sum.Lo, s.Ceiling), max(sum.Hi, s.Ceiling)
		sum.Requests += s.Requests
		sum.Congested += s.Congested
		sum.MostInside = max(sum.MostInside, s.MostInside)
	}
	return sum
}
