package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// policydProcess is a policyd binary running as a process of its own on a
// loopback port, so a test can make it silent with SIGSTOP: its
// connections stay open and nothing on them is answered.
type policydProcess struct {
	cmd   *exec.Cmd
	addr  string
	admin pb.AdminServiceClient
	conn  *grpc.ClientConn // for the workers' client
}

// adminToken sends the admin token the daemon wrote next to its file.
type adminToken string

func (p adminToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	tok, err := os.ReadFile(string(p))
	if err != nil {
		return nil, nil // not written yet: health needs none
	}
	return map[string]string{"authorization": "Bearer " + strings.TrimSpace(string(tok))}, nil
}

func (adminToken) RequireTransportSecurity() bool { return false }

func startPolicydProcess(t *testing.T) *policydProcess {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "policyd")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/policyd/policyd/cmd/policyd").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	db := filepath.Join(dir, "policyd.db")
	p := &policydProcess{addr: addr, cmd: exec.Command(bin, "serve", "--listen", addr, "--db", db, "--log-level", "error")}
	p.cmd.Stderr = os.Stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT) // a test that failed while it was stopped
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	})
	adminConn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(adminToken(db+".admin-token")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adminConn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if resp, err := healthpb.NewHealthClient(adminConn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil ||
		resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v; want SERVING", resp, err)
	}
	p.admin = pb.NewAdminServiceClient(adminConn)
	if p.conn, err = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.conn.Close() })
	return p
}

func (p *policydProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%v: %v", sig, err)
	}
	if sig == syscall.SIGSTOP || sig == syscall.SIGCONT {
		p.waitStopped(t, sig == syscall.SIGSTOP)
	}
}

// waitStopped returns once the kernel shows the daemon stopped (or running
// again): a signal is delivered asynchronously, and a request sent right
// after kill(2) could still be answered by a daemon not yet stopped. Where
// there is no /proc to read the state from, it returns at once.
func (p *policydProcess) waitStopped(t *testing.T, stopped bool) {
	t.Helper()
	path := fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); ; {
		b, err := os.ReadFile(path)
		if err != nil {
			return
		}
		// The state is the field after the command name, which is in
		// parentheses and may itself hold spaces.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return
		}
		if (b[i+2] == 'T') == stopped {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon's state is %q, want stopped %v", b[i+2], stopped)
		}
		runtime.Gosched()
	}
}

// waitsOnly is a client's Sleep that records each wait and returns at once,
// without moving the clock: the client's clock is the real one, which the
// daemon's clock agrees with, and only the decision timeouts of the
// unanswered Admits (real) move time on.
type waitsOnly struct {
	mu sync.Mutex
	d  []time.Duration
}

func (w *waitsOnly) Sleep(ctx context.Context, d time.Duration) error {
	w.mu.Lock()
	w.d = append(w.d, d)
	w.mu.Unlock()
	return ctx.Err()
}

func (w *waitsOnly) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.d)
}

