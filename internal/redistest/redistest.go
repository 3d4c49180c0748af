// Package redistest starts real Redis servers for tests: a standalone
// server with AOF fsync'd on every write, and a three-master Redis Cluster,
// each on free loopback ports in the test's temporary directory, stopped
// when the test ends. It needs redis-server and redis-cli on PATH
// (scripts/test installs Debian's redis-server when they are missing); a
// test calling it without them fails, naming the missing program. There is
// no in-memory imitation of Redis here: what the tests exercise is the
// server policyd runs against.
package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long a server may take to answer PING, and a
// cluster to report cluster_state:ok.
const startTimeout = 20 * time.Second

// Server is one redis-server process the test started.
type Server struct {
	Addr string // host:port on 127.0.0.1
	Dir  string // its working directory: AOF and cluster files
	cmd  *exec.Cmd
	// exited is closed when the process has exited.
	exited chan struct{}
	port   int
	extra  []string
	owner  testing.TB // the test whose end stops the server
}

// Standalone starts a redis-server with appendonly yes and appendfsync
// always, no RDB snapshots, on a free loopback port in a new temporary
// directory, waits until it answers PING and stops it when t ends.
func Standalone(t testing.TB) *Server {
	t.Helper()
	return start(t, t.TempDir())
}

// Replica starts a standalone server (as Standalone) replicating primary,
// and waits until its link to the primary is up.
func Replica(t testing.TB, primary *Server) *Server {
	t.Helper()
	host, port, _ := net.SplitHostPort(primary.Addr)
	s := start(t, t.TempDir(), "--replicaof", host, port)
	waitFor(t, s, "master_link_status:up", func(c *conn) bool {
		info, err := c.do("INFO", "replication")
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	return s
}

// Pause stops the server (SIGSTOP): connections stay open and nothing is
// answered, until Resume (SIGCONT). The test's cleanup resumes it.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP redis-server: %v", err)
	}
	t.Cleanup(func() { _ = s.cmd.Process.Signal(syscall.SIGCONT) })
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT redis-server: %v", err)
	}
}

// Kill ends the server at once (SIGKILL) and waits for it to exit.
func (s *Server) Kill() {
	_ = s.cmd.Process.Kill()
	<-s.exited
}

// Cluster starts three redis-server processes with cluster mode on, joins
// them into a Redis Cluster of three masters without replicas (redis-cli
// --cluster create), waits until every node reports cluster_state:ok and
// stops them when t ends. It returns the nodes' addresses.
func Cluster(t testing.TB) []string {
	t.Helper()
	var addrs []string
	for _, s := range ClusterNodes(t) {
		addrs = append(addrs, s.Addr)
	}
	return addrs
}

