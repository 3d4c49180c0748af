package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// buildPolicyd compiles the daemon into dir and returns the binary's path.
// It must run inside the module (go run ./cmd/policybench from its root).
func buildPolicyd(dir string) (string, error) {
	bin := dir + "/policyd"
	out, err := exec.Command("go", "build", "-o", bin, "github.com/policyd/policyd/cmd/policyd").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build policyd: %v\n%s", err, out)
	}
	return bin, nil
}

// policydBinary returns path when set, else builds one into dir.
func policydBinary(path, dir string) (string, error) {
	if path != "" {
		return path, nil
	}
	return buildPolicyd(dir)
}

// spawned is a policyd started on a state file in a temporary directory of
// its own, with an admin connection that has seen it answer.
type spawned struct {
	*daemon
	dir  string
	conn *grpc.ClientConn
}

// spawn makes a temporary directory named for the command, starts policyd
// in it (path, or one built from this module when path is empty) with
// extra flags, dials it with its admin token and waits until it answers.
// close stops the daemon and removes the directory.
func spawn(ctx context.Context, name, path string, extra ...string) (*spawned, error) {
	dir, err := os.MkdirTemp("", "policybench-"+name)
	if err != nil {
		return nil, err
	}
	s := &spawned{dir: dir}
	bin, err := policydBinary(path, dir)
	if err == nil {
		s.daemon, err = startDaemon(bin, dir+"/policyd.db", extra...)
	}
	var tok string
	if err == nil {
		tok, err = s.token()
	}
	if err == nil {
		s.conn, err = dial(s.addr, tok)
	}
	if err == nil {
		if err = waitReady(ctx, pb.NewRetryPolicyServiceClient(s.conn)); err != nil {
			err = fmt.Errorf("policyd not ready: %w", err)
		}
	}
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// close ends what spawn started, whatever part of it did start.
func (s *spawned) close() {
	if s.conn != nil {
		s.conn.Close()
	}
	if s.daemon != nil {
		_ = s.stop()
	}
	os.RemoveAll(s.dir)
}

// daemon is a policyd process started by policybench on loopback, its
// metrics endpoint on another loopback port.
type daemon struct {
	cmd     *exec.Cmd
	db      string
	addr    string
	metrics string // http://host:port/metrics
	log     *daemonLog
	exited  chan struct{}
	waitErr error
}

// daemonLog keeps the daemon's JSON log lines (the last 200) and tells
// startDaemon when it is serving.
type daemonLog struct {
	mu     sync.Mutex
	lines  []string
	counts map[string]int // by msg
	// failures are the distinct causes of "store failure" lines (the
	// first few), by how often each came.
	failures map[string]int
	slow     slowRequests // since the last takeSlow
	serving  chan string
	metrics  chan string
}

func newDaemonLog() *daemonLog {
	return &daemonLog{counts: map[string]int{}, failures: map[string]int{}, serving: make(chan string, 1), metrics: make(chan string, 1)}
}

func (l *daemonLog) consume(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var rec struct {
			Msg         string `json:"msg"`
			Listen      string `json:"listen"`
			Op          string `json:"op"`
			Err         string `json:"err"`
			Count       int    `json:"count"`
			Slowest     string `json:"slowest"`
			SlowestCall string `json:"slowest_call"`
		}
		_ = json.Unmarshal([]byte(line), &rec)
		l.mu.Lock()
		l.lines = append(l.lines, line)
		if len(l.lines) > 200 {
			l.lines = l.lines[len(l.lines)-200:]
		}
		l.counts[rec.Msg]++
		if rec.Msg == "slow requests" {
			slowest, _ := time.ParseDuration(rec.Slowest)
			l.slow.merge(slowRequests{Count: rec.Count, Slowest: slowest, What: rec.SlowestCall})
		}
		if rec.Msg == "store failure" {
			k := rec.Op + ": " + rec.Err
			if _, ok := l.failures[k]; ok || len(l.failures) < 20 {
				l.failures[k]++
			}
		}
		l.mu.Unlock()
		switch rec.Msg {
		case "policyd serving":
			select {
			case l.serving <- rec.Listen:
			default:
			}
		case "metrics serving":
			select {
			case l.metrics <- rec.Listen:
			default:
			}
		}
	}
}

// count returns how many lines had the message msg.
func (l *daemonLog) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[msg]
}

// slowRequests sums the daemon's "slow requests" lines (--slow-request):
// the calls its handlers took longer than the bound to answer.
type slowRequests struct {
	Count   int
	Slowest time.Duration
	What    string // the slowest call, as the daemon described it
}

