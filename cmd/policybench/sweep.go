package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// sweepConfig is what the sweep is told by its flags.
type sweepConfig struct {
	Addr        string
	TokenFile   string
	PID         int
	Metrics     string
	Concurrency []int
	Duration    time.Duration
	Warmup      time.Duration
	Phases      []string
	JSON        bool
	Seed        uint64
	Label       string // what the daemon runs with, e.g. "sync=group"
	ReportBatch int    // outcomes per ReportOutcome
}

// allPhases are the measured phases, in the order they run at each level.
var allPhases = []string{"echo-unary", "echo-stream", "admit", "admit-ceiling", "admit-ceiling-report", "admit-ceiling-batch", "nextdelay", "report", "mix"}

// row is one line of the sweep table.
type row struct {
	Callers      int     `json:"callers"`
	Phase        string  `json:"phase"`
	RPC          string  `json:"rpc"`
	Requests     uint64  `json:"requests"`
	Errors       uint64  `json:"errors"`
	RPS          float64 `json:"requests_per_second"`
	P50us        float64 `json:"p50_us"`
	P99us        float64 `json:"p99_us"`
	P999us       float64 `json:"p999_us"`
	MaxUs        float64 `json:"max_us"`
	ServerCPUus  float64 `json:"server_cpu_us_per_request"` // -1: unknown
	ClientCPUus  float64 `json:"client_cpu_us_per_request"`
	OutcomesPerS float64 `json:"outcomes_per_second,omitempty"`
	VsEcho       *ratio  `json:"vs_echo_unary,omitempty"`
	VsStream     *ratio  `json:"vs_echo_stream,omitempty"`
	FirstError   string  `json:"first_error,omitempty"`
}

// ratio compares a row to an echo row at the same concurrency: throughput,
// p99 latency and server CPU per request, each policyd / echo.
type ratio struct {
	RPS float64 `json:"requests_per_second"`
	P99 float64 `json:"p99"`
	CPU float64 `json:"server_cpu_per_request"` // 0: unknown
}

// durability is what the report phase says about outcomes reaching disk:
// accepted by the RPC, and made durable per policyd's commit counter.
type durability struct {
	Callers                int     `json:"callers"`
	OutcomesAcceptedPerSec float64 `json:"outcomes_accepted_per_second"`
	Commits                float64 `json:"commits"`
	CommitsPerSec          float64 `json:"commits_per_second"`
	OutcomesPerCommit      float64 `json:"outcomes_per_commit"`
	DurableOutcomesPerSec  float64 `json:"durable_outcomes_per_second"`
}

type machine struct {
	NumCPU    int    `json:"nproc"`
	CPUModel  string `json:"cpu_model"`
	MemTotal  string `json:"mem_total"`
	GoVersion string `json:"go_version"`
	Kernel    string `json:"kernel"`
	LoadAvg   string `json:"loadavg_at_start"`
}

type sweepReport struct {
	Machine     machine      `json:"machine"`
	Addr        string       `json:"addr"`
	Label       string       `json:"label,omitempty"`
	ServerPID   int          `json:"server_pid"`
	EchoPID     int          `json:"echo_pid"`
	Duration    string       `json:"duration_per_phase"`
	Warmup      string       `json:"warmup_per_phase"`
	ReportBatch int          `json:"outcomes_per_report"`
	Rows        []row        `json:"rows"`
	Durability  []durability `json:"durability,omitempty"`
	Notes       []string     `json:"notes,omitempty"`
}

func machineInfo() machine {
	m := machine{NumCPU: runtime.NumCPU(), GoVersion: runtime.Version()}
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if raw, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				m.MemTotal = strings.TrimSpace(v)
			}
		}
	}
	if raw, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(raw))
	}
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.LoadAvg = strings.TrimSpace(string(raw))
	}
	return m
}

