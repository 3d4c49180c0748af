package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// The flow command checks the fleet-wide ceilings of issue 15 from outside:
// a fake upstream on loopback counts the requests it is sent at once and
// when each arrives, while worker processes (this binary re-executed as
// flow-worker) send them through the Go client's Transport, which asks
// policyd for a lease or a rate slot before every attempt.

const (
	// flowTenant is the tenant of every worker of the flow command.
	flowTenant = "flow-bench"
	// flowConcTarget and flowRateTarget are the targets with a concurrency
	// ceiling and with a rate ceiling.
	flowConcTarget = "flow-conc"
	flowRateTarget = "flow-rate"
)

// allFlowPhases are the phases of the flow command, in the order they run.
var allFlowPhases = []string{"concurrency", "rate"}

// flowConfig is what `policybench flow` is told by its flags.
type flowConfig struct {
	Policyd         string
	Redis           bool
	StoreTimeout    time.Duration
	Phases          []string
	Processes       int
	Workers         int
	Duration        time.Duration
	Steady          time.Duration
	MaxInFlight     int
	MaxRate         float64
	Burst           int
	Hold            time.Duration
	BaseDelay       time.Duration
	DecisionTimeout time.Duration
	Tolerance       float64
}

func flowCmd() *cobra.Command {
	var cfg flowConfig
	cmd := &cobra.Command{
		Use:   "flow",
		Short: "Fleet-wide ceilings seen by a fake upstream: worker processes through the Go client",
		Long: `flow builds policyd and runs it on a temporary bbolt file (--redis: a
redis-server and three policyd replicas on it, worker process i calling
replica i mod 3), starts a fake HTTP upstream on loopback that counts the
requests it holds at once (each for --hold) and when each arrives, and runs
each phase with --processes worker processes (policybench flow-worker) of
--workers goroutines, every request sent through the Go client's Transport
for tenant flow-bench:

  concurrency  target flow-conc, policy flow.max_in_flight --max-in-flight
               (backoff base --base-delay: the wait a full ceiling asks for).
               Goal: the upstream never holds more than the ceiling.
  rate         target flow-rate, policy flow.max_rate --max-rate, burst
               --burst.
               Goal: the upstream's request rate from --steady to the end of
               the phase is within --tolerance of the ceiling.

It prints per phase the upstream's count, maximum and mean of requests held
at once, its rate over the steady part and second by second, and what the
workers saw (calls, Admit answers by reason, Admit RPCs that failed, which
the client answers locally, without a lease). It exits non-zero when a goal
is missed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runFlow(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Policyd, "policyd", "", "policyd binary (default: go build ./cmd/policyd)")
	f.BoolVar(&cfg.Redis, "redis", false, "run three policyd replicas on a redis-server (from PATH) instead of one daemon on bbolt")
	f.DurationVar(&cfg.StoreTimeout, "store-timeout", 50*time.Millisecond, "with --redis: the replicas' --store-timeout")
	f.StringSliceVar(&cfg.Phases, "phases", allFlowPhases, "phases to run: "+strings.Join(allFlowPhases, ","))
	f.IntVar(&cfg.Processes, "processes", 3, "worker processes")
	f.IntVar(&cfg.Workers, "workers", 16, "goroutines per worker process, each sending one request at a time")
	f.DurationVar(&cfg.Duration, "duration", 10*time.Second, "length of each phase")
	f.DurationVar(&cfg.Steady, "steady", 2*time.Second, "the rate is measured from this far into the phase to its end")
	f.IntVar(&cfg.MaxInFlight, "max-in-flight", 8, "concurrency phase: the policy's flow.max_in_flight")
	f.Float64Var(&cfg.MaxRate, "max-rate", 200, "rate phase: the policy's flow.max_rate, requests per second")
	f.IntVar(&cfg.Burst, "burst", 1, "rate phase: the policy's flow.burst")
	f.DurationVar(&cfg.Hold, "hold", 20*time.Millisecond, "how long the upstream holds each request before answering 200")
	f.DurationVar(&cfg.BaseDelay, "base-delay", 10*time.Millisecond, "concurrency phase: the policy's backoff.base_delay")
	f.DurationVar(&cfg.DecisionTimeout, "decision-timeout", 0, "the workers' Config.DecisionTimeout (0: the Go client's default, 250ms)")
	f.Float64Var(&cfg.Tolerance, "tolerance", 0.05, "rate phase: the largest relative distance of the observed rate to --max-rate")
	return cmd
}

// flowPhase is one phase's policy and goal.
type flowPhase struct {
	name   string
	target string
	policy *pb.Policy
}

func (cfg *flowConfig) phases() []flowPhase {
	var out []flowPhase
	for _, name := range cfg.Phases {
		switch name {
		case "concurrency":
			ceiling := uint32(cfg.MaxInFlight)
			out = append(out, flowPhase{name: name, target: flowConcTarget, policy: &pb.Policy{
				Flow:    &pb.FlowSettings{MaxInFlight: &ceiling},
				Backoff: &pb.BackoffSettings{BaseDelay: durationpb.New(cfg.BaseDelay)},
			}})
		case "rate":
			rate, burst := cfg.MaxRate, uint32(cfg.Burst)
			out = append(out, flowPhase{name: name, target: flowRateTarget, policy: &pb.Policy{
				Flow: &pb.FlowSettings{MaxRate: &rate, Burst: &burst},
			}})
		}
	}
	return out
}

func (cfg *flowConfig) check() error {
	for _, p := range cfg.Phases {
		if !slices.Contains(allFlowPhases, p) {
			return fmt.Errorf("--phases: unknown phase %q (want some of %s)", p, strings.Join(allFlowPhases, ","))
		}
	}
	switch {
	case cfg.Processes < 1 || cfg.Workers < 1:
		return errors.New("--processes and --workers must be >= 1")
	case cfg.Duration <= 0 || cfg.Steady < 0 || cfg.Steady >= cfg.Duration:
		return errors.New("--duration must be > 0 and --steady in [0, --duration)")
	case cfg.MaxInFlight < 1 || cfg.Burst < 1:
		return errors.New("--max-in-flight and --burst must be >= 1")
	case !(cfg.MaxRate > 0) || math.IsInf(cfg.MaxRate, 0):
		return errors.New("--max-rate must be > 0 and finite")
	case cfg.Hold < 0 || cfg.BaseDelay < 0 || cfg.DecisionTimeout < 0 || !(cfg.Tolerance > 0):
		return errors.New("--hold, --base-delay and --decision-timeout must be >= 0, --tolerance > 0")
	}
	return nil
}

func runFlow(ctx context.Context, cfg flowConfig, out io.Writer) error {
	if err := cfg.check(); err != nil {
		return err
	}
	phases := cfg.phases()
	// Every phase is bounded; so is the whole run.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(len(phases))*(cfg.Duration+time.Minute)+2*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "policybench-flow")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := policydBinary(cfg.Policyd, dir)
	if err != nil {
		return err
	}

	// addrs[i] is where worker process i sends its decisions; admin is
	// every daemon's address, token the admin token.
	var addrs []string
	var admin, token, engine string
	if cfg.Redis {
		fl, err := startFleet(ctx, dir, bin, 3, cfg.StoreTimeout, defaultReplicaRuntime(3))
		if err != nil {
			return err
		}
		defer fl.stop()
		for _, d := range fl.reps {
			addrs = append(addrs, d.addr)
		}
		admin, token = fl.addrs(), fl.token
		engine = fmt.Sprintf("redis-server %s (pid %d), three policyd replicas %s (pids %v)", fl.redis.addr(), fl.redis.pid(), admin, fl.pids())
	} else {
		d, err := startDaemon(bin, filepath.Join(dir, "policyd.db"))
		if err != nil {
			return err
		}
		defer func() { _ = d.stop() }()
		if token, err = d.token(); err != nil {
			return err
		}
		addrs, admin = []string{d.addr}, d.addr
		engine = fmt.Sprintf("one policyd on bbolt %s (pid %d)", d.addr, d.pid())
	}
	aconn, err := dial(admin, token)
	if err != nil {
		return err
	}
	defer aconn.Close()
	ac := pb.NewAdminServiceClient(aconn)
	for _, ph := range phases {
		if _, err := ac.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: flowTenant, Target: ph.target, Policy: ph.policy}); err != nil {
			return fmt.Errorf("SetPolicy %s/%s: %w", flowTenant, ph.target, err)
		}
	}

	up, err := startUpstream(cfg.Hold)
	if err != nil {
		return err
	}
	defer up.close()
	fmt.Fprintf(out, "flow: %s; fake upstream %s holding each request %s; %d worker processes x %d goroutines, Go client Transport, decision timeout %s\n",
		engine, up.addr, cfg.Hold, cfg.Processes, cfg.Workers, orDefault(cfg.DecisionTimeout, "250ms (default)"))
	fmt.Fprintf(out, "machine: %d CPUs, load %s at start\n", machineInfo().NumCPU, loadAvg())

	var missed []string
	for _, ph := range phases {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		res, err := runFlowPhase(ctx, cfg, ph, addrs, up)
		if err != nil {
			return fmt.Errorf("phase %s: %w", ph.name, err)
		}
		if verdict := res.print(out, cfg, ph); verdict != "" {
			missed = append(missed, ph.name+": "+verdict)
		}
	}
	fmt.Fprintf(out, "\nload %s at the end\n", loadAvg())
	if len(missed) > 0 {
		return fmt.Errorf("goals missed: %s", strings.Join(missed, "; "))
	}
	return nil
}

func orDefault(d time.Duration, def string) string {
	if d == 0 {
		return def
	}
	return d.String()
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(raw))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// flowResult is what one phase measured: the upstream's counts and the
// workers' reports.
type flowResult struct {
	load    string // the load average when the phase began
	up      upstreamCounts
	workers []flowWorkerReport
}

// print writes the phase's figures and returns what goal it missed ("":
// none).
func (r *flowResult) print(out io.Writer, cfg flowConfig, ph flowPhase) string {
	u := &r.up
	fmt.Fprintf(out, "\n== %s (target %s, %s), load %s\n", ph.name, ph.target, policyLine(ph.policy), r.load)
	fmt.Fprintf(out, "upstream: %d requests in %s; held at once: max %d, mean %.2f\n",
		u.requests, cfg.Duration, u.maxInFlight, u.busy.Seconds()/cfg.Duration.Seconds())
	steadySecs := (cfg.Duration - cfg.Steady).Seconds()
	rate := float64(u.steady) / steadySecs
	fmt.Fprintf(out, "upstream rate: %.1f/s over %s..%s (%d requests); per second: %v\n",
		rate, cfg.Steady, cfg.Duration, u.steady, u.perSecond)
	var sum flowWorkerReport
	for _, w := range r.workers {
		sum.add(w)
	}
	fmt.Fprintf(out, "workers: %d calls (%d succeeded, %d failed: %v); %d attempts; Admit: %d RPCs, %d with a lease, refused %v, %d failed (admitted locally, no lease; codes, and RPCs cut by the phase's end: %v), %d answered degraded\n",
		sum.Calls, sum.Succeeded, sum.Calls-sum.Succeeded, sum.Failures, sum.Attempts, sum.AdmitRPCs, sum.Leases,
		sum.Refused, sum.AdmitErrors, sum.AdmitErrorCodes, sum.Degraded)
	fmt.Fprintf(out, "admitted per second (Admit answers, by the workers' clocks): %v\n", sum.AdmittedPerSecond)
	var missed string
	switch ph.name {
	case "concurrency":
		ceiling := int64(cfg.MaxInFlight)
		verdict := "met"
		if u.maxInFlight > ceiling {
			verdict = fmt.Sprintf("MISSED: %d held at once, above the ceiling %d", u.maxInFlight, ceiling)
			missed = verdict
		}
		fmt.Fprintf(out, "goal: upstream in flight <= max_in_flight %d across %d processes x %d workers: max %d: %s\n",
			ceiling, cfg.Processes, cfg.Workers, u.maxInFlight, verdict)
	case "rate":
		dev := rate/cfg.MaxRate - 1
		verdict := "met"
		if math.Abs(dev) > cfg.Tolerance {
			verdict = fmt.Sprintf("MISSED: %+.1f%% off the ceiling", 100*dev)
			missed = verdict
		}
		fmt.Fprintf(out, "goal: upstream rate within %.0f%% of max_rate %g/s: %.1f/s (%+.2f%%): %s\n",
			100*cfg.Tolerance, cfg.MaxRate, rate, 100*dev, verdict)
	}
	if u.requests == 0 && missed == "" {
		missed = "the upstream saw no request"
	}
	return missed
}

func policyLine(p *pb.Policy) string {
	f := p.GetFlow()
	var parts []string
	if f.MaxInFlight != nil {
		parts = append(parts, fmt.Sprintf("max_in_flight %d", f.GetMaxInFlight()))
	}
	if f.MaxRate != nil {
		parts = append(parts, fmt.Sprintf("max_rate %g/s burst %d", f.GetMaxRate(), f.GetBurst()))
	}
	if b := p.GetBackoff().GetBaseDelay(); b != nil {
		parts = append(parts, "base_delay "+b.AsDuration().String())
	}
	return strings.Join(parts, ", ")
}

// runFlowPhase starts the worker processes, all beginning at one instant
// (far enough ahead for them to start and connect) for cfg.Duration, and
// returns what the upstream and the workers counted.
func runFlowPhase(ctx context.Context, cfg flowConfig, ph flowPhase, addrs []string, up *upstream) (*flowResult, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	start := time.Now().Add(2 * time.Second)
	path := "/" + ph.name
	up.reset(path, start, cfg.Duration, cfg.Steady)
	type child struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		report chan flowWorkerReport
	}
	var children []*child
	defer func() {
		for _, c := range children {
			_ = c.stdin.Close() // a worker ends when its stdin closes
			_ = c.cmd.Wait()
		}
	}()
	for i := range cfg.Processes {
		cmd := exec.CommandContext(ctx, self, "flow-worker", "--addr", addrs[i%len(addrs)],
			"--url", "http://"+up.addr+path, "--target", ph.target, "--workers", strconv.Itoa(cfg.Workers),
			"--start", strconv.FormatInt(start.UnixNano(), 10), "--duration", cfg.Duration.String(),
			"--decision-timeout", cfg.DecisionTimeout.String())
		cmd.Stderr = os.Stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		c := &child{cmd: cmd, stdin: stdin, report: make(chan flowWorkerReport, 1)}
		children = append(children, c)
		go func() {
			var rep flowWorkerReport
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if err := json.Unmarshal(sc.Bytes(), &rep); err == nil {
					c.report <- rep
					break
				}
			}
			close(c.report)
			_, _ = io.Copy(io.Discard, stdout)
		}()
	}
	res := &flowResult{load: loadAvg()}
	limit := time.After(time.Until(start) + cfg.Duration + 30*time.Second)
	for i, c := range children {
		select {
		case rep, ok := <-c.report:
			if !ok {
				return nil, fmt.Errorf("worker process %d ended without a report", i)
			}
			res.workers = append(res.workers, rep)
		case <-limit:
			return nil, fmt.Errorf("worker process %d did not report within 30s of the phase's end", i)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	res.up = up.counts()
	return res, nil
}

// upstream is the fake upstream: an HTTP server on loopback that holds
// each request of the current phase's path for hold, then answers 200,
// counting requests held at once and arrivals per second of the phase.
type upstream struct {
	addr string
	srv  *http.Server
	hold time.Duration

	mu     sync.Mutex
	path   string
	start  time.Time
	length time.Duration
	steady time.Duration
	c      upstreamCounts

	inFlight atomic.Int64
}

// upstreamCounts is what the upstream counted in one phase.
type upstreamCounts struct {
	requests    int64
	steady      int64 // arrivals in [steady, length) of the phase
	maxInFlight int64
	busy        time.Duration // sum of the time requests were held
	perSecond   []int64       // arrivals in each second of the phase
	stray       int64         // requests outside the phase's path or span
}

func startUpstream(hold time.Duration) (*upstream, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &upstream{addr: lis.Addr().String(), hold: hold}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = u.srv.Serve(lis) }()
	return u, nil
}

// reset starts counting a phase at path, from start for length.
func (u *upstream) reset(path string, start time.Time, length, steady time.Duration) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.path, u.start, u.length, u.steady = path, start, length, steady
	u.c = upstreamCounts{perSecond: make([]int64, int(math.Ceil(length.Seconds())))}
}

func (u *upstream) counts() upstreamCounts {
	u.mu.Lock()
	defer u.mu.Unlock()
	c := u.c
	c.perSecond = slices.Clone(c.perSecond)
	return c
}

// ServeHTTP counts the request as held from its arrival to its answer.
func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := u.inFlight.Add(1)
	t0 := time.Now()
	u.mu.Lock()
	at := t0.Sub(u.start)
	if r.URL.Path != u.path || at < 0 || at >= u.length {
		u.c.stray++
	} else {
		u.c.requests++
		u.c.perSecond[int(at/time.Second)]++
		if at >= u.steady {
			u.c.steady++
		}
	}
	u.c.maxInFlight = max(u.c.maxInFlight, n)
	u.mu.Unlock()
	if u.hold > 0 {
		timer := time.NewTimer(u.hold)
		select {
		case <-timer.C:
		case <-r.Context().Done():
			timer.Stop()
		}
	}
	held := time.Since(t0)
	u.mu.Lock()
	u.c.busy += held
	u.mu.Unlock()
	// Counted out before the answer is written, so a client that has its
	// answer (and returns its lease) is no longer counted here.
	u.inFlight.Add(-1)
	w.WriteHeader(http.StatusOK)
}

func (u *upstream) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = u.srv.Shutdown(ctx)
}

// flowWorkerReport is what a worker process tells the flow command, as one
// JSON line on its stdout at the end.
type flowWorkerReport struct {
	Calls           int64            `json:"calls"`
	Succeeded       int64            `json:"succeeded"`
	Failures        map[string]int64 `json:"failures,omitempty"` // by the error's text
	Attempts        uint64           `json:"attempts"`
	AdmitRPCs       int64            `json:"admit_rpcs"`
	Leases          int64            `json:"leases"`
	Refused         map[string]int64 `json:"refused,omitempty"`           // Admit refusals by reason
	AdmitErrors     int64            `json:"admit_errors"`                // the client admitted these locally, without a lease
	AdmitErrorCodes map[string]int64 `json:"admit_error_codes,omitempty"` // and the calls cut by the phase's end
	Degraded        int64            `json:"degraded"`                    // Admit answers decided without the shared store
	// AdmittedPerSecond counts the attempts Admit let through in each
	// second of the phase, by the worker's clock when the answer came.
	AdmittedPerSecond []int64 `json:"admitted_per_second"`
}

func (r *flowWorkerReport) add(o flowWorkerReport) {
	r.Calls += o.Calls
	r.Succeeded += o.Succeeded
	r.Attempts += o.Attempts
	r.AdmitRPCs += o.AdmitRPCs
	r.Leases += o.Leases
	r.AdmitErrors += o.AdmitErrors
	r.Degraded += o.Degraded
	for i, n := range o.AdmittedPerSecond {
		if i >= len(r.AdmittedPerSecond) {
			r.AdmittedPerSecond = append(r.AdmittedPerSecond, 0)
		}
		r.AdmittedPerSecond[i] += n
	}
	addCounts(&r.Failures, o.Failures)
	addCounts(&r.Refused, o.Refused)
	addCounts(&r.AdmitErrorCodes, o.AdmitErrorCodes)
}

func addCounts(dst *map[string]int64, src map[string]int64) {
	for k, v := range src {
		if *dst == nil {
			*dst = map[string]int64{}
		}
		(*dst)[k] += v
	}
}

// flowWorkerConfig is what a flow-worker process is told by its flags.
type flowWorkerConfig struct {
	Addr            string
	URL             string
	Target          string
	Workers         int
	Start           int64 // Unix ns
	Duration        time.Duration
	DecisionTimeout time.Duration
}

func flowWorkerCmd() *cobra.Command {
	var cfg flowWorkerConfig
	cmd := &cobra.Command{
		Use:    "flow-worker",
		Short:  "One worker process of the flow command",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runFlowWorker(cmd.Context(), cfg, os.Stdin, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "addr", "", "policyd's address")
	f.StringVar(&cfg.URL, "url", "", "the upstream's URL")
	f.StringVar(&cfg.Target, "target", "", "the calls' target")
	f.IntVar(&cfg.Workers, "workers", 16, "goroutines")
	f.Int64Var(&cfg.Start, "start", 0, "when to begin, Unix ns")
	f.DurationVar(&cfg.Duration, "duration", 10*time.Second, "how long to send")
	f.DurationVar(&cfg.DecisionTimeout, "decision-timeout", 0, "Config.DecisionTimeout")
	return cmd
}

// runFlowWorker sends requests to cfg.URL through the Go client's
// Transport from cfg.Workers goroutines, one at a time each, from cfg.Start
// for cfg.Duration, then writes its report to out. It ends early when stdin
// closes (the flow command went away).
func runFlowWorker(ctx context.Context, cfg flowWorkerConfig, stdin io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, stdin); cancel() }()

	var rep flowWorkerReport
	var mu sync.Mutex // guards rep's maps
	count := func(m *map[string]int64, k string) {
		mu.Lock()
		addCounts(m, map[string]int64{k: 1})
		mu.Unlock()
	}
	start := time.Unix(0, cfg.Start)
	admitted := make([]atomic.Int64, int(math.Ceil(cfg.Duration.Seconds())))
	var admits, leases, admitErrs, degraded atomic.Int64
	observe := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if !strings.HasSuffix(method, "/Admit") {
			return err
		}
		admits.Add(1)
		if err != nil && errors.Is(ctx.Err(), context.Canceled) {
			count(&rep.AdmitErrorCodes, "cancelled by the phase's end")
			return err
		}
		if err != nil {
			admitErrs.Add(1)
			count(&rep.AdmitErrorCodes, status.Code(err).String())
			return err
		}
		resp := reply.(*pb.AdmitResponse)
		if resp.GetDegraded() {
			degraded.Add(1)
		}
		if at := time.Since(start); resp.GetAdmitted() && at >= 0 && at < cfg.Duration {
			admitted[int(at/time.Second)].Add(1)
		}
		switch {
		case !resp.GetAdmitted():
			count(&rep.Refused, resp.GetReason())
		case resp.GetLeaseId() != "":
			leases.Add(1)
		}
		return nil
	})
	conn, err := dial(cfg.Addr, "", observe)
	if err != nil {
		return err
	}
	defer conn.Close()
	client, err := policyclient.New(conn, policyclient.Config{Tenant: flowTenant, DecisionTimeout: cfg.DecisionTimeout,
		Logger: discardLogger})
	if err != nil {
		return err
	}
	base := &http.Transport{MaxIdleConnsPerHost: cfg.Workers}
	defer base.CloseIdleConnections()
	hc := &http.Client{Transport: &policyclient.Transport{Client: client, Base: base,
		Call: func(*http.Request) policyclient.Call { return policyclient.Call{Target: cfg.Target, Idempotent: true} }}}

	sleepCtx(ctx, time.Until(start))
	// The phase's end cancels the calls rather than giving them a deadline:
	// a call with a deadline closer than a wait plus the attempt timeout
	// ends at once instead of waiting out a full ceiling.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	time.AfterFunc(time.Until(start.Add(cfg.Duration)), stop)
	var calls, ok atomic.Int64
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for runCtx.Err() == nil {
				req, err := http.NewRequestWithContext(runCtx, http.MethodGet, cfg.URL, nil)
				if err != nil {
					count(&rep.Failures, err.Error())
					return
				}
				resp, err := hc.Do(req)
				if runCtx.Err() != nil {
					if err == nil {
						resp.Body.Close()
					}
					return // cut by the end of the phase: not counted
				}
				calls.Add(1)
				if err != nil {
					count(&rep.Failures, err.Error())
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					ok.Add(1)
				} else {
					count(&rep.Failures, resp.Status)
				}
			}
		}()
	}
	wg.Wait()
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = client.Close(cctx)
	ccancel()
	rep.Calls, rep.Succeeded, rep.Attempts = calls.Load(), ok.Load(), client.Stats().Attempts
	for i := range admitted {
		rep.AdmittedPerSecond = append(rep.AdmittedPerSecond, admitted[i].Load())
	}
	rep.AdmitRPCs, rep.Leases, rep.AdmitErrors, rep.Degraded = admits.Load(), leases.Load(), admitErrs.Load(), degraded.Load()
	mu.Lock()
	defer mu.Unlock()
	return json.NewEncoder(out).Encode(&rep)
}
