package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisProc is a redis-server process policybench started on a loopback
// port in its own directory, with appendonly yes and appendfsync always
// and no RDB snapshots: the durability the fault tests hold policyd to.
// It can be killed and started again on the same port and AOF.
type redisProc struct {
	bin    string
	port   int
	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
	client *redis.Client // for INFO and direct reads of the keys
}

// startRedis starts redis-server (from PATH) in dir on a free loopback
// port and waits until it answers PING.
func startRedis(ctx context.Context, dir string) (*redisProc, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found on PATH (Debian: apt-get install redis-server): %w", err)
	}
	port, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	r := &redisProc{bin: bin, port: port, dir: dir}
	r.client = redis.NewClient(&redis.Options{Addr: r.addr(), DialTimeout: time.Second, ReadTimeout: 2 * time.Second,
		MaxRetries: -1, PoolSize: 2})
	return r, r.start(ctx)
}

func (r *redisProc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// url is the --store value of policyd for this server.
func (r *redisProc) url() string { return "redis://" + r.addr() }

// start runs the server (again) on its port and directory, so a restart
// after a kill replays the AOF.
func (r *redisProc) start(ctx context.Context) error {
	logf, err := os.OpenFile(filepath.Join(r.dir, "redis.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	r.cmd = exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning",
		"--latency-monitor-threshold", strconv.Itoa(int(latencyThreshold/time.Millisecond)))
	r.cmd.Dir = r.dir
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	if err := r.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	r.exited = exited
	go func() { _ = r.cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := r.client.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server on %s exited at start:\n%s", r.addr(), r.log())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			r.kill()
			return fmt.Errorf("redis-server on %s: no PING within 20s: %v", r.addr(), err)
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

func (r *redisProc) pid() int { return r.cmd.Process.Pid }

// kill ends the server at once (SIGKILL) and waits for it to exit.
func (r *redisProc) kill() {
	_ = r.cmd.Process.Signal(syscall.SIGCONT) // a stopped process is killed too, but let it go
	_ = r.cmd.Process.Kill()
	<-r.exited
}

// pause stops the server (SIGSTOP); resume continues it (SIGCONT).
func (r *redisProc) pause() error  { return r.cmd.Process.Signal(syscall.SIGSTOP) }
func (r *redisProc) resume() error { return r.cmd.Process.Signal(syscall.SIGCONT) }

// close kills the server and closes the helper's client.
func (r *redisProc) close() {
	r.kill()
	_ = r.client.Close()
}

func (r *redisProc) log() string {
	b, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
	return string(b)
}

// commandStats reads INFO commandstats: calls per command.
func (r *redisProc) commandStats(ctx context.Context) (map[string]uint64, error) {
	info, err := r.client.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	return parseCommandStats(info), nil
}

// forks returns how many times the server has forked (INFO stats
// total_forks): with the policybench configuration, for AOF rewrites.
func (r *redisProc) forks(ctx context.Context) (uint64, error) {
	info, err := r.client.Info(ctx, "stats").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_forks:"); ok {
			return strconv.ParseUint(v, 10, 64)
		}
	}
	return 0, errors.New("INFO stats has no total_forks")
}

// latencyThreshold is the server's latency monitor threshold: events
// (an fsync of the AOF, a command, a fork) that took this long or longer
// are recorded (LATENCY LATEST).
const latencyThreshold = 10 * time.Millisecond

// latencyEvent is one kind of event the server's latency monitor recorded
// since its last reset: the longest and how many times.
type latencyEvent struct {
	Name  string
	Max   time.Duration
	Count int
}

// resetLatency forgets the latency events recorded so far.
func (r *redisProc) resetLatency(ctx context.Context) error {
	return r.client.Do(ctx, "LATENCY", "RESET").Err()
}

// latencyEvents returns the events of latencyThreshold or more recorded
// since the last reset, by name (LATENCY HISTORY of each LATENCY LATEST).
func (r *redisProc) latencyEvents(ctx context.Context) ([]latencyEvent, error) {
	latest, err := r.client.Do(ctx, "LATENCY", "LATEST").Slice()
	if err != nil {
		return nil, err
	}
	var out []latencyEvent
	for _, e := range latest {
		row, ok := e.([]any)
		if !ok || len(row) < 4 {
			return nil, fmt.Errorf("LATENCY LATEST: unexpected entry %v", e)
		}
		name, _ := row[0].(string)
		hist, err := r.client.Do(ctx, "LATENCY", "HISTORY", name).Slice()
		if err != nil {
			return nil, err
		}
		ev := latencyEvent{Name: name, Count: len(hist)}
		for _, h := range hist {
			if pair, ok := h.([]any); ok && len(pair) == 2 {
				if ms, ok := pair[1].(int64); ok {
					ev.Max = max(ev.Max, time.Duration(ms)*time.Millisecond)
				}
			}
		}
		out = append(out, ev)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Max > out[j].Max })
	return out, nil
}

// fmtLatencyEvents is events as "name: max M ms, N times; ...", or "none".
func fmtLatencyEvents(events []latencyEvent) string {
	if len(events) == 0 {
		return "none"
	}
	parts := make([]string, len(events))
	for i, e := range events {
		parts[i] = fmt.Sprintf("%s: max %d ms, %d times", e.Name, e.Max.Milliseconds(), e.Count)
	}
	return strings.Join(parts, "; ")
}

// parseCommandStats reads the calls of each command from the text of INFO
// commandstats: lines "cmdstat_NAME:calls=N,usec=...".
func parseCommandStats(info string) map[string]uint64 {
	out := map[string]uint64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		name, ok = strings.CutPrefix(name, "cmdstat_")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				if n, err := strconv.ParseUint(v, 10, 64); err == nil {
					out[name] = n
				}
			}
		}
	}
	return out
}

// freeLoopbackPort returns a loopback TCP port nobody listens on now.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
