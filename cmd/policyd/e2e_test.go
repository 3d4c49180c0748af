package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// binary is the policyd built once for the end-to-end tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "policyd-e2e")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "policyd")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// lazyToken sends the admin token the daemon wrote to path, read at each
// call (the file appears once the daemon has started).
type lazyToken string

func (p lazyToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok, err := readToken(string(p))
	if err != nil {
		return nil, nil
	}
	return map[string]string{"authorization": "Bearer " + tok}, nil
}

func (lazyToken) RequireTransportSecurity() bool { return false }

// daemon is a policyd process on a free loopback port.
type daemon struct {
	cmd    *exec.Cmd
	addr   string
	db     string
	stderr *logBuffer
	done   chan error
}

// logBuffer collects a daemon's log and lets a test wait for a line.
type logBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newLogBuffer() *logBuffer { return &logBuffer{changed: make(chan struct{})} }

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	close(l.changed)
	l.changed = make(chan struct{})
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// waitFor blocks until the log holds n occurrences of substr.
func (l *logBuffer) waitFor(t *testing.T, substr string, n int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		l.mu.Lock()
		count, ch := strings.Count(l.buf.String(), substr), l.changed
		l.mu.Unlock()
		if count >= n {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("the daemon never logged %q %d times; it said: %s", substr, n, l.String())
		}
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func startDaemon(t *testing.T, db string, args ...string) *daemon {
	t.Helper()
	d := &daemon{addr: freeAddr(t), db: db, stderr: newLogBuffer(), done: make(chan error, 1)}
	d.cmd = exec.Command(binary, append([]string{"serve", "--listen", d.addr, "--db", db}, args...)...)
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			d.cmd.Process.Kill()
			<-d.done
		}
	})
	return d
}

// conn dials the daemon and waits (without sleeping) until health says
// SERVING.
func (d *daemon) conn(t *testing.T) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(lazyToken(d.db+".admin-token")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("health: %v; daemon said: %s", err, d.stderr)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: got %v, want SERVING", resp.GetStatus())
	}
	return conn
}

func (d *daemon) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-d.done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("daemon did not exit; it said: %s", d.stderr)
		return nil
	}
}

func TestServeAnswersAndStopsCleanlyOnSIGTERM(t *testing.T) {
	db := filepath.Join(t.TempDir(), "policyd.db")
	d := startDaemon(t, db)
	conn := d.conn(t)
	ctx := context.Background()
	workers := pb.NewRetryPolicyServiceClient(conn)
	resp, err := workers.NextDelay(ctx, &pb.NextDelayRequest{
		Call:    &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "c1", Idempotent: true},
		Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}},
	})
	if err != nil || resp.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("NextDelay: got %v, %v; want RETRY", resp, err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v; daemon said: %s", err, d.stderr)
	}
	if !strings.Contains(d.stderr.String(), "policyd stopped") {
		t.Errorf("log has no clean stop: %s", d.stderr)
	}
}

// TestServeLogsSlowRequests: --slow-request 1ns counts every call (the
// health check and the NextDelay) in one "slow requests" line, written at
// the latest when the daemon drains; a negative bound is refused.
func TestServeLogsSlowRequests(t *testing.T) {
	db := filepath.Join(t.TempDir(), "policyd.db")
	d := startDaemon(t, db, "--slow-request", "1ns")
	conn := d.conn(t)
	_, err := pb.NewRetryPolicyServiceClient(conn).NextDelay(context.Background(), &pb.NextDelayRequest{
		Call:    &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "c1", Idempotent: true},
		Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v; daemon said: %s", err, d.stderr)
	}
	type slowLine struct {
		Level       string `json:"level"`
		Count       int    `json:"count"`
		Over        string `json:"over"`
		Slowest     string `json:"slowest"`
		SlowestCall string `json:"slowest_call"`
	}
	var lines []slowLine
	count := 0
	for _, line := range strings.Split(d.stderr.String(), "\n") {
		if !strings.Contains(line, `"msg":"slow requests"`) {
			continue
		}
		var rec slowLine
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if rec.Level != "WARN" || rec.Over != "1ns" || rec.Slowest == "" || rec.SlowestCall == "" {
			t.Errorf("line %+v: want WARN, over 1ns, the slowest call's time and description", rec)
		}
		lines = append(lines, rec)
		count += rec.Count
	}
	if count < 2 {
		t.Errorf("slow-request lines %+v count %d calls, want the 2 over 1ns; daemon said: %s", lines, count, d.stderr)
	}

	out, err := exec.Command(binary, "serve", "--listen", "127.0.0.1:0", "--db", db, "--slow-request", "-1s").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--slow-request: must be >= 0") {
		t.Errorf("serve --slow-request -1s: got %v\n%s, want a refusal naming the flag", err, out)
	}
}

func TestSecondDaemonOnTheSameFileFailsFast(t *testing.T) {
	db := filepath.Join(t.TempDir(), "policyd.db")
	first := startDaemon(t, db)
	first.conn(t)
	second := startDaemon(t, db)
	err := second.wait(t)
	if err == nil {
		t.Fatal("second daemon on a held file: exited 0, want a failure")
	}
	if !strings.Contains(second.stderr.String(), "held by another process") {
		t.Errorf("second daemon said %q, want it to say the file is held by another process", second.stderr)
	}
}

