package server

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/policyd/policyd/policy"
)

// BenchmarkMetricsDecision is what counting one NextDelay answer adds to
// it: the target's capped label and the counter of its four labels. It
// must not allocate.
func BenchmarkMetricsDecision(b *testing.B) {
	m, err := NewMetrics(prometheus.NewRegistry(), MetricsOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		m.decision("payments", true, policy.StopNone, policy.DispositionNone)
	}
}
