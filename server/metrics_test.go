package server_test

import (
	"context"
	"io"
	nethttp "net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// withMetrics gives the harness's server metrics on a fresh registry.
func withMetrics(t *testing.T, opts server.MetricsOptions) (harnessOpt, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := server.NewMetrics(reg, opts)
	if err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
	return func(c *server.Config, _ *breakerstore.Options) { c.Metrics = m }, reg
}

// sample returns the value of the series name{labels} (a histogram's
// sample count) and whether it exists; labels are "k=v" pairs.
func sample(t *testing.T, reg prometheus.Gatherer, name string, labels ...string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	sort.Strings(labels)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var got []string
			for _, lp := range m.GetLabel() {
				got = append(got, lp.GetName()+"="+lp.GetValue())
			}
			sort.Strings(got)
			if strings.Join(got, ",") != strings.Join(labels, ",") {
				continue
			}
			switch {
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount()), true
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func TestMetricsAfterAFewCalls(t *testing.T) {
	opt, reg := withMetrics(t, server.MetricsOptions{MaxTargets: 2})
	h := newHarness(t, opt)
	ctx := context.Background()
	// Call 1 succeeds at its third attempt, call 2 at its first, call 3 on
	// a third target (past the label cap) at its second.
	for attempt := uint32(1); attempt <= 2; attempt++ {
		if _, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo", "c1"), Attempt: attempt, Failure: http(503)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo", "c4"), Attempt: 1, Failure: http(404)}); err != nil {
		t.Fatal(err)
	}
	_, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("acme", "geo", "c1"), Attempt: 3, Success: true, FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED},
		{Call: call("acme", "geo", "c2"), Attempt: 1, Success: true},
		{Call: call("acme", "mail", "c5"), Attempt: 1, Success: true},
		{Call: call("acme", "pay", "c3"), Attempt: 2, Success: true},
		{Call: call("acme", "geo", "c4"), Attempt: 1, AlreadyRecorded: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{
		Key: &pb.BreakerKey{Tenant: "acme", Target: "geo"}, State: pb.BreakerState_BREAKER_STATE_OPEN,
	}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"policyd_attempts_per_success", []string{"target=geo"}, 2},
		{"policyd_attempts_per_success", []string{"target=mail"}, 1},
		{"policyd_attempts_per_success", []string{"target=other"}, 1},
		{"policyd_decisions_total", []string{"decision=RETRY", "stop_reason=NONE", "disposition=NONE", "target=geo"}, 2},
		{"policyd_decisions_total", []string{"decision=STOP", "stop_reason=TERMINAL", "disposition=FAILED_TERMINAL", "target=geo"}, 1},
		{"policyd_rpc_duration_seconds", []string{"service=retrypolicy.v1.RetryPolicyService", "method=NextDelay", "code=OK"}, 3},
		{"policyd_rpc_duration_seconds", []string{"service=retrypolicy.v1.RetryPolicyService", "method=ReportOutcome", "code=OK"}, 1},
		{"policyd_breakers", []string{"state=OPEN"}, 1},
		{"policyd_breakers", []string{"state=CLOSED"}, 2},
		{"policyd_breaker_transitions_total", []string{"to=OPEN", "target=geo"}, 1},
		// One series per breaker and state: 1 for the state it is in.
		{"policyd_breaker_state", []string{"tenant=acme", "target=geo", "state=OPEN"}, 1},
		{"policyd_breaker_state", []string{"tenant=acme", "target=geo", "state=CLOSED"}, 0},
		{"policyd_breaker_state", []string{"tenant=acme", "target=geo", "state=HALF_OPEN"}, 0},
		{"policyd_breaker_state", []string{"tenant=acme", "target=mail", "state=CLOSED"}, 1},
		// pay came third, past MaxTargets 2: counted under "other".
		{"policyd_breaker_state", []string{"tenant=acme", "target=other", "state=CLOSED"}, 1},
		{"policyd_breaker_state", []string{"tenant=acme", "target=other", "state=OPEN"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name+"{"+strings.Join(tt.labels, ",")+"}", func(t *testing.T) {
			got, ok := sample(t, reg, tt.name, tt.labels...)
			if !ok || got != tt.want {
				t.Errorf("got %v (present %v), want %v", got, ok, tt.want)
			}
		})
	}
	if got, ok := sample(t, reg, "policyd_budget_tokens", "tenant=acme"); !ok || got <= 0 {
		t.Errorf("policyd_budget_tokens{tenant=acme}: got %v (present %v), want tokens left", got, ok)
	}

	// The histogram in full: attempts 3 and 1 on geo, buckets 1 to 10.
	want := `
# HELP policyd_attempts_per_success Attempt number of each reported success, counting the first attempt as 1, by target.
# TYPE policyd_attempts_per_success histogram
policyd_attempts_per_success_bucket{target="geo",le="1"} 1
policyd_attempts_per_success_bucket{target="geo",le="2"} 1
policyd_attempts_per_success_bucket{target="geo",le="3"} 2
policyd_attempts_per_success_bucket{target="geo",le="4"} 2
policyd_attempts_per_success_bucket{target="geo",le="5"} 2
policyd_attempts_per_success_bucket{target="geo",le="6"} 2
policyd_attempts_per_success_bucket{target="geo",le="7"} 2
policyd_attempts_per_success_bucket{target="geo",le="8"} 2
policyd_attempts_per_success_bucket{target="geo",le="9"} 2
policyd_attempts_per_success_bucket{target="geo",le="10"} 2
policyd_attempts_per_success_bucket{target="geo",le="+Inf"} 2
policyd_attempts_per_success_sum{target="geo"} 4
policyd_attempts_per_success_count{target="geo"} 2
policyd_attempts_per_success_bucket{target="mail",le="1"} 1
policyd_attempts_per_success_bucket{target="mail",le="2"} 1
policyd_attempts_per_success_bucket{target="mail",le="3"} 1
policyd_attempts_per_success_bucket{target="mail",le="4"} 1
policyd_attempts_per_success_bucket{target="mail",le="5"} 1
policyd_attempts_per_success_bucket{target="mail",le="6"} 1
policyd_attempts_per_success_bucket{target="mail",le="7"} 1
policyd_attempts_per_success_bucket{target="mail",le="8"} 1
policyd_attempts_per_success_bucket{target="mail",le="9"} 1
policyd_attempts_per_success_bucket{target="mail",le="10"} 1
policyd_attempts_per_success_bucket{target="mail",le="+Inf"} 1
policyd_attempts_per_success_sum{target="mail"} 1
policyd_attempts_per_success_count{target="mail"} 1
policyd_attempts_per_success_bucket{target="other",le="1"} 0
policyd_attempts_per_success_bucket{target="other",le="2"} 1
policyd_attempts_per_success_bucket{target="other",le="3"} 1
policyd_attempts_per_success_bucket{target="other",le="4"} 1
policyd_attempts_per_success_bucket{target="other",le="5"} 1
policyd_attempts_per_success_bucket{target="other",le="6"} 1
policyd_attempts_per_success_bucket{target="other",le="7"} 1
policyd_attempts_per_success_bucket{target="other",le="8"} 1
policyd_attempts_per_success_bucket{target="other",le="9"} 1
policyd_attempts_per_success_bucket{target="other",le="10"} 1
policyd_attempts_per_success_bucket{target="other",le="+Inf"} 1
policyd_attempts_per_success_sum{target="other"} 2
policyd_attempts_per_success_count{target="other"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "policyd_attempts_per_success"); err != nil {
		t.Errorf("attempts histogram: %v", err)
	}

	// The same registry over HTTP, as Prometheus scrapes it.
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != nethttp.StatusOK || !strings.Contains(string(body), `policyd_attempts_per_success_count{target="geo"} 2`) {
		t.Errorf("scrape: got %d with\n%s\nwant the attempts histogram", resp.StatusCode, body)
	}
}

func TestMetricsAreOptional(t *testing.T) {
	// A server without metrics answers as usual (a nil *Metrics records
	// nothing).
	h := newHarness(t)
	if _, err := h.workers.ReportOutcome(context.Background(), &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("acme", "geo", "c1"), Attempt: 1, Success: true},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := server.NewMetrics(prometheus.NewRegistry(), server.MetricsOptions{}); err != nil {
		t.Fatalf("NewMetrics: %v", err)
	}
}

// TestGRPCSeriesCountRefusedCalls: the standard grpc_server_* series see
// every call, including those authentication refuses before a handler
// runs, so a stock dashboard's error rate is the clients' error rate.
func TestGRPCSeriesCountRefusedCalls(t *testing.T) {
	opt, reg := withMetrics(t, server.MetricsOptions{})
	h := newHarness(t, opt, func(c *server.Config, _ *breakerstore.Options) {
		c.Auth = server.NewAuth(server.AuthConfig{AdminTokens: []string{"admin-secret"}})
	})
	ctx := context.Background()
	if _, err := h.admin.ListBreakers(ctx, &pb.ListBreakersRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("ListBreakers without a token: got %v, want UNAUTHENTICATED", err)
	}
	if _, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("acme", "geo", "c1"), Attempt: 1, Failure: http(503)}); err != nil {
		t.Fatal(err)
	}
	admin := []string{"grpc_service=retrypolicy.v1.AdminService", "grpc_method=ListBreakers", "grpc_type=unary"}
	workers := []string{"grpc_service=retrypolicy.v1.RetryPolicyService", "grpc_method=NextDelay", "grpc_type=unary"}
	for _, tt := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"grpc_server_started_total", admin, 1},
		{"grpc_server_handled_total", append([]string{"grpc_code=Unauthenticated"}, admin...), 1},
		{"grpc_server_handled_total", append([]string{"grpc_code=OK"}, workers...), 1},
		{"grpc_server_handling_seconds", workers, 1},
	} {
		if got, ok := sample(t, reg, tt.name, tt.labels...); !ok || got != tt.want {
			t.Errorf("%s{%s}: got %v (present %v), want %v", tt.name, strings.Join(tt.labels, ","), got, ok, tt.want)
		}
	}
}