// runSweep measures the echo and policyd at each concurrency level and
// writes the table (or JSON) to out. Progress goes to log.
func runSweep(ctx context.Context, cfg sweepConfig, out, log io.Writer) error {
	for _, p := range cfg.Phases {
		if !slices.Contains(allPhases, p) {
			return fmt.Errorf("--phases: unknown phase %q (want some of %s)", p, strings.Join(allPhases, ","))
		}
	}
	if len(cfg.Concurrency) == 0 {
		return errors.New("--concurrency: at least one level")
	}
	for _, n := range cfg.Concurrency {
		if n < 1 || n > 4096 {
			return fmt.Errorf("--concurrency: %d is not in 1..4096", n)
		}
	}
	if cfg.ReportBatch < 1 || cfg.ReportBatch > 1000 {
		return fmt.Errorf("--report-batch: %d is not in 1..1000", cfg.ReportBatch)
	}
	if cfg.Duration <= 0 || cfg.Warmup < 0 {
		return errors.New("--duration must be > 0 and --warmup >= 0")
	}
	rep := sweepReport{Machine: machineInfo(), Addr: cfg.Addr, Label: cfg.Label, Duration: cfg.Duration.String(),
		Warmup: cfg.Warmup.String(), ReportBatch: cfg.ReportBatch}
	total := time.Duration(len(cfg.Concurrency)*len(cfg.Phases)) * (cfg.Duration + cfg.Warmup)
	// The sweep is bounded: twice its nominal length, plus a minute.
	ctx, cancel := context.WithTimeout(ctx, 2*total+time.Minute)
	defer cancel()

	if cfg.PID == 0 {
		cfg.PID = pidListening(cfg.Addr)
	}
	rep.ServerPID = cfg.PID
	if cfg.PID == 0 {
		rep.Notes = append(rep.Notes, "policyd's PID unknown (pass --pid): no server CPU figures")
	}
	metrics := metricsURL(cfg.Metrics)
	if metrics == "" {
		rep.Notes = append(rep.Notes, "no --metrics: durable outcomes/s not measured (see go test -bench ReportOutcome64 ./server/)")
	} else if commitsOf(ctx, metrics) < 0 {
		rep.Notes = append(rep.Notes, "metrics at "+metrics+" have no policyd_store_commits_total: durable outcomes/s not measured")
		metrics = ""
	}

	conn, err := dial(cfg.Addr, "")
	if err != nil {
		return err
	}
	defer conn.Close()
	workers := pb.NewRetryPolicyServiceClient(conn)
	if err := waitReady(ctx, workers); err != nil {
		return fmt.Errorf("policyd at %s: %w", cfg.Addr, err)
	}
	if cfg.TokenFile != "" {
		tok, err := readToken(cfg.TokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		aconn, err := dial(cfg.Addr, tok)
		if err != nil {
			return err
		}
		err = setupWorkload(ctx, pb.NewAdminServiceClient(aconn))
		aconn.Close()
		if err != nil {
			return fmt.Errorf("admin setup: %w", err)
		}
	} else {
		rep.Notes = append(rep.Notes, "no --token-file: budgets and policies not set up; the daemon's defaults apply")
	}

	var echo *echoChild
	var econn *grpc.ClientConn
	if slices.Contains(cfg.Phases, "echo-unary") || slices.Contains(cfg.Phases, "echo-stream") {
		if echo, err = startEchoChild(); err != nil {
			return fmt.Errorf("echo server: %w", err)
		}
		defer echo.stop()
		rep.EchoPID = echo.pid()
		if econn, err = dial(echo.addr, ""); err != nil {
			return err
		}
		defer econn.Close()
	}

	fmt.Fprintf(log, "policybench: %d levels x %d phases x (%s warm-up + %s) = about %s\n",
		len(cfg.Concurrency), len(cfg.Phases), cfg.Warmup, cfg.Duration, total.Round(time.Second))
	for _, n := range cfg.Concurrency {
		var level []row
		for _, ph := range cfg.Phases {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			fmt.Fprintf(log, "  %d callers: %s\n", n, ph)
			pid, loop := cfg.PID, phaseLoop(ph, workers, econn, cfg.ReportBatch)
			if strings.HasPrefix(ph, "echo") {
				pid = rep.EchoPID
			}
			callers := n
			if ph == "admit-ceiling-batch" {
				callers++ // caller 0 is the batcher of the n others
			}
			w := measure(ctx, callers, cfg.Warmup, cfg.Duration, cfg.Seed, pid, metrics, loop)
			rows := rowsOf(n, ph, w)
			level = append(level, rows...)
			if ph == "report" && len(rows) == 1 {
				rep.Durability = append(rep.Durability, durabilityOf(n, w))
			}
		}
		compare(level)
		rep.Rows = append(rep.Rows, level...)
	}
	if cfg.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	printTable(out, &rep)
	return nil
}

// waitReady retries a cheap call until policyd answers, for at most 10s.
func waitReady(ctx context.Context, c pb.RetryPolicyServiceClient) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.PlanBudget(cctx, &pb.PlanBudgetRequest{Window: durationOf(time.Minute)})
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// phaseLoop returns what each caller does in a phase.
func phaseLoop(phase string, cl pb.RetryPolicyServiceClient, econn *grpc.ClientConn, batch int) func(context.Context, *caller) {
	switch phase {
	case "echo-unary":
		return func(ctx context.Context, c *caller) {
			in, outMsg := echoPayloadMsg(), new(wrapperspb.BytesValue)
			for ctx.Err() == nil {
				_ = c.do(rpcEchoUnary, func() error { return econn.Invoke(ctx, echoUnaryMethod, in, outMsg) })
			}
		}
	case "echo-stream":
		return func(ctx context.Context, c *caller) {
			st, err := econn.NewStream(ctx, &echoDesc.Streams[0], echoStreamMethod)
			if err != nil {
				_ = c.do(rpcEchoStream, func() error { return err })
				return
			}
			in, outMsg := echoPayloadMsg(), new(wrapperspb.BytesValue)
			for ctx.Err() == nil {
				err := c.do(rpcEchoStream, func() error {
					if err := st.SendMsg(in); err != nil {
						return err
					}
					return st.RecvMsg(outMsg)
				})
				if err != nil {
					return
				}
			}
			_ = st.CloseSend()
		}
	case "admit":
		return func(ctx context.Context, c *caller) {
			pool := make([]*pb.AdmitRequest, poolSize)
			for i := range pool {
				pool[i] = c.g.admit()
			}
			for i := 0; ctx.Err() == nil; i++ {
				_ = c.do(rpcAdmit, func() error { _, err := cl.Admit(ctx, pool[i%poolSize]); return err })
			}
		}
	case "admit-ceiling":
		return func(ctx context.Context, c *caller) { ceilingLoop(ctx, c, cl, false) }
	case "admit-ceiling-report":
		return func(ctx context.Context, c *caller) { ceilingLoop(ctx, c, cl, true) }
	case "admit-ceiling-batch":
		queue := make(chan *pb.Outcome, 4096)
		return func(ctx context.Context, c *caller) {
			if c.g.caller == 0 {
				leaseBatcher(ctx, c, cl, queue)
				return
			}
			for ctx.Err() == nil {
				call := c.g.ceiledCall()
				var resp *pb.AdmitResponse
				err := c.do(rpcAdmit, func() (err error) {
					resp, err = cl.Admit(ctx, &pb.AdmitRequest{Call: call, Attempt: 1})
					return err
				})
				if err != nil {
					continue
				}
				o := &pb.Outcome{Call: outcomeRef(call), Attempt: 1, Success: true, LeaseId: resp.GetLeaseId(),
					Latency: durationOf(time.Duration(5+c.g.rng.IntN(50)) * time.Millisecond), FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}
				select {
				case queue <- o:
				case <-ctx.Done():
				}
			}
		}
	case "nextdelay":
		return func(ctx context.Context, c *caller) {
			pool := make([]*pb.NextDelayRequest, poolSize)
			for i := range pool {
				pool[i] = c.g.nextDelay()
			}
			for i := 0; ctx.Err() == nil; i++ {
				_ = c.do(rpcNextDelay, func() error { _, err := cl.NextDelay(ctx, pool[i%poolSize]); return err })
			}
		}
	case "report":
		return func(ctx context.Context, c *caller) {
			c.g.batch = batch
			pool := make([]*pb.ReportOutcomeRequest, 4)
			for i := range pool {
				pool[i] = c.g.report()
			}
			for i := 0; ctx.Err() == nil; i++ {
				var resp *pb.ReportOutcomeResponse
				err := c.do(rpcReport, func() (err error) { resp, err = cl.ReportOutcome(ctx, pool[i%len(pool)]); return err })
				if err == nil && c.on.Load() {
					c.outcomes += uint64(resp.GetAccepted())
				}
			}
		}
	case "mix":
		return func(ctx context.Context, c *caller) { c.g.batch = batch; mixLoop(ctx, c, cl) }
	}
	panic("unknown phase " + phase)
}

// ceilingLoop is an attempt to a target with a concurrency ceiling that
// never refuses (benchCeiling): Admit takes a lease, then the caller returns
// it, by ReleaseLease, or, with report, by a ReportOutcome carrying the
// attempt's success and its lease_id, one outcome per request (what the Go
// client sends when a lease is all it has queued: a lease makes its batcher
// send at once). An Admit without a lease, or a release of a lease not held,
// is an error of the phase: the target has no ceiling (no --token-file) or
// the engine lost the lease.
func ceilingLoop(ctx context.Context, c *caller, cl pb.RetryPolicyServiceClient, report bool) {
	errNoLease := errors.New("Admit handed out no lease: the target has no ceiling (set up with --token-file)")
	errNotHeld := errors.New("lease not held when returned")
	for ctx.Err() == nil {
		call := c.g.ceiledCall()
		var lease string
		err := c.do(rpcAdmit, func() error {
			resp, err := cl.Admit(ctx, &pb.AdmitRequest{Call: call, Attempt: 1})
			if err == nil && resp.GetLeaseId() == "" {
				return errNoLease
			}
			lease = resp.GetLeaseId()
			return err
		})
		if err != nil {
			continue
		}
		if !report {
			_ = c.do(rpcRelease, func() error {
				resp, err := cl.ReleaseLease(ctx, &pb.ReleaseLeaseRequest{Call: call, LeaseId: lease})
				if err == nil && !resp.GetReleased() {
					return errNotHeld
				}
				return err
			})
			continue
		}
		req := &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: outcomeRef(call), Attempt: 1, Success: true,
			LeaseId: lease, Latency: durationOf(time.Duration(5+c.g.rng.IntN(50)) * time.Millisecond),
			FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}}}
		var resp *pb.ReportOutcomeResponse
		err = c.do(rpcReport, func() (err error) { resp, err = cl.ReportOutcome(ctx, req); return err })
		if err == nil && c.on.Load() {
			c.outcomes += uint64(resp.GetAccepted())
		}
	}
}