// TestCeilingHoldsWhilePolicydIsSilent: a target with a concurrency
// ceiling of 2 has both leases taken by two attempts in progress when the
// policyd process is stopped (SIGSTOP: every Admit is left unanswered).
// The calls that come while it is silent do not go to the upstream
// without a lease: they wait and ask Admit again, and end dead letters
// (DEADLINE, flow:unavailable) when their deadline leaves no room, with no
// attempt made; the upstream never sees more than 2 requests at once. A
// target without a ceiling keeps the local fallback: its call succeeds
// meanwhile. Once policyd runs again, the dead letters' reports reach it.
// (Before the fix the silent calls were admitted locally and the upstream
// saw 3 and more at once.)
func TestCeilingHoldsWhilePolicydIsSilent(t *testing.T) {
	p := startPolicydProcess(t)
	ctx := context.Background()
	noTrip := uint32(10000)
	ceiling := uint32(2)
	if _, err := p.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "portal",
		Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: &ceiling}, Breaker: &pb.BreakerSettings{ConsecutiveFailures: &noTrip}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	var waits waitsOnly
	const attemptTimeout = time.Second
	c, err := policyclient.New(p.conn, policyclient.Config{Tenant: "acme", DecisionTimeout: 50 * time.Millisecond,
		AttemptTimeout: attemptTimeout, RetryUnreachableAfter: 100 * time.Millisecond, Sleep: waits.Sleep, NoWatch: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var up upstream
	// Two attempts take the two leases and stay in the upstream until
	// released; their Admit answers told the client that portal has a
	// ceiling.
	release := make(chan struct{})
	var holders sync.WaitGroup
	inside := make(chan struct{}, 2)
	for i := range 2 {
		holders.Add(1)
		go func() {
			defer holders.Done()
			res, err := c.Do(ctx, policyclient.Call{Target: "portal", SubmissionID: fmt.Sprint("held-", i), Idempotent: true},
				func(context.Context, policyclient.Attempt) error {
					up.enter()
					inside <- struct{}{}
					<-release
					up.leave()
					return nil
				})
			if err != nil || !res.OK() {
				t.Errorf("held call %d: %+v, %v; want success", i, res, err)
			}
		}()
	}
	<-inside
	<-inside

	t.Logf("%v: stopping policyd", time.Now().Format(time.StampMilli))
	p.signal(t, syscall.SIGSTOP)
	// A target without a ceiling is not held up by the silence.
	if res, err := c.Do(ctx, policyclient.Call{Target: "elsewhere", SubmissionID: "free", Idempotent: true},
		func(context.Context, policyclient.Attempt) error { return nil }); err != nil || !res.OK() || res.Attempts != 1 {
		t.Errorf("Do(elsewhere) while policyd is silent: %+v, %v; want success in 1 attempt (the local fallback)", res, err)
	}
	const silent = 4
	var wg sync.WaitGroup
	results := make([]policyclient.Result, silent)
	for i := range silent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(attemptTimeout + 600*time.Millisecond)
			results[i], _ = c.Do(ctx, policyclient.Call{Target: "portal", SubmissionID: fmt.Sprint("silent-", i), Idempotent: true,
				Deadline: deadline},
				func(context.Context, policyclient.Attempt) error { return up.serve(false) })
		}()
	}
	wg.Wait()
	for i, res := range results {
		if res.Disposition != policyclient.DeadLetter || res.StopReason != policyclient.StopDeadline ||
			res.Reason != "flow:unavailable" || res.Attempts != 0 {
			t.Errorf("silent call %d: got %v (%v, %q) after %d attempts; want dead_letter (DEADLINE, flow:unavailable) after 0",
				i, res.Disposition, res.StopReason, res.Reason, res.Attempts)
		}
	}
	if m := up.most.Load(); m > int32(ceiling) {
		t.Errorf("the upstream saw %d requests at once while policyd was silent; the ceiling is %d", m, ceiling)
	}
	// Each call has 600ms of room and its Admits time out after 100ms, so
	// it waits and asks again; a loaded machine may leave one call no room
	// to, not all of them.
	if waits.count() == 0 {
		t.Errorf("no wait before asking Admit again")
	}

	t.Logf("%v: resuming policyd", time.Now().Format(time.StampMilli))
	p.signal(t, syscall.SIGCONT)
	close(release)
	holders.Wait()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Close(cctx); err != nil {
		t.Fatalf("Close once policyd answers again: %v", err)
	}
	if st := c.Stats(); st.OutcomesDropped != 0 {
		t.Errorf("%d outcomes dropped (refused or lost); want every report, the dead letters' too, taken", st.OutcomesDropped)
	}
	audit, err := p.admin.QueryAudit(ctx, &pb.QueryAuditRequest{CallId: "silent-0"})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range audit.GetRecords() {
		found = found || r.GetDisposition() == pb.Disposition_DISPOSITION_DEAD_LETTER
	}
	if !found {
		t.Errorf("audit of silent-0: %v; want its DEAD_LETTER reported once policyd answered", audit.GetRecords())
	}
	t.Logf("%d upstream calls, at most %d at once; %d waits for a silent policyd", up.calls.Load(), up.most.Load(), waits.count())
}

