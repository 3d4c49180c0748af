package policy_test

import (
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

var sinkDecision policy.Decision

func BenchmarkDecide(b *testing.B) {
	p := policy.Default()
	p.CallDeadline = time.Minute
	in := baseInput()
	in.Attempt = 2
	b.ReportAllocs()
	for b.Loop() {
		sinkDecision = policy.Decide(&p, in)
	}
}

func BenchmarkDecideWithRetryAfter(b *testing.B) {
	p := policy.Default()
	p.CallDeadline = time.Hour
	for _, bc := range []struct{ name, value string }{
		{"delta", "120"},
		{"http-date", "Sun, 01 Mar 2026 12:02:00 GMT"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			in := baseInput()
			in.Hints.RetryAfter = bc.value
			in.SpreadDraw = 0.3
			b.ReportAllocs()
			for b.Loop() {
				sinkDecision = policy.Decide(&p, in)
			}
		})
	}
}

var sinkClass policy.Classification

func BenchmarkClassify(b *testing.B) {
	p := policy.Default()
	failures := []policy.Failure{httpF(503), httpF(422), httpF(418), grpcF(14), transportF(policy.TransportTimeout)}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		sinkClass = policy.Classify(&p, failures[i%len(failures)], false, false)
		i++
	}
}

var sinkPlan policy.Plan

func BenchmarkPlanBudget(b *testing.B) {
	in := policy.PlanInput{
		Window:         72 * time.Hour,
		Backoff:        policy.Backoff{Base: 2 * time.Second, Factor: 2, Max: time.Hour},
		AttemptTimeout: 30 * time.Second,
		TTLMargin:      6 * time.Hour,
	}
	b.ReportAllocs()
	for b.Loop() {
		sinkPlan, _ = policy.PlanBudget(in)
	}
}