func TestCorruptDatabaseRefusesToStart(t *testing.T) {
	db := filepath.Join(t.TempDir(), "policyd.db")
	if err := os.WriteFile(db, bytes.Repeat([]byte("not a database "), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, db)
	if err := d.wait(t); err == nil {
		t.Fatal("daemon on a corrupt file exited 0, want a refusal")
	}
	if !strings.Contains(d.stderr.String(), db) {
		t.Errorf("message %q does not name the file", d.stderr)
	}
}

// TestSIGKILLKeepsAcknowledgedState kills the daemon under load (decisions,
// batched outcomes and admin writes in flight), then checks the file and
// restarts on it: every acknowledged admin write is there and the breaker
// that was OPEN is still OPEN.
func TestSIGKILLKeepsAcknowledgedState(t *testing.T) {
	db := filepath.Join(t.TempDir(), "policyd.db")
	d := startDaemon(t, db)
	conn := d.conn(t)
	ctx := context.Background()
	admin := pb.NewAdminServiceClient(conn)
	workers := pb.NewRetryPolicyServiceClient(conn)
	fail := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	for i := range 5 {
		if _, err := workers.NextDelay(ctx, &pb.NextDelayRequest{
			Call:    &pb.CallRef{Tenant: "acme", Target: "portal", CallId: fmt.Sprint(i), Idempotent: true},
			Attempt: 1, Failure: fail,
		}); err != nil {
			t.Fatal(err)
		}
	}

	// Load: 8 decision workers, 2 outcome reporters, 4 admin writers that
	// record each acknowledged write.
	var acked sync.Map // tenant -> capacity
	var nacked atomic.Int32
	enough := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := range 14 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				var err error
				switch {
				case w < 8:
					_, err = workers.NextDelay(ctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: fmt.Sprint("t", w),
						Target: fmt.Sprint("up", i%16), CallId: fmt.Sprint(i), Idempotent: true}, Attempt: 1, Failure: fail})
				case w < 10:
					outs := make([]*pb.Outcome, 50)
					for k := range outs {
						outs[k] = &pb.Outcome{Call: &pb.CallRef{Tenant: fmt.Sprint("t", k%8), Target: fmt.Sprint("up", k%16), CallId: "o"},
							Attempt: 1, Success: true}
					}
					_, err = workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: outs})
				default:
					tenant := fmt.Sprintf("admin-%d-%d", w, i)
					capacity := float64(10 + i)
					_, err = admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: tenant, Capacity: capacity}})
					if err == nil {
						acked.Store(tenant, capacity)
						if nacked.Add(1) == 100 {
							once.Do(func() { close(enough) })
						}
					}
				}
				if err != nil {
					return // the daemon is gone
				}
			}
		}()
	}
	<-enough
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	d.wait(t)
	wg.Wait()

	if out, err := exec.Command(binary, "check", "--db", db).CombinedOutput(); err != nil {
		t.Fatalf("policyd check after SIGKILL: %v: %s", err, out)
	}

	again := startDaemon(t, db)
	conn = again.conn(t)
	admin = pb.NewAdminServiceClient(conn)
	var checked int
	acked.Range(func(k, v any) bool {
		b, err := admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: k.(string)})
		if err != nil || b.GetStatus().GetBudget().GetCapacity() != v.(float64) {
			t.Errorf("acknowledged budget %s after SIGKILL: got %v, %v; want capacity %v", k, b, err, v)
		}
		checked++
		return true
	})
	if checked < 100 {
		t.Errorf("checked %d acknowledged writes, want at least 100", checked)
	}
	br, err := admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "portal"}})
	if err != nil || br.GetBreaker().GetState() != pb.BreakerState_BREAKER_STATE_OPEN {
		t.Errorf("breaker after SIGKILL: got %v, %v; want OPEN", br.GetBreaker().GetState(), err)
	}
}

func TestPlanCommand(t *testing.T) {
	out, err := exec.Command(binary, "plan", "--window", "72h", "--base", "2s", "--factor", "2", "--cap", "1h",
		"--attempt-timeout", "30s", "--ttl-margin", "6h", "--json").Output()
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	var plan struct {
		MaxAttempts int       `json:"max_attempts"`
		Total       float64   `json:"total_seconds"`
		TTL         float64   `json:"idempotency_ttl_seconds"`
		Delays      []float64 `json:"delays_seconds"`
	}
	if err := json.Unmarshal(out, &plan); err != nil {
		t.Fatalf("plan --json: %v in %s", err, out)
	}
	if plan.TTL != 78*3600 || plan.Total > 72*3600 || len(plan.Delays) != plan.MaxAttempts-1 || plan.Delays[0] != 2 {
		t.Errorf("plan: got %+v", plan)
	}

	cmd := exec.Command(binary, "plan", "--window", "1s", "--base", "2s")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err == nil {
		t.Fatal("plan with --base beyond --window exited 0")
	}
	if !strings.Contains(stderr.String(), "--base") {
		t.Errorf("error %q does not name --base", stderr.String())
	}
}

func insecureCreds() credentials.TransportCredentials { return insecure.NewCredentials() }

// runCLI runs the policyd binary in dir.
func runCLI(t *testing.T, dir string, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	return cmd.CombinedOutput()
}