// enter counts a request the test holds inside the upstream until leave.
func (u *upstream) enter() {
	n := u.inside.Add(1)
	for m := u.most.Load(); n > m && !u.most.CompareAndSwap(m, n); m = u.most.Load() {
	}
	u.calls.Add(1)
}

func (u *upstream) leave() { u.inside.Add(-1) }

// TestLocalEscalationToACeilingWaitsForPolicyd: the primary geo-a is
// forced OPEN and its chain escalates on an open circuit to geo-b, which
// has a ceiling of 1, held by an attempt in progress when policyd stops
// (SIGSTOP). A call to geo-a asks Admit, is left unanswered, and the local
// chain moves it to geo-b: there it waits for policyd like any call to a
// target with a ceiling, and ends flow:unavailable without an attempt,
// instead of going to geo-b without a lease (which it did before the
// fix).
func TestLocalEscalationToACeilingWaitsForPolicyd(t *testing.T) {
	p := startPolicydProcess(t)
	ctx := context.Background()
	attempts, one, noTrip := uint32(3), uint32(1), uint32(10000)
	for _, req := range []*pb.SetPolicyRequest{
		{Tenant: "acme", Target: "geo-a", Policy: &pb.Policy{MaxAttempts: &attempts,
			Fallback: &pb.FallbackSettings{Targets: []string{"geo-b"}, OnCircuitOpen: true}}},
		{Tenant: "acme", Target: "geo-b", Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: &one},
			Breaker: &pb.BreakerSettings{ConsecutiveFailures: &noTrip}}},
	} {
		if _, err := p.admin.SetPolicy(ctx, req); err != nil {
			t.Fatalf("SetPolicy(%s): %v", req.GetTarget(), err)
		}
	}
	if _, err := p.admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{
		Key: &pb.BreakerKey{Tenant: "acme", Target: "geo-a"}, State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
		t.Fatal(err)
	}
	var waits waitsOnly
	const attemptTimeout = time.Second
	c, err := policyclient.New(p.conn, policyclient.Config{Tenant: "acme", DecisionTimeout: 50 * time.Millisecond,
		AttemptTimeout: attemptTimeout, RetryUnreachableAfter: 100 * time.Millisecond, Sleep: waits.Sleep,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.Ready(rctx); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	var up upstream
	release, inside, held := make(chan struct{}), make(chan struct{}), make(chan policyclient.Result, 1)
	go func() {
		res, _ := c.Do(ctx, policyclient.Call{Target: "geo-b", SubmissionID: "held", Idempotent: true},
			func(context.Context, policyclient.Attempt) error {
				up.enter()
				close(inside)
				<-release
				up.leave()
				return nil
			})
		held <- res
	}()
	<-inside
	p.signal(t, syscall.SIGSTOP)
	var targets []string
	res, _ := c.Do(ctx, policyclient.Call{Target: "geo-a", SubmissionID: "moved", Idempotent: true,
		Deadline: time.Now().Add(attemptTimeout + 600*time.Millisecond)},
		func(_ context.Context, a policyclient.Attempt) error {
			targets = append(targets, a.Target)
			up.enter()
			up.leave()
			return nil
		})
	p.signal(t, syscall.SIGCONT)
	close(release)
	if r := <-held; !r.OK() {
		t.Errorf("the call holding geo-b's lease: %+v; want success", r)
	}
	if res.Disposition != policyclient.DeadLetter || res.Reason != "flow:unavailable" || res.Attempts != 0 {
		t.Errorf("the call moved to geo-b while policyd was silent: %v (%q) after %d attempts on %v; want dead_letter (flow:unavailable) after 0",
			res.Disposition, res.Reason, res.Attempts, targets)
	}
	if m := up.most.Load(); m > 1 {
		t.Errorf("geo-b saw %d requests at once; its ceiling is 1", m)
	}
}
