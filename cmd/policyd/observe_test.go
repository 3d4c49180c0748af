package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// retrySequence makes call c1 fail twice with 503 and succeed at its third
// attempt, as a worker reports it.
func retrySequence(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx := context.Background()
	workers := pb.NewRetryPolicyServiceClient(conn)
	c := &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "c1", Idempotent: true}
	for attempt := uint32(1); attempt <= 2; attempt++ {
		resp, err := workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: attempt,
			Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}})
		if err != nil || resp.GetDecision() != pb.Decision_DECISION_RETRY {
			t.Fatalf("NextDelay attempt %d: got %v, %v; want RETRY", attempt, resp, err)
		}
	}
	if _, err := workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{
		Call: c, Attempt: 3, Success: true, Latency: durationpb.New(80 * time.Millisecond),
		FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED,
	}}}); err != nil {
		t.Fatalf("ReportOutcome: %v", err)
	}
}

func TestMetricsEndpointServesTheAttemptsHistogram(t *testing.T) {
	db := filepath.Join(t.TempDir(), "policyd.db")
	metrics := freeAddr(t)
	d := startDaemon(t, db, "--metrics-listen", metrics)
	retrySequence(t, d.conn(t))

	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v; daemon said: %s", err, d.stderr)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: status %d, %v", resp.StatusCode, err)
	}
	for _, want := range []string{
		`policyd_attempts_per_success_bucket{target="geo",le="2"} 0`,
		`policyd_attempts_per_success_bucket{target="geo",le="3"} 1`,
		`policyd_attempts_per_success_count{target="geo"} 1`,
		`policyd_decisions_total{decision="RETRY",disposition="NONE",stop_reason="NONE",target="geo"} 2`,
		`policyd_rpc_duration_seconds_count{code="OK",method="NextDelay",service="retrypolicy.v1.RetryPolicyService"} 2`,
		`policyd_breakers{state="CLOSED"} 1`,
		`policyd_budget_tokens{tenant="acme"}`,
		`policyd_audit_buffered`,
		`go_goroutines`,
		`policyd_build_info{goversion="` + runtime.Version() + `",revision="`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if t.Failed() {
		t.Logf("scraped:\n%s", body)
	}
}

// scrape reads the daemon's /metrics.
func scrape(t *testing.T, d *daemon, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v; daemon said: %s", err, d.stderr)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: status %d, %v", resp.StatusCode, err)
	}
	return string(body)
}

