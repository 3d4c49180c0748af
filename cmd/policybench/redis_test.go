package main

import (
	"bytes"
	"context"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
)

func TestParseCommandStats(t *testing.T) {
	info := "# Commandstats\r\n" +
		"cmdstat_fcall:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=1\r\n" +
		"cmdstat_info:calls=3,usec=90,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_xread|group:calls=x,usec=1\r\n" +
		"not a stat line\r\n"
	got := parseCommandStats(info)
	want := map[string]uint64{"fcall": 12, "info": 3}
	if !maps.Equal(got, want) {
		t.Errorf("parseCommandStats = %v, want %v", got, want)
	}
}

func TestFailureClass(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`outcomes: tenant "bench-t3": redisstore: policyd_outcomes: read tcp 127.0.0.1:33070->127.0.0.1:46605: i/o timeout`,
			`outcomes: tenant "…": redisstore: policyd_outcomes: read tcp ADDR->ADDR: i/o timeout`},
		{"decision: redisstore: commit: EOF", "decision: redisstore: commit: EOF"},
	} {
		if got := failureClass(tc.in); got != tc.want {
			t.Errorf("failureClass(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestRedisMissingReadsBreakerRecords: kill-redis's check reads an OPEN
// breaker as the store writes it (its record, redisstore/doc.go), so a
// breaker forced OPEN is found and one left CLOSED is named missing.
func TestRedisMissingReadsBreakerRecords(t *testing.T) {
	srv := redistest.Standalone(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := s.ForceBreaker(policy.BreakerKey{Tenant: "acme", Target: "open"}, policy.BreakerOpen); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ForceBreaker(policy.BreakerKey{Tenant: "acme", Target: "closed"}, policy.BreakerClosed); err != nil {
		t.Fatal(err)
	}
	m := &crashModel{open: map[string]bool{"acme\x00open": true, "acme\x00closed": true, "acme\x00never": true}}
	missing, err := redisMissing(context.Background(), &redisProc{client: c}, m)
	if err != nil {
		t.Fatalf("redisMissing: %v", err)
	}
	slices.Sort(missing)
	want := []string{"breaker acme/closed OPEN: CLOSED in Redis", "breaker acme/never OPEN: not in Redis"}
	if !slices.Equal(missing, want) {
		t.Errorf("redisMissing = %q, want %q", missing, want)
	}
}

// TestCPUTimeCountsReapedChildren: a child's CPU is counted once the
// process has waited for it, as redis-server waits for its AOF rewrite.
func TestCPUTimeCountsReapedChildren(t *testing.T) {
	self0, reaped0, err := statTimes(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// A child that burns CPU for a few hundred ms, then exits.
	child := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done")
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	spent := child.ProcessState.UserTime() + child.ProcessState.SystemTime()
	_, reaped1, err := statTimes(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := reaped1 - reaped0; got < spent-20*time.Millisecond {
		t.Errorf("children's CPU went up by %v after a child that spent %v", got, spent)
	}
	all, err := cpuTimeWithChildren(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if all < self0+reaped1 {
		t.Errorf("cpuTimeWithChildren = %v, below this process's %v and its reaped children's %v", all, self0, reaped1)
	}
}

// TestHostCPUStolen reads the machine's CPU times and takes the stolen
// share of a window from two readings.
func TestHostCPUStolen(t *testing.T) {
	h, err := readHostCPU()
	if err != nil || h.total == 0 || h.steal > h.total {
		t.Fatalf("readHostCPU = %+v, %v; want the machine's ticks, steal among them", h, err)
	}
	if got := h.stolen(h); got != -1 {
		t.Errorf("stolen over an empty window = %v, want -1 (unknown)", got)
	}
	later := hostCPU{total: h.total + 200, steal: h.steal + 50}
	if got := later.stolen(h); got != 0.25 {
		t.Errorf("stolen of 50 ticks in 200 = %v, want 0.25", got)
	}
}

// TestReplicaSweepSmoke runs replicas-sweep end to end in small windows: a
// policyd built from this module, one bbolt daemon and three replicas on
// a redis-server the command starts, each phase measured on both in turn
// in two rounds, the second in the other order. It checks the table and
// the goals are printed for every phase and level, with requests in every
// window; it times nothing.
func TestReplicaSweepSmoke(t *testing.T) {
	cfg := replicaSweepConfig{StoreTimeout: 50 * time.Millisecond, Concurrency: []int{2}, Duration: 300 * time.Millisecond,
		Warmup: 50 * time.Millisecond, Rounds: 2, Transitions: 3, Seed: 1, Runtime: replicaRuntime{Procs: 1, Godebug: sysmonAwake}}
	var out, log bytes.Buffer
	if err := runReplicaSweep(context.Background(), cfg, &out, &log); err != nil {
		t.Fatalf("replicas-sweep: %v\nlog:\n%s", err, log.String())
	}
	text := out.String()
	if strings.Contains(text, "(its latency monitor): not read") {
		t.Errorf("Redis's latency events were not read:\n%s", text)
	}
	for _, ph := range sweepPhaseOrder {
		row := regexp.MustCompile(`(?m)^ +` + ph + ` +2 +(\d+) .*x +[\d.]+x`)
		m := row.FindStringSubmatch(text)
		if m == nil || m[1] == "0" {
			t.Errorf("no row with requests for %s at 2 callers in:\n%s", ph, text)
		}
		var order []string
		for _, m := range regexp.MustCompile(`(?m)^  (\(i+\)), 2 callers: `+ph+`$`).FindAllStringSubmatch(log.String(), -1) {
			order = append(order, m[1])
		}
		if want := []string{"(i)", "(ii)", "(ii)", "(i)"}; !slices.Equal(order, want) {
			t.Errorf("%s measured in the order %v, want %v:\n%s", ph, order, want, log.String())
		}
	}
	for _, want := range []string{"goals:", "Redis round trips per request, nextdelay at 2 callers", "stolen by the hypervisor", "audit records dropped in each phase's windows", "report 2 0 / 0;", "times a replica went into degraded mode in each phase's windows", "each round's req/s (ii)÷(i)", "AOF rewrites", "transition propagation", "GODEBUG schedtrace=2147483647 each", "(its latency monitor): "} {
		if !strings.Contains(text, want) {
			t.Errorf("the output lacks %q:\n%s", want, text)
		}
	}
}