// leaseBatcher is the Go client's batcher in the admit-ceiling-batch
// phase, caller 0 beside the level's callers: woken by a queued outcome
// that returns a lease, it sends at once everything queued (up to 1000
// outcomes) in one ReportOutcome, while the other callers Admit and queue.
func leaseBatcher(ctx context.Context, c *caller, cl pb.RetryPolicyServiceClient, queue <-chan *pb.Outcome) {
	for ctx.Err() == nil {
		req := &pb.ReportOutcomeRequest{}
		select {
		case o := <-queue:
			req.Outcomes = append(req.Outcomes, o)
		case <-ctx.Done():
			return
		}
	more:
		for len(req.Outcomes) < 1000 {
			select {
			case o := <-queue:
				req.Outcomes = append(req.Outcomes, o)
			default:
				break more
			}
		}
		var resp *pb.ReportOutcomeResponse
		err := c.do(rpcReport, func() (err error) { resp, err = cl.ReportOutcome(ctx, req); return err })
		if err == nil && c.on.Load() {
			c.outcomes += uint64(resp.GetAccepted())
		}
	}
}

// mixLoop is a worker's retry loop without the Go client's breaker cache:
// Admit before every attempt; on a failure NextDelay (retrying at once:
// the benchmark does not sleep the delay); outcomes batched and reported
// every batch.
func mixLoop(ctx context.Context, c *caller, cl pb.RetryPolicyServiceClient) {
	batch := &pb.ReportOutcomeRequest{}
	add := func(o *pb.Outcome) { batch.Outcomes = append(batch.Outcomes, o) }
	for ctx.Err() == nil {
		tenant, target, failing := c.g.pick()
		call := c.g.callRef(tenant, target)
		ref := outcomeRef(call)
		for attempt := uint32(1); attempt <= 5 && ctx.Err() == nil; attempt++ {
			var adm *pb.AdmitResponse
			err := c.do(rpcAdmit, func() (err error) {
				adm, err = cl.Admit(ctx, &pb.AdmitRequest{Call: call, Attempt: attempt})
				return err
			})
			if err != nil {
				break
			}
			if !adm.GetAdmitted() {
				add(&pb.Outcome{Call: ref, Attempt: attempt, AlreadyRecorded: true,
					FinalDisposition: pb.Disposition_DISPOSITION_CIRCUIT_OPEN, FinalStopReason: pb.StopReason_STOP_REASON_CIRCUIT_OPEN})
				break
			}
			if !failing && c.g.rng.Float64() < 0.9 {
				add(&pb.Outcome{Call: ref, Attempt: attempt, Success: true, PermitId: adm.GetPermitId(),
					Latency: durationOf(time.Duration(5+c.g.rng.IntN(50)) * time.Millisecond), FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED})
				break
			}
			f, push := c.g.failure(failing)
			var nd *pb.NextDelayResponse
			err = c.do(rpcNextDelay, func() (err error) {
				nd, err = cl.NextDelay(ctx, &pb.NextDelayRequest{Call: call, Attempt: attempt, Failure: f, Pushback: push, PermitId: adm.GetPermitId()})
				return err
			})
			if err != nil {
				break
			}
			if nd.GetDecision() == pb.Decision_DECISION_STOP {
				add(&pb.Outcome{Call: ref, Attempt: attempt, AlreadyRecorded: true,
					FinalDisposition: nd.GetDisposition(), FinalStopReason: nd.GetStopReason()})
				break
			}
		}
		if len(batch.Outcomes) >= c.g.batch {
			var resp *pb.ReportOutcomeResponse
			err := c.do(rpcReport, func() (err error) { resp, err = cl.ReportOutcome(ctx, batch); return err })
			if err == nil && c.on.Load() {
				c.outcomes += uint64(resp.GetAccepted())
			}
			batch = &pb.ReportOutcomeRequest{}
		}
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// rowsOf turns a phase's window into table rows, one per RPC it made.
func rowsOf(n int, phase string, w window) []row {
	var rows []row
	var total uint64
	for r := range numRPC {
		if w.hists[r] != nil {
			total += w.hists[r].n
		}
	}
	for r := range numRPC {
		h := w.hists[r]
		if h == nil && w.errs[r] == 0 {
			continue
		}
		if h == nil {
			h = new(hist)
		}
		secs := w.elapsed.Seconds()
		rw := row{Callers: n, Phase: phase, RPC: rpcNames[r], Requests: h.n, Errors: w.errs[r],
			RPS: float64(h.n) / secs, P50us: us(h.quantile(0.5)), P99us: us(h.quantile(0.99)),
			P999us: us(h.quantile(0.999)), MaxUs: us(time.Duration(h.max)), ServerCPUus: -1}
		if total > 0 {
			// In the mix, CPU is shared by every RPC: per request of any kind.
			if w.serverCPU >= 0 {
				rw.ServerCPUus = us(w.serverCPU) / float64(total)
			}
			rw.ClientCPUus = us(w.clientCPU) / float64(total)
		}
		if r == rpcReport {
			rw.OutcomesPerS = float64(w.outcomes) / secs
		}
		if w.firstErr != nil && w.errs[r] > 0 {
			rw.FirstError = w.firstErr.Error()
		}
		rows = append(rows, rw)
	}
	if len(rows) == 0 {
		rw := row{Callers: n, Phase: phase, RPC: "-", ServerCPUus: -1}
		if w.firstErr != nil {
			rw.FirstError = w.firstErr.Error()
		}
		rows = append(rows, rw)
	}
	return rows
}

func durabilityOf(n int, w window) durability {
	secs := w.elapsed.Seconds()
	d := durability{Callers: n, OutcomesAcceptedPerSec: float64(w.outcomes) / secs, Commits: w.commits}
	if w.commits > 0 {
		d.CommitsPerSec = w.commits / secs
		d.OutcomesPerCommit = float64(w.outcomes) / w.commits
		d.DurableOutcomesPerSec = d.OutcomesPerCommit * d.CommitsPerSec
	}
	return d
}

// compare fills the ratios of one level's rows to its echo rows.
func compare(level []row) {
	var unary, stream *row
	for i := range level {
		switch level[i].Phase {
		case "echo-unary":
			unary = &level[i]
		case "echo-stream":
			stream = &level[i]
		}
	}
	ratioTo := func(r, e *row) *ratio {
		if e == nil || e.RPS == 0 || e.P99us == 0 {
			return nil
		}
		out := &ratio{RPS: r.RPS / e.RPS, P99: r.P99us / e.P99us}
		if r.ServerCPUus > 0 && e.ServerCPUus > 0 {
			out.CPU = r.ServerCPUus / e.ServerCPUus
		}
		return out
	}
	for i := range level {
		r := &level[i]
		if strings.HasPrefix(r.Phase, "echo") {
			continue
		}
		r.VsEcho = ratioTo(r, unary)
		r.VsStream = ratioTo(r, stream)
	}
}

func fmtUs(v float64) string {
	switch {
	case v < 0:
		return "-"
	case v < 10:
		return fmt.Sprintf("%.2fµs", v)
	case v < 1000:
		return fmt.Sprintf("%.0fµs", v)
	case v < 100000:
		return fmt.Sprintf("%.2fms", v/1000)
	}
	return fmt.Sprintf("%.0fms", v/1000)
}

func fmtRatio(v float64) string {
	if v <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", v)
}

// printTable writes the sweep as aligned text.
func printTable(out io.Writer, rep *sweepReport) {
	m := rep.Machine
	fmt.Fprintf(out, "machine: %d CPUs (%s), %s, %s, kernel %s, load %s\n", m.NumCPU, m.CPUModel, m.MemTotal, m.GoVersion, m.Kernel, m.LoadAvg)
	label := ""
	if rep.Label != "" {
		label = " [" + rep.Label + "]"
	}
	fmt.Fprintf(out, "policyd %s%s pid %d; echo pid %d; %s per phase after %s warm-up; one connection each; ReportOutcome carries %d outcomes\n\n",
		rep.Addr, label, rep.ServerPID, rep.EchoPID, rep.Duration, rep.Warmup, rep.ReportBatch)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "callers\tphase\trpc\treq/s\tp50\tp99\tp99.9\terrors\tsrv cpu/req\tcli cpu/req\treq/s ÷ echo\tp99 ÷ echo\tcpu ÷ echo\t")
	for _, r := range rep.Rows {
		var rr ratio
		if r.VsEcho != nil {
			rr = *r.VsEcho
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.0f\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t\n", r.Callers, r.Phase, r.RPC, r.RPS,
			fmtUs(r.P50us), fmtUs(r.P99us), fmtUs(r.P999us), r.Errors, fmtUs(r.ServerCPUus), fmtUs(r.ClientCPUus),
			fmtRatio(rr.RPS), fmtRatio(rr.P99), fmtRatio(rr.CPU))
	}
	tw.Flush()
	if len(rep.Durability) > 0 {
		fmt.Fprintf(out, "\noutcomes (report phase, %d per request):\n", rep.ReportBatch)
		tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "callers\taccepted/s\tcommits\tcommits/s\toutcomes/commit\tdurable outcomes/s\t")
		for _, d := range rep.Durability {
			if d.Commits < 0 {
				fmt.Fprintf(tw, "%d\t%.0f\t-\t-\t-\t-\t\n", d.Callers, d.OutcomesAcceptedPerSec)
				continue
			}
			fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.1f\t%.0f\t%.0f\t\n", d.Callers, d.OutcomesAcceptedPerSec, d.Commits,
				d.CommitsPerSec, d.OutcomesPerCommit, d.DurableOutcomesPerSec)
		}
		tw.Flush()
	}
	for _, r := range rep.Rows {
		if r.FirstError != "" {
			fmt.Fprintf(out, "\n%d callers %s %s: %d errors, first: %s", r.Callers, r.Phase, r.RPC, r.Errors, r.FirstError)
		}
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(out, "\nnote: %s", n)
	}
	fmt.Fprintln(out)
}