// TestMetricsShowBreakersReloadsAndGRPC scrapes a real daemon for the
// series dashboards and alerts use: each breaker's state, the standard
// grpc_server_* series, the policy file's last reload and the build.
func TestMetricsShowBreakersReloadsAndGRPC(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(cfgPath, []byte(goodConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	metrics := freeAddr(t)
	d := startDaemon(t, filepath.Join(dir, "policyd.db"), "--metrics-listen", metrics, "--config", cfgPath)
	conn := d.conn(t)
	retrySequence(t, conn)
	if _, err := pb.NewAdminServiceClient(conn).ForceBreaker(context.Background(), &pb.ForceBreakerRequest{
		Key: &pb.BreakerKey{Tenant: "acme", Target: "geo"}, State: pb.BreakerState_BREAKER_STATE_OPEN,
	}); err != nil {
		t.Fatal(err)
	}

	body := scrape(t, d, metrics)
	for _, want := range []string{
		`policyd_breaker_state{state="OPEN",target="geo",tenant="acme"} 1`,
		`policyd_breaker_state{state="CLOSED",target="geo",tenant="acme"} 0`,
		`policyd_breaker_transitions_total{target="geo",to="OPEN"} 1`,
		`grpc_server_started_total{grpc_method="NextDelay",grpc_service="retrypolicy.v1.RetryPolicyService",grpc_type="unary"} 2`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="NextDelay",grpc_service="retrypolicy.v1.RetryPolicyService",grpc_type="unary"} 2`,
		`grpc_server_handling_seconds_count{grpc_method="NextDelay",grpc_service="retrypolicy.v1.RetryPolicyService",grpc_type="unary"} 2`,
		// Initialised at start: a method never called is there at 0.
		`grpc_server_handled_total{grpc_code="OK",grpc_method="PlanBudget",grpc_service="retrypolicy.v1.RetryPolicyService",grpc_type="unary"} 0`,
		"policyd_config_last_reload_successful 1",
		"policyd_build_info{",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// Every policyd and gRPC series the dashboard and the alert rules use
	// is one the daemon serves.
	for _, file := range []string{"../../deploy/grafana/policyd.json", "../../deploy/prometheus/alerts.yaml"} {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range regexp.MustCompile(`\b(?:policyd|grpc_server|process|go)_[a-z_]+\b`).FindAllString(string(raw), -1) {
			if redisOnlySeries[name] {
				continue // TestTwoReplicasOnOneRedis checks them
			}
			if !regexp.MustCompile(`(?m)^` + name + `[{ ]`).MatchString(body) {
				t.Errorf("%s uses %s, which the daemon does not serve", file, name)
			}
		}
	}

	loadedAt := sampleValue(t, body, "policyd_config_last_reload_success_timestamp_seconds")
	if now := float64(time.Now().Unix()); loadedAt < now-300 || loadedAt > now+5 {
		t.Errorf("reload timestamp: got %v, want about %v", loadedAt, now)
	}

	// A refused reload turns the gauge to 0 and keeps the last success's time.
	if err := os.WriteFile(cfgPath, []byte("policies:\n  - policy: {backoff: {factor: 0.5}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.stderr.waitFor(t, "config reload refused", 1)
	body = scrape(t, d, metrics)
	if !strings.Contains(body, "policyd_config_last_reload_successful 0") {
		t.Errorf("after a refused reload: metrics lack policyd_config_last_reload_successful 0")
	}
	if got := sampleValue(t, body, "policyd_config_last_reload_success_timestamp_seconds"); got != loadedAt {
		t.Errorf("after a refused reload: success timestamp got %v, want the earlier %v", got, loadedAt)
	}
	if t.Failed() {
		t.Logf("scraped:\n%s", body)
	}
}

// sampleValue is the value of the unlabelled series name in a scrape.
// redisOnlySeries are the series of the dashboard and alert rules that
// come with the Redis engine.
var redisOnlySeries = map[string]bool{"policyd_store_up": true, "policyd_store_round_trip_seconds_bucket": true,
	"policyd_store_round_trips_total": true}

func sampleValue(t *testing.T, body, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("metrics lack %s", name)
	return 0
}

func TestAuditCommandShowsACall(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, filepath.Join(dir, "policyd.db"))
	retrySequence(t, d.conn(t))

	out, err := runCLI(t, dir, "audit", "--addr", d.addr, "--call-id", "c1")
	if err != nil {
		t.Fatalf("policyd audit: %v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var events []string
	for _, l := range lines[1:] {
		events = append(events, strings.Fields(l)[1])
	}
	if got := strings.Join(events, " "); got != "DECISION DECISION FINAL" || !strings.Contains(lines[1], "transient:503") ||
		!strings.Contains(lines[3], "attempt succeeded in 80ms") {
		t.Errorf("policyd audit: got events %q in\n%s\nwant DECISION DECISION FINAL, the first classified transient:503, the last saying the attempt succeeded in 80ms", got, out)
	}

	out, err = runCLI(t, dir, "audit", "--addr", d.addr, "--tenant", "acme", "--since", "1h", "--json")
	if err != nil {
		t.Fatalf("policyd audit --json: %v: %s", err, out)
	}
	var resp struct {
		Records []struct {
			Event   string `json:"event"`
			CallID  string `json:"callId"`
			Attempt int    `json:"attempt"`
		} `json:"records"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("policyd audit --json: %v in %s", err, out)
	}
	if len(resp.Records) != 3 || resp.Records[2].Event != "AUDIT_EVENT_FINAL" || resp.Records[2].Attempt != 3 {
		t.Errorf("policyd audit --json: got %+v, want 3 records ending in the FINAL of attempt 3", resp.Records)
	}

	out, err = runCLI(t, dir, "audit", "--addr", d.addr)
	if err == nil || !strings.Contains(string(out), "--call-id or --tenant") {
		t.Errorf("policyd audit without a selector: got %v: %s, want an error naming --call-id or --tenant", err, out)
	}
}

// collector is a fake OTLP trace collector that hands over every span name.
type collector struct {
	collectortrace.UnimplementedTraceServiceServer
	spans chan string
}

func (c *collector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				select {
				case c.spans <- s.GetName():
				default:
				}
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

func TestTracesReachTheOTLPCollector(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{spans: make(chan string, 100)}
	gs := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(gs, col)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)

	d := startDaemon(t, filepath.Join(t.TempDir(), "policyd.db"), "--otlp-endpoint", lis.Addr().String())
	retrySequence(t, d.conn(t))
	// The batch exporter sends at shutdown at the latest.
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v; daemon said: %s", err, d.stderr)
	}
	seen := map[string]bool{}
	for {
		select {
		case name := <-col.spans:
			seen[name] = true
			continue
		default:
		}
		break
	}
	if !seen["retrypolicy.v1.RetryPolicyService/NextDelay"] || !seen["retrypolicy.v1.RetryPolicyService/ReportOutcome"] {
		t.Errorf("spans: got %v, want NextDelay and ReportOutcome; daemon said: %s", seen, d.stderr)
	}
}