// ClusterNodes is Cluster, returning the nodes' servers.
func ClusterNodes(t testing.TB) []*Server {
	t.Helper()
	var nodes []*Server
	var addrs []string
	for range 3 {
		s := start(t, t.TempDir(), "--cluster-enabled", "yes", "--cluster-node-timeout", "5000")
		nodes = append(nodes, s)
		addrs = append(addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(need(t, "redis-cli"), args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	clusterOK(t, nodes)
	return nodes
}

// clusterOK waits until every node reports cluster_state:ok.
func clusterOK(t testing.TB, nodes []*Server) {
	t.Helper()
	for _, s := range nodes {
		waitFor(t, s, "CLUSTER INFO cluster_state:ok", func(c *conn) bool {
			info, err := c.do("CLUSTER", "INFO")
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
	}
}

// Restart kills the server (SIGKILL, as a crash would) and starts it again
// on the same port and directory, so it loads what its append-only file
// holds; it waits until it answers PING. The server still stops when the
// test that started it ends; t (the calling test) only reports failures.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	n := launch(t, s.owner, s.port, s.Dir, s.extra...)
	s.cmd, s.exited = n.cmd, n.exited
}

// RestartCluster restarts every node of a cluster (Restart) and waits
// until each reports cluster_state:ok again.
func RestartCluster(t testing.TB, nodes []*Server) {
	t.Helper()
	for _, s := range nodes {
		s.Kill()
	}
	for _, s := range nodes {
		n := launch(t, s.owner, s.port, s.Dir, s.extra...)
		s.cmd, s.exited = n.cmd, n.exited
	}
	clusterOK(t, nodes)
}

// start runs redis-server in dir with the durable settings and extra
// arguments, on a free port, and waits for PING.
func start(t testing.TB, dir string, extra ...string) *Server {
	t.Helper()
	return startOn(t, freePort(t), dir, extra...)
}

// StandaloneOn is Standalone on a port the test chose (FreePort), for a
// test that starts its Redis after what connects to it.
func StandaloneOn(t testing.TB, port int) *Server {
	t.Helper()
	return startOn(t, port, t.TempDir())
}

// FreePort returns a loopback TCP port nobody listens on now.
func FreePort(t testing.TB) int { return freePort(t) }

func startOn(t testing.TB, port int, dir string, extra ...string) *Server {
	t.Helper()
	return launch(t, t, port, dir, extra...)
}

// launch starts redis-server as startOn does, reporting failures to t and
// stopping it when owner ends.
func launch(t, owner testing.TB, port int, dir string, extra ...string) *Server {
	t.Helper()
	bin := need(t, "redis-server")
	args := []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning",
		"--repl-diskless-sync-delay", "0", // a Replica syncs at once, not after 5 s
	}
	args = append(args, extra...)
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, port: port, extra: extra, owner: owner}
	logf, err := os.OpenFile(filepath.Join(dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("redis log: %v", err)
	}
	defer logf.Close()
	s.cmd = exec.Command(bin, args...)
	s.cmd.Dir = dir
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	exited := make(chan struct{})
	s.exited = exited
	go func() { _ = s.cmd.Wait(); close(exited) }()
	owner.Cleanup(s.Kill)
	waitFor(t, s, "PING", func(c *conn) bool {
		select {
		case <-exited:
			t.Fatalf("redis-server on %s exited at start:\n%s", s.Addr, s.Log())
		default:
		}
		r, err := c.do("PING")
		return err == nil && r == "PONG"
	})
	return s
}

// need returns the path of program or fails t.
func need(t testing.TB, program string) string {
	t.Helper()
	p, err := exec.LookPath(program)
	if err != nil {
		t.Fatalf("%s not found on PATH: scripts/test installs Debian's redis-server", program)
	}
	return p
}

// freePort returns a loopback TCP port nobody listens on now. Another
// process may take it before redis-server binds it; then start fails
// loudly, it does not hang.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on loopback: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitFor polls ready over fresh connections to s every pollEvery until
// it holds, failing t after startTimeout with the last dial's error and
// the server's log.
func waitFor(t testing.TB, s *Server, what string, ready func(*conn) bool) {
	t.Helper()
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	var dialErr error
	for {
		c, err := dial(s.Addr)
		if dialErr = err; err == nil {
			ok := ready(c)
			c.Close()
			if ok {
				return
			}
		}
		select {
		case <-deadline.C:
			t.Fatalf("redis on %s: no %s within %v (last dial: %v); its log:\n%s", s.Addr, what, startTimeout, dialErr, s.Log())
		case <-tick.C:
		}
	}
}

// pollEvery is the interval of waitFor's polls.
const pollEvery = 5 * time.Millisecond

// conn is a minimal RESP connection for the helper's own checks, so the
// helper does not depend on the client under test.
type conn struct {
	c net.Conn
	r *bufio.Reader
}

func dial(addr string) (*conn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(time.Second))
	return &conn{c: c, r: bufio.NewReader(c)}, nil
}

func (c *conn) Close() { _ = c.c.Close() }

// do sends one command and returns a simple, error or bulk string reply.
func (c *conn) do(args ...string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	switch {
	case line == "":
		return "", fmt.Errorf("empty reply")
	case line[0] == '+':
		return line[1:], nil
	case line[0] == '-':
		return "", fmt.Errorf("%s", line[1:])
	case line[0] == '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("bulk reply %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

// Log returns what the server wrote to its log so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	return string(b)
}
