package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/timestamppb"

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

// daemon is a policyd process on a free loopback port.
type daemon struct {
	cmd    *exec.Cmd
	addr   string
	stderr *bytes.Buffer
	done   chan error
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
	d := &daemon{addr: freeAddr(t), stderr: &bytes.Buffer{}, done: make(chan error, 1)}
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
	conn, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
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

// TestSIGKILLKeepsAcknowledgedState kills the daemon with acknowledged
// admin writes and an OPEN breaker, restarts it on the same file and checks
// both survived.
func TestSIGKILLKeepsAcknowledgedState(t *testing.T) {
	db := filepath.Join(t.TempDir(), "policyd.db")
	d := startDaemon(t, db)
	conn := d.conn(t)
	ctx := context.Background()
	admin := pb.NewAdminServiceClient(conn)
	workers := pb.NewRetryPolicyServiceClient(conn)
	if _, err := admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "acme", Capacity: 42}}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "nightly", Tenant: "acme", RetryPool: 900,
		CutoffTime: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := workers.NextDelay(ctx, &pb.NextDelayRequest{
			Call:    &pb.CallRef{Tenant: "acme", Target: "portal", CallId: string(rune('a' + i)), Idempotent: true},
			Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}},
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	d.wait(t)

	again := startDaemon(t, db)
	conn = again.conn(t)
	admin = pb.NewAdminServiceClient(conn)
	b, err := admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: "acme"})
	if err != nil || b.GetStatus().GetBudget().GetCapacity() != 42 {
		t.Errorf("budget after SIGKILL: got %v, %v; want capacity 42", b, err)
	}
	if _, err := admin.GetRun(ctx, &pb.GetRunRequest{RunId: "nightly"}); err != nil {
		t.Errorf("run after SIGKILL: %v", err)
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