// merge adds o's calls to s.
func (s *slowRequests) merge(o slowRequests) {
	s.Count += o.Count
	if o.Slowest > s.Slowest {
		s.Slowest, s.What = o.Slowest, o.What
	}
}

// takeSlow returns the slow requests logged since the last call, and
// starts counting again.
func (l *daemonLog) takeSlow() slowRequests {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.slow
	l.slow = slowRequests{}
	return s
}

// storeFailures returns the distinct causes of the daemon's INTERNAL
// answers ("store failure" lines) with their counts.
func (l *daemonLog) storeFailures() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.failures)
}

func (l *daemonLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	from := max(len(l.lines)-n, 0)
	return strings.Join(l.lines[from:], "\n")
}

// servesFlag reports whether bin's `serve --help` lists flag: a policyd
// built before the flag is still run, without it.
func servesFlag(bin, flag string) bool {
	out, _ := exec.Command(bin, "serve", "--help").CombinedOutput()
	return bytes.Contains(out, []byte(flag+" "))
}

// startDaemon starts bin serving db on a free loopback port, with metrics
// on another, and waits until it says it is serving. extra flags are
// added to `policyd serve`.
func startDaemon(bin, db string, extra ...string) (*daemon, error) {
	return startDaemonEnv(bin, db, nil, extra...)
}

// startDaemonEnv is startDaemon with env (NAME=value) added to this
// process's environment for the daemon.
func startDaemonEnv(bin, db string, env []string, extra ...string) (*daemon, error) {
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--db", db, "--log-level", "info"}, extra...)
	cmd := exec.Command(bin, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = io.Discard
	d := &daemon{cmd: cmd, db: db, exited: make(chan struct{}),
		log: newDaemonLog()}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	logDone := make(chan struct{})
	go func() { d.log.consume(stderr); close(logDone) }()
	go func() { <-logDone; d.waitErr = cmd.Wait(); close(d.exited) }()
	timeout := time.After(30 * time.Second)
	for d.addr == "" || d.metrics == "" {
		select {
		case a := <-d.log.serving:
			d.addr = a
		case m := <-d.log.metrics:
			d.metrics = "http://" + m + "/metrics"
		case <-d.exited:
			return nil, fmt.Errorf("policyd exited before serving (%v):\n%s", d.waitErr, d.log.tail(20))
		case <-timeout:
			d.kill()
			return nil, fmt.Errorf("policyd did not serve within 30s:\n%s", d.log.tail(20))
		}
	}
	return d, nil
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// token reads the admin token the daemon created next to its file.
func (d *daemon) token() (string, error) { return readToken(d.db + ".admin-token") }

// kill sends SIGKILL and waits for the process to be gone.
func (d *daemon) kill() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
}

// stop asks the daemon to drain (SIGTERM) and waits up to 15s, then kills.
func (d *daemon) stop() error {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		return d.waitErr
	case <-time.After(15 * time.Second):
		d.kill()
		return errors.New("policyd did not stop within 15s of SIGTERM; killed")
	}
}

// readToken reads a token file's first line.
func readToken(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok, _, _ := strings.Cut(strings.TrimSpace(string(raw)), "\n")
	if tok = strings.TrimSpace(tok); tok == "" {
		return "", fmt.Errorf("%s holds no token", path)
	}
	return tok, nil
}

// dial opens one plaintext loopback connection; token, when set, is sent
// as a bearer token with every call. addr may list several replicas,
// comma-separated: the connection then spreads calls over them (gRPC
// round_robin) and leaves one that stops answering. extra options are
// added to the defaults.
func dial(addr, token string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, extra...)
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(policyclient.BearerToken(token)))
	}
	addrs := strings.Split(addr, ",")
	if len(addrs) == 1 {
		return grpc.NewClient(addr, opts...)
	}
	r := manual.NewBuilderWithScheme("policybench")
	var st resolver.State
	for _, a := range addrs {
		st.Addresses = append(st.Addresses, resolver.Address{Addr: strings.TrimSpace(a)})
	}
	r.InitialState(st)
	// The clients' own replica configuration (policyclient.ServiceConfig):
	// round_robin over the SERVING replicas, and a decision that failed
	// with UNAVAILABLE sent again to the next one.
	opts = append(opts, grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(policyclient.ServiceConfig))
	return grpc.NewClient(r.Scheme()+":///replicas", opts...)
}

// runCheck runs `policyd check --db db` and returns its output.
func runCheck(ctx context.Context, bin, db string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "check", "--db", db).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
