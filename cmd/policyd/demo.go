package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/breakerstore"
	policyclient "github.com/policyd/policyd/clients/go"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// demoConfig is everything `policyd demo` is told by its flags, plus the
// scale of the scenario (the tests shrink it).
type demoConfig struct {
	Docs, Workers  int
	Seed           uint64
	Addr           string // a running policyd; empty starts one in the process
	JSON           bool
	Cutoff         time.Duration // the run's cut-off, from its opening
	Tenant, Target string
	// Feed is the span over which the documents are released to the
	// workers, evenly, so that the upstream's outage lands mid-batch.
	Feed time.Duration
	// Progress is the interval between status lines.
	Progress time.Duration
	// PBad is the share of malformed documents (the upstream answers 400).
	PBad     float64
	Upstream upstreamScript // its Seed is set from Seed
	Policy   demoPolicy
	// Log receives the warnings of the embedded policyd and of the client.
	Log io.Writer
}

// demoPolicy is the demo-scale policy set for the demo's tenant and target.
type demoPolicy struct {
	MaxAttempts            int
	Base, Cap              time.Duration // backoff: base x 2^n, capped, full jitter
	AttemptTimeout         time.Duration
	Threshold, Probes      int // consecutive transient failures that open the breaker; HALF_OPEN probes
	Cooldown, ProbeTimeout time.Duration
}

func defaultDemoConfig() demoConfig {
	return demoConfig{
		Docs: 300, Workers: 32, Seed: 1, Cutoff: 90 * time.Second,
		Tenant: "demo", Target: "docs-api",
		Feed: 45 * time.Second, Progress: 10 * time.Second, PBad: 0.03,
		Upstream: upstreamScript{
			P429: 0.01, P503: 0.05, PHang: 0.025,
			RetryAfter: 2 * time.Second, Hang: 3 * time.Second,
			LatencyMin: 20 * time.Millisecond, LatencyMax: 150 * time.Millisecond,
			OutageAt: 15 * time.Second, Outage503: 6 * time.Second, OutageRefused: 6 * time.Second,
		},
		Policy: demoPolicy{
			MaxAttempts: 3, Base: 200 * time.Millisecond, Cap: 2 * time.Second,
			AttemptTimeout: time.Second, Threshold: 5, Probes: 1,
			Cooldown: 4 * time.Second, ProbeTimeout: 3 * time.Second,
		},
		Log: os.Stderr,
	}
}

func demoCmd() *cobra.Command {
	cfg := defaultDemoConfig()
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Work a batch of documents against a fake flaky API, with policyd deciding every retry",
		Long: `Run a batch of --docs documents with --workers concurrent workers against a
fake flaky HTTP API on loopback (mostly 200; some 429 with Retry-After, 503,
hangs past the attempt timeout, 400 for malformed documents, and a full outage
in the middle: 503, then connection refused), with policyd deciding every
retry. The documents and the upstream's faults are the same for the same
--seed; the outage is a fixed window of time.

policyd runs inside the demo process on a temporary state file (./policyd.db is
never touched), or, with --addr, the demo uses a running policyd; it then sets
the policy of tenant "demo", target "docs-api" there and opens a run.

At the end the demo prints the run's reconciliation from policyd, the final
dispositions the workers saw, what the upstream counted, and how many upstream
calls the breaker and the fleet-wide cool-down saved. Every number is measured
in the run. It takes about a minute.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case cfg.Docs < 1 || cfg.Docs > 1_000_000:
				return fmt.Errorf("--docs: must be 1 to 1000000, got %d", cfg.Docs)
			case cfg.Workers < 1 || cfg.Workers > 10_000:
				return fmt.Errorf("--workers: must be 1 to 10000, got %d", cfg.Workers)
			case cfg.Cutoff <= 0:
				return fmt.Errorf("--cutoff: must be > 0, got %s", cfg.Cutoff)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			out, progress := cmd.OutOrStdout(), cmd.OutOrStdout()
			if cfg.JSON {
				progress = cmd.ErrOrStderr()
			}
			cfg.Log = cmd.ErrOrStderr()
			sum, err := runDemo(ctx, cfg, progress)
			if err != nil {
				return err
			}
			if cfg.JSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(sum); err != nil {
					return err
				}
			} else {
				sum.print(out)
			}
			if !sum.LedgerMatches {
				return errors.New("demo: the run's ledger does not match the workers' results")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Docs, "docs", cfg.Docs, "documents in the batch")
	f.IntVar(&cfg.Workers, "workers", cfg.Workers, "concurrent workers")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the documents and of the upstream's faults")
	f.StringVar(&cfg.Addr, "addr", "", "use the policyd at this address instead of one started in the demo process")
	f.BoolVar(&cfg.JSON, "json", false, "print the summary as JSON (progress goes to stderr)")
	f.DurationVar(&cfg.Cutoff, "cutoff", cfg.Cutoff, "the run's cut-off, from its opening")
	return cmd
}

// demoSummary is what the demo measured. Times are seconds from the start
// of the batch.
type demoSummary struct {
	Docs            int               `json:"docs"`
	Workers         int               `json:"workers"`
	Seed            uint64            `json:"seed"`
	Policyd         string            `json:"policyd"` // "embedded" or the address
	StateFile       string            `json:"state_file,omitempty"`
	RunID           string            `json:"run_id"`
	DurationSeconds float64           `json:"duration_seconds"`
	Policy          demoPolicySummary `json:"policy"`
	Ledger          demoLedger        `json:"ledger"`        // AdminService.GetRun
	ClientLedger    demoLedger        `json:"client_ledger"` // the same counts from the workers' Results
	LedgerMatches   bool              `json:"ledger_matches_client"`
	Dispositions    []dispositionRow  `json:"dispositions"`
	Upstream        demoUpstream      `json:"upstream"`
	Client          demoClientStats   `json:"client"`
	Breaker         demoBreaker       `json:"breaker"`
	Saved           demoSaved         `json:"saved"`

	docs []docOutcome // one per document, in document order
}

type demoPolicySummary struct {
	Tenant                string  `json:"tenant"`
	Target                string  `json:"target"`
	MaxAttempts           int     `json:"max_attempts"`
	BaseSeconds           float64 `json:"base_delay_seconds"`
	CapSeconds            float64 `json:"max_delay_seconds"`
	AttemptTimeoutSeconds float64 `json:"attempt_timeout_seconds"`
	BreakerThreshold      int     `json:"breaker_consecutive_failures"`
	CooldownSeconds       float64 `json:"breaker_cooldown_seconds"`
	Probes                int     `json:"half_open_probes"`
}

type demoLedger struct {
	Succeeded               uint64 `json:"succeeded"`
	FailedTerminal          uint64 `json:"failed_terminal"`
	DeadLetterExhausted     uint64 `json:"dead_letter_exhausted"`
	DeadLetterBudget        uint64 `json:"dead_letter_budget"`
	DeadLetterNotIdempotent uint64 `json:"dead_letter_not_idempotent"`
	DeadLetterPushback      uint64 `json:"dead_letter_pushback"`
	CircuitOpen             uint64 `json:"circuit_open"`
	DeadlineCut             uint64 `json:"deadline_cut"`
	RetriesSpent            uint64 `json:"retries_spent,omitempty"`
	RetryPool               uint64 `json:"retry_pool,omitempty"`
}

func (l demoLedger) total() uint64 {
	return l.Succeeded + l.FailedTerminal + l.DeadLetterExhausted + l.DeadLetterBudget +
		l.DeadLetterNotIdempotent + l.DeadLetterPushback + l.CircuitOpen + l.DeadlineCut
}

// counts returns the ledger without the pool, for comparisons.
func (l demoLedger) counts() demoLedger {
	l.RetriesSpent, l.RetryPool = 0, 0
	return l
}

type dispositionRow struct {
	Disposition  string         `json:"disposition"`
	StopReason   string         `json:"stop_reason,omitempty"`
	Docs         int            `json:"docs"`
	Attempts     int            `json:"attempts"`      // calls of the upstream they made
	LastFailures map[string]int `json:"last_failures"` // classification of the last failure -> documents
}

type demoUpstream struct {
	URL                string         `json:"url"`
	OutageStart        float64        `json:"outage_start_seconds"`
	OutageEnd          float64        `json:"outage_end_seconds"`
	Counts             upstreamCounts `json:"counts"`
	ConnectionsRefused int            `json:"connections_refused"` // seen by the workers
	Timeouts           int            `json:"attempt_timeouts"`    // seen by the workers
}

type demoClientStats struct {
	Calls           uint64 `json:"calls"`
	Attempts        uint64 `json:"attempts"`
	AdmitRPCs       uint64 `json:"admit_rpcs"`
	FastFails       uint64 `json:"fast_fails"`
	LocalDecisions  uint64 `json:"local_decisions"`
	OutcomesSent    uint64 `json:"outcomes_sent"`
	OutcomesDropped uint64 `json:"outcomes_dropped"`
}

type breakerTransition struct {
	At        float64 `json:"at_seconds"`
	From      string  `json:"from"`
	To        string  `json:"to"`
	OpenUntil float64 `json:"open_until_seconds,omitempty"`
}

type cooldownStart struct {
	At    float64 `json:"at_seconds"`
	Until float64 `json:"until_seconds"`
}

type demoBreaker struct {
	Opened      int                 `json:"opened"`
	Transitions []breakerTransition `json:"transitions"`
	Cooldowns   []cooldownStart     `json:"cooldowns"`
}

// demoSaved is how many upstream calls the breaker and the cool-down saved,
// and how it is computed (see print).
type demoSaved struct {
	CircuitOpenDocs     int     `json:"circuit_open_docs"`
	CircuitOpenCalls    int     `json:"circuit_open_calls_made"`
	CircuitOpenNotMade  int     `json:"circuit_open_calls_not_made"` // max_attempts x docs - calls made
	RefusedBeforeCall   int     `json:"refused_before_first_call"`
	FastFails           uint64  `json:"fast_fails"`       // client Stats.FastFails: refused from the WatchBreakers cache
	AdmitRefusals       int     `json:"admit_refusals"`   // refused by an Admit RPC (OPEN or probe permits taken)
	NextDelayStops      int     `json:"next_delay_stops"` // NextDelay answered CIRCUIT_OPEN after a failed call
	StoppedAfterCall    int     `json:"stopped_after_a_call"`
	DocsInOutage        int     `json:"docs_started_in_outage"`
	NaiveSchedule       string  `json:"naive_schedule"`
	NaiveCalls          int     `json:"naive_calls_in_outage"`
	ActualCalls         int     `json:"actual_calls_in_outage"`
	SavedCalls          int     `json:"saved_calls_in_outage"`
	CooldownWaits       int     `json:"cooldown_waits"`
	CooldownWaitSeconds float64 `json:"cooldown_wait_seconds"`
	// CooldownBurst is the most calls made right after a cool-down wait
	// that started within burstSpan of each other, at CooldownBurstAt.
	CooldownBurst   int     `json:"cooldown_burst_calls"`
	CooldownBurstAt float64 `json:"cooldown_burst_at_seconds"`
}

// burstSpan is the span within which calls count as one burst.
const burstSpan = 10 * time.Millisecond

// docOutcome is how one document ended.
type docOutcome struct {
	ID     string
	Result policyclient.Result
	Trace  *docTrace
}

// docTrace records one document's calls and waits. It is written only by
// the goroutine running the document's Do (the function and Sleep are
// called from it), and read after.
type docTrace struct {
	Start         time.Duration // from the start of the batch
	Attempts      []attemptRec
	CooldownWaits int
	CooldownWait  time.Duration
	BackoffWaits  int
	afterAttempt  bool // the last event was a call of the upstream
	afterCooldown bool // the last event was a cool-down wait
}

type attemptRec struct {
	At      time.Duration
	Outcome string // an HTTP status, "timeout", "refused", "reset" or "error"
	// AfterCooldown is set on a call made right after a cool-down wait.
	AfterCooldown bool
}

type traceKey struct{}

// demo is one run of the demo.
type demo struct {
	cfg    demoConfig
	log    *slog.Logger
	pr     *printer
	t0     time.Time
	httpc  *http.Client
	up     *upstream
	client *policyclient.Client

	done, ok, terminal, deadLetter, circuitOpen, cut atomic.Int64
	misuse                                           atomic.Pointer[error] // the first error Do returned
}

// printer writes progress lines, stamped with the time since the start of
// the batch; it is safe for concurrent use.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) line(at time.Duration, format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%6.1fs  %s\n", at.Seconds(), fmt.Sprintf(format, args...))
}

func (p *printer) text(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

// runDemo runs the demo and returns what it measured; progress goes to
// progress. It returns an error when the demo could not run, not when
// documents failed.
func runDemo(ctx context.Context, cfg demoConfig, progress io.Writer) (*demoSummary, error) {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	cfg.Upstream.Seed = cfg.Seed
	d := &demo{cfg: cfg, pr: &printer{w: progress},
		log: slog.New(slog.NewTextHandler(cfg.Log, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	var cleanups []func()
	defer func() {
		for _, f := range slices.Backward(cleanups) {
			f()
		}
	}()

	ids, bodies := makeDocs(cfg.Seed, cfg.Docs, cfg.PBad)
	up, err := startUpstream(cfg.Upstream, d.log)
	if err != nil {
		return nil, err
	}
	d.up = up
	cleanups = append(cleanups, up.Close)
	// The upstream is on loopback: never through a proxy.
	tr := &http.Transport{Proxy: nil, MaxIdleConns: 2 * cfg.Workers, MaxIdleConnsPerHost: 2 * cfg.Workers,
		IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	d.httpc = &http.Client{Transport: tr}
	cleanups = append(cleanups, tr.CloseIdleConnections)

	sum := &demoSummary{Docs: cfg.Docs, Workers: cfg.Workers, Seed: cfg.Seed, Policyd: "embedded"}
	addr := cfg.Addr
	if addr == "" {
		var stop func()
		addr, sum.StateFile, stop, err = startEmbedded(d.log)
		if err != nil {
			return nil, err
		}
		cleanups = append(cleanups, stop)
	} else {
		sum.Policyd = addr
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if cfg.Addr != "" {
		// A running policyd wants an admin credential, found as the admin
		// commands find it: $POLICYD_TOKEN or ./policyd.db.admin-token.
		cf := clientFlags{Addr: cfg.Addr, TokenFile: "policyd.db.admin-token"}
		if opts, err = cf.dialOptions(); err != nil {
			return nil, err
		}
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("--addr: %w", err)
	}
	cleanups = append(cleanups, func() { conn.Close() })
	admin := pb.NewAdminServiceClient(conn)

	run, err := d.setUp(ctx, admin)
	if err != nil {
		return nil, fmt.Errorf("policyd at %s: %w", addr, err)
	}
	sum.RunID = run.GetRunId()
	cutoff := run.GetCutoffTime().AsTime()

	d.client, err = policyclient.New(conn, policyclient.Config{
		Tenant: cfg.Tenant, AttemptTimeout: cfg.Policy.AttemptTimeout, Sleep: d.sleep, Logger: d.log,
	})
	if err != nil {
		return nil, err
	}
	closeClient := func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.client.Close(cctx); err != nil {
			d.log.Warn("closing the policyd client", "err", err)
		}
	}
	cleanups = append(cleanups, closeClient) // a no-op after the explicit Close below

	d.header(sum, up, addr, run)
	d.t0 = time.Now()
	wctx, stopWatch := context.WithCancel(ctx)
	watch := newBreakerWatch(d.t0, cfg.Tenant, cfg.Target, cfg.Policy.Threshold, d.pr)
	go watch.run(wctx, pb.NewRetryPolicyServiceClient(conn))
	cleanups = append(cleanups, func() { stopWatch(); <-watch.done })
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = watch.wait(rctx)
	if err == nil {
		err = d.client.Ready(rctx)
	}
	cancel()
	if err != nil {
		return nil, fmt.Errorf("policyd at %s: watching breakers: %w", addr, err)
	}
	up.start(d.t0)

	outcomes := d.work(ctx, ids, bodies, run.GetRunId(), cutoff)
	elapsed := time.Since(d.t0)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("demo interrupted: %w", context.Cause(ctx))
	}
	if err := d.misuse.Load(); err != nil {
		return nil, fmt.Errorf("policyclient.Do: %w", *err)
	}
	d.pr.line(elapsed, "all %d documents done; flushing outcomes to policyd", cfg.Docs)
	closeClient()
	stats := d.client.Stats()
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	got, err := admin.GetRun(gctx, &pb.GetRunRequest{RunId: run.GetRunId()})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("GetRun %s: %w", run.GetRunId(), err)
	}
	stopWatch()
	<-watch.done

	sum.DurationSeconds = elapsed.Seconds()
	sum.docs = outcomes
	d.summarize(sum, got.GetRun(), stats, watch)
	return sum, nil
}

// startEmbedded starts policyd in the process on a temporary state file and
// a loopback port; stop drains it and removes the file.
func startEmbedded(log *slog.Logger) (addr, path string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "policyd-demo-")
	if err != nil {
		return "", "", nil, err
	}
	path = filepath.Join(dir, "policyd.db")
	store, err := breakerstore.Open(breakerstore.Options{Path: path, Logger: log})
	if err != nil {
		os.RemoveAll(dir)
		return "", "", nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		store.Close()
		os.RemoveAll(dir)
		return "", "", nil, err
	}
	gs, _ := server.NewGRPC(store, server.Config{Logger: log})
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	stop = func() {
		done := make(chan struct{})
		go func() { gs.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			gs.Stop()
			<-done
		}
		if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
			log.Warn("embedded policyd", "err", err)
		}
		if err := store.Close(); err != nil {
			log.Warn("closing the demo's state file", "err", err)
		}
		os.RemoveAll(dir)
	}
	return lis.Addr().String(), path, stop, nil
}

// setUp sets the demo's policy, resets its breaker and opens its run.
func (d *demo) setUp(ctx context.Context, admin pb.AdminServiceClient) (*pb.Run, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cfg, p := d.cfg, d.cfg.Policy
	pol := &pb.Policy{
		Backoff: &pb.BackoffSettings{BaseDelay: durationpb.New(p.Base), Factor: proto.Float64(2),
			MaxDelay: durationpb.New(p.Cap), Jitter: pb.Jitter_JITTER_FULL},
		MaxAttempts:    proto.Uint32(uint32(p.MaxAttempts)),
		AttemptTimeout: durationpb.New(p.AttemptTimeout),
		Breaker: &pb.BreakerSettings{Mode: pb.BreakerMode_BREAKER_MODE_CONSECUTIVE,
			ConsecutiveFailures: proto.Uint32(uint32(p.Threshold)), Cooldown: durationpb.New(p.Cooldown),
			HalfOpenProbes: proto.Uint32(uint32(p.Probes)), ProbeTimeout: durationpb.New(p.ProbeTimeout)},
	}
	if _, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: cfg.Tenant, Target: cfg.Target, Policy: pol},
		grpc.WaitForReady(true)); err != nil {
		return nil, fmt.Errorf("SetPolicy: %w", err)
	}
	key := &pb.BreakerKey{Tenant: cfg.Tenant, Target: cfg.Target}
	if _, err := admin.ResetBreaker(ctx, &pb.ResetBreakerRequest{Key: key}); err != nil && status.Code(err) != codes.NotFound {
		return nil, fmt.Errorf("ResetBreaker: %w", err)
	}
	resp, err := admin.OpenRun(ctx, &pb.OpenRunRequest{
		RunId:       fmt.Sprintf("demo-seed%d-%s", cfg.Seed, time.Now().UTC().Format("20060102T150405.000")),
		Tenant:      cfg.Tenant,
		RetryPool:   3 * uint64(cfg.Docs),
		CutoffTime:  timestamppb.New(time.Now().Add(cfg.Cutoff)),
		Description: fmt.Sprintf("policyd demo: %d documents, %d workers, seed %d", cfg.Docs, cfg.Workers, cfg.Seed),
	})
	if err != nil {
		return nil, fmt.Errorf("OpenRun: %w", err)
	}
	return resp.GetRun(), nil
}

func (d *demo) header(sum *demoSummary, up *upstream, addr string, run *pb.Run) {
	cfg, p, s := d.cfg, d.cfg.Policy, d.cfg.Upstream
	where := "embedded on " + addr + ", state in " + sum.StateFile + " (removed at the end)"
	if cfg.Addr != "" {
		where = "the running policyd at " + addr
	}
	d.pr.text("policyd demo: %d documents, %d workers, seed %d\n", cfg.Docs, cfg.Workers, cfg.Seed)
	d.pr.text("  upstream  %s, a fake flaky API: per request %.1f%% 429 (Retry-After: %d), %.1f%% 503, %.1f%% hang %s;\n"+
		"            %.0f%% of documents malformed (400); outage at %s: 503 for %s, then connection refused for %s\n",
		up.URL(), 100*s.P429, int(s.RetryAfter.Seconds()), 100*s.P503, 100*s.PHang, s.Hang,
		100*cfg.PBad, s.OutageAt, s.Outage503, s.OutageRefused)
	d.pr.text("  policyd   %s\n", where)
	d.pr.text("  policy    tenant %s, target %s: %d attempts, backoff %s x 2^n (cap %s, full jitter), attempt timeout %s,\n"+
		"            breaker opens after %d transient failures in a row, stays open %s, then lets %d probe through\n",
		cfg.Tenant, cfg.Target, p.MaxAttempts, p.Base, p.Cap, p.AttemptTimeout, p.Threshold, p.Cooldown, p.Probes)
	d.pr.text("  run       %s: retry pool %d (3 x %d documents), cut-off in %s\n",
		run.GetRunId(), run.GetRetryPool(), cfg.Docs, cfg.Cutoff)
	d.pr.text("  feed      documents released evenly over %s; every document is one policyclient.Do call\n\n", cfg.Feed)
}

// sleep is the client's Sleep: a timer, counting the waits of each
// document. A wait right after a call of the upstream is the retry delay
// NextDelay handed out; any other is a wait at Admit for a fleet-wide
// Retry-After cool-down.
func (d *demo) sleep(ctx context.Context, dur time.Duration) error {
	if tr, ok := ctx.Value(traceKey{}).(*docTrace); ok {
		if tr.afterAttempt {
			tr.BackoffWaits++
		} else {
			tr.CooldownWaits++
			tr.CooldownWait += dur
		}
		tr.afterCooldown = !tr.afterAttempt
		tr.afterAttempt = false
	}
	return policyclient.Sleep(ctx, dur)
}

// work feeds the documents to the workers and returns how each ended.
func (d *demo) work(ctx context.Context, ids []string, bodies [][]byte, runID string, cutoff time.Time) []docOutcome {
	cfg := d.cfg
	out := make([]docOutcome, len(ids))
	jobs := make(chan int)
	interval := cfg.Feed / time.Duration(len(ids))
	d.pr.line(0, "feeding %d documents over %s (%.1f/s) to %d workers", len(ids), cfg.Feed, float64(len(ids))/cfg.Feed.Seconds(), cfg.Workers)
	go func() {
		defer close(jobs)
		t := time.NewTimer(0)
		defer t.Stop()
		for i := range ids {
			t.Reset(time.Until(d.t0.Add(time.Duration(i) * interval)))
			select {
			case <-t.C:
			case <-ctx.Done():
				return
			}
			select {
			case jobs <- i:
			case <-ctx.Done():
				return
			}
		}
	}()

	// The run's cut-off bounds every call.
	rctx, cancel := context.WithDeadline(ctx, cutoff)
	defer cancel()
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Go(func() {
			for i := range jobs {
				out[i] = d.one(rctx, ids[i], bodies[i], runID)
			}
		})
	}
	stopStatus := make(chan struct{})
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		tick := time.NewTicker(cfg.Progress)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				d.status(len(ids))
			case <-stopStatus:
				return
			}
		}
	}()
	wg.Wait()
	close(stopStatus)
	<-statusDone
	return out
}

func (d *demo) status(total int) {
	c := d.up.snapshot()
	d.pr.line(time.Since(d.t0), "%d/%d done: %d ok, %d failed terminal, %d dead letter, %d circuit open, %d cut | upstream got %d requests",
		d.done.Load(), total, d.ok.Load(), d.terminal.Load(), d.deadLetter.Load(), d.circuitOpen.Load(), d.cut.Load(), c.Requests)
}

// one works one document: one Do call.
func (d *demo) one(ctx context.Context, id string, body []byte, runID string) docOutcome {
	tr := &docTrace{Start: time.Since(d.t0)}
	url := d.up.URL() + "/documents"
	fn := func(ctx context.Context, a policyclient.Attempt) error {
		rec := attemptRec{At: time.Since(d.t0), AfterCooldown: tr.afterCooldown}
		tr.afterAttempt, tr.afterCooldown = true, false
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", a.IdempotencyKey)
		resp, err := d.httpc.Do(req)
		if err != nil {
			rec.Outcome = netOutcome(ctx, err)
			tr.Attempts = append(tr.Attempts, rec)
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		rec.Outcome = strconv.Itoa(resp.StatusCode)
		tr.Attempts = append(tr.Attempts, rec)
		if resp.StatusCode >= 300 {
			return policyclient.HTTPError(resp.StatusCode, resp.Header)
		}
		return nil
	}
	res, err := d.client.Do(context.WithValue(ctx, traceKey{}, tr), policyclient.Call{
		Target: d.cfg.Target, SubmissionID: id, Payload: body, Idempotent: false, RunID: runID,
	}, fn)
	if err != nil { // misuse of the client: a bug in the demo
		d.misuse.CompareAndSwap(nil, &err)
		return docOutcome{ID: id, Trace: tr}
	}
	d.done.Add(1)
	switch res.Disposition {
	case policyclient.Succeeded:
		d.ok.Add(1)
	case policyclient.FailedTerminal:
		d.terminal.Add(1)
	case policyclient.DeadLetter:
		d.deadLetter.Add(1)
	case policyclient.CircuitOpen:
		d.circuitOpen.Add(1)
	case policyclient.DeadlineCut:
		d.cut.Add(1)
	}
	return docOutcome{ID: id, Result: res, Trace: tr}
}

func netOutcome(ctx context.Context, err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(ctx.Err(), context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return "reset"
	}
	return "error"
}

// breakerWatch follows the demo's breaker over WatchBreakers, as an
// operator's dashboard would, and records its transitions and cool-downs.
type breakerWatch struct {
	t0             time.Time
	tenant, target string
	threshold      int
	pr             *printer
	ready, done    chan struct{}

	mu            sync.Mutex
	err           error
	state         pb.BreakerState
	cooldownUntil time.Time
	transitions   []breakerTransition
	cooldowns     []cooldownStart
}

func newBreakerWatch(t0 time.Time, tenant, target string, threshold int, pr *printer) *breakerWatch {
	return &breakerWatch{t0: t0, tenant: tenant, target: target, threshold: threshold, pr: pr,
		ready: make(chan struct{}), done: make(chan struct{}), state: pb.BreakerState_BREAKER_STATE_CLOSED}
}

// wait returns once the snapshot has arrived.
func (w *breakerWatch) wait(ctx context.Context) error {
	select {
	case <-w.ready:
		return nil
	case <-w.done:
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *breakerWatch) run(ctx context.Context, rps pb.RetryPolicyServiceClient) {
	defer close(w.done)
	fail := func(err error) {
		w.mu.Lock()
		w.err = err
		w.mu.Unlock()
	}
	stream, err := rps.WatchBreakers(ctx, &pb.WatchBreakersRequest{Tenant: w.tenant}, grpc.WaitForReady(true))
	if err != nil {
		fail(err)
		return
	}
	live := false
	for {
		msg, err := stream.Recv()
		if err != nil {
			if ctx.Err() == nil {
				fail(err)
				if live {
					w.pr.line(time.Since(w.t0), "lost the breaker watch: %v", err)
				}
			}
			return
		}
		if msg.GetSnapshotComplete() {
			if !live {
				live = true
				close(w.ready)
			}
			continue
		}
		b := msg.GetBreaker()
		if b.GetKey().GetTenant() == w.tenant && b.GetKey().GetTarget() == w.target {
			w.apply(b, live)
		}
	}
}

func (w *breakerWatch) apply(b *pb.Breaker, live bool) {
	now := time.Now()
	at := now.Sub(w.t0)
	w.mu.Lock()
	defer w.mu.Unlock()
	st := b.GetState()
	cu := time.Time{}
	if b.GetCooldownUntilTime() != nil {
		cu = b.GetCooldownUntilTime().AsTime()
	}
	if !live {
		w.state = st
		if cu.After(now) {
			w.cooldownUntil = cu
			w.cooldowns = append(w.cooldowns, cooldownStart{At: at.Seconds(), Until: cu.Sub(w.t0).Seconds()})
		}
		return
	}
	if st != w.state {
		t := breakerTransition{At: at.Seconds(), From: stateName(w.state), To: stateName(st)}
		switch st {
		case pb.BreakerState_BREAKER_STATE_OPEN:
			until := b.GetOpenUntilTime().AsTime().Sub(w.t0)
			t.OpenUntil = until.Seconds()
			if w.state == pb.BreakerState_BREAKER_STATE_HALF_OPEN {
				w.pr.line(at, "breaker OPEN again: the probe failed; next probe after %.1fs", until.Seconds())
			} else {
				w.pr.line(at, "breaker OPEN after %d transient failures in a row; workers now fail fast until %.1fs",
					w.threshold, until.Seconds())
			}
		case pb.BreakerState_BREAKER_STATE_HALF_OPEN:
			w.pr.line(at, "breaker HALF_OPEN: policyd lets one probe through, fleet-wide")
		case pb.BreakerState_BREAKER_STATE_CLOSED:
			w.pr.line(at, "breaker CLOSED: the probe succeeded")
		default:
			w.pr.line(at, "breaker %s", stateName(st))
		}
		w.transitions = append(w.transitions, t)
		w.state = st
	}
	switch {
	case !cu.After(now) || !cu.After(w.cooldownUntil):
	case w.cooldownUntil.After(now):
		// A cool-down in force was extended (by another 429).
		w.cooldownUntil = cu
		w.cooldowns[len(w.cooldowns)-1].Until = cu.Sub(w.t0).Seconds()
	default:
		w.cooldownUntil = cu
		w.cooldowns = append(w.cooldowns, cooldownStart{At: at.Seconds(), Until: cu.Sub(w.t0).Seconds()})
		w.pr.line(at, "cool-down: a worker got 429 Retry-After; the whole fleet holds its calls until %.1fs", cu.Sub(w.t0).Seconds())
	}
}

func stateName(s pb.BreakerState) string { return strings.TrimPrefix(s.String(), "BREAKER_STATE_") }

// summarize fills sum from the documents' outcomes, the run, the client's
// counters, the breaker watch and the upstream's counters.
func (d *demo) summarize(sum *demoSummary, run *pb.Run, st policyclient.Stats, w *breakerWatch) {
	cfg, p := d.cfg, d.cfg.Policy
	sum.Policy = demoPolicySummary{Tenant: cfg.Tenant, Target: cfg.Target, MaxAttempts: p.MaxAttempts,
		BaseSeconds: p.Base.Seconds(), CapSeconds: p.Cap.Seconds(), AttemptTimeoutSeconds: p.AttemptTimeout.Seconds(),
		BreakerThreshold: p.Threshold, CooldownSeconds: p.Cooldown.Seconds(), Probes: p.Probes}
	l := run.GetLedger()
	sum.Ledger = demoLedger{Succeeded: l.GetSucceeded(), FailedTerminal: l.GetFailedTerminal(),
		DeadLetterExhausted: l.GetDeadLetterExhausted(), DeadLetterBudget: l.GetDeadLetterBudget(),
		DeadLetterNotIdempotent: l.GetDeadLetterNotIdempotent(), DeadLetterPushback: l.GetDeadLetterPushback(),
		CircuitOpen: l.GetCircuitOpen(), DeadlineCut: l.GetDeadlineCut(),
		RetriesSpent: run.GetRetriesSpent(), RetryPool: run.GetRetryPool()}
	sum.Client = demoClientStats{Calls: st.Calls, Attempts: st.Attempts, AdmitRPCs: st.AdmitRPCs, FastFails: st.FastFails,
		LocalDecisions: st.LocalDecisions, OutcomesSent: st.OutcomesSent, OutcomesDropped: st.OutcomesDropped}

	outStart, outEnd := d.up.outage()
	sum.Upstream = demoUpstream{URL: d.up.URL(), OutageStart: outStart.Seconds(), OutageEnd: outEnd.Seconds(),
		Counts: d.up.snapshot()}
	sv := &sum.Saved
	var cl demoLedger
	var refusedAtAdmit int
	var cooldownWait time.Duration
	var released []time.Duration // calls made right after a cool-down wait
	rows := map[[2]string]*dispositionRow{}
	for _, o := range sum.docs {
		r, tr := o.Result, o.Trace
		switch r.Disposition {
		case policyclient.Succeeded:
			cl.Succeeded++
		case policyclient.FailedTerminal:
			cl.FailedTerminal++
		case policyclient.DeadLetter:
			switch r.StopReason {
			case policyclient.StopBudgetExhausted:
				cl.DeadLetterBudget++
			case policyclient.StopNotIdempotent:
				cl.DeadLetterNotIdempotent++
			case policyclient.StopServerPushback:
				cl.DeadLetterPushback++
			default:
				cl.DeadLetterExhausted++
			}
		case policyclient.CircuitOpen:
			cl.CircuitOpen++
		case policyclient.DeadlineCut:
			cl.DeadlineCut++
		}
		k := [2]string{r.Disposition.String(), r.StopReason.String()}
		row := rows[k]
		if row == nil {
			row = &dispositionRow{Disposition: k[0], StopReason: k[1], LastFailures: map[string]int{}}
			rows[k] = row
		}
		row.Docs++
		row.Attempts += len(tr.Attempts)
		if r.Reason != "" {
			row.LastFailures[r.Reason]++
		}
		for _, a := range tr.Attempts {
			if a.AfterCooldown {
				released = append(released, a.At)
			}
			switch a.Outcome {
			case "refused":
				sum.Upstream.ConnectionsRefused++
			case "timeout":
				sum.Upstream.Timeouts++
			}
		}
		if r.Disposition == policyclient.CircuitOpen {
			sv.CircuitOpenDocs++
			sv.CircuitOpenCalls += len(tr.Attempts)
			if len(tr.Attempts) == 0 {
				sv.RefusedBeforeCall++
			} else {
				sv.StoppedAfterCall++
			}
			if strings.HasPrefix(r.Reason, "breaker:") { // refused at admission, not by NextDelay
				refusedAtAdmit++
			}
		}
		sv.CooldownWaits += tr.CooldownWaits
		cooldownWait += tr.CooldownWait
		if tr.Start >= outStart && tr.Start < outEnd {
			sv.DocsInOutage++
			sv.NaiveCalls += naiveCalls(tr.Start, outEnd, p)
			for _, a := range tr.Attempts {
				if a.At < outEnd {
					sv.ActualCalls++
				}
			}
		}
	}
	sv.CircuitOpenNotMade = p.MaxAttempts*sv.CircuitOpenDocs - sv.CircuitOpenCalls
	sv.FastFails = st.FastFails
	sv.AdmitRefusals = refusedAtAdmit - int(st.FastFails)
	sv.NextDelayStops = sv.CircuitOpenDocs - refusedAtAdmit
	sv.NaiveSchedule = naiveSchedule(p)
	sv.SavedCalls = sv.NaiveCalls - sv.ActualCalls
	sv.CooldownWaitSeconds = cooldownWait.Seconds()
	slices.Sort(released)
	for i, j := 0, 0; j < len(released); j++ {
		for released[j]-released[i] > burstSpan {
			i++
		}
		if j-i+1 > sv.CooldownBurst {
			sv.CooldownBurst, sv.CooldownBurstAt = j-i+1, released[i].Seconds()
		}
	}
	sum.ClientLedger = cl
	sum.LedgerMatches = cl == sum.Ledger.counts()

	order := map[string]int{"succeeded": 0, "failed_terminal": 1, "dead_letter": 2, "deadline_cut": 3, "circuit_open": 4}
	for _, row := range rows {
		sum.Dispositions = append(sum.Dispositions, *row)
	}
	slices.SortFunc(sum.Dispositions, func(a, b dispositionRow) int {
		if c := order[a.Disposition] - order[b.Disposition]; c != 0 {
			return c
		}
		return strings.Compare(a.StopReason, b.StopReason)
	})

	w.mu.Lock()
	sum.Breaker = demoBreaker{Transitions: slices.Clone(w.transitions), Cooldowns: slices.Clone(w.cooldowns)}
	w.mu.Unlock()
	for _, t := range sum.Breaker.Transitions {
		if t.To == "OPEN" {
			sum.Breaker.Opened++
		}
	}
}

// naiveCalls is how many calls a naive loop (p.MaxAttempts attempts at the
// policy's nominal backoff, no jitter, no breaker) makes for a document
// started at start before the outage ends at end. Outage answers are
// immediate, so each attempt starts one nominal delay after the previous.
func naiveCalls(start, end time.Duration, p demoPolicy) int {
	n, at, delay := 0, start, p.Base
	for range p.MaxAttempts {
		if at < end {
			n++
		}
		at += delay
		delay = min(2*delay, p.Cap)
	}
	return n
}

// naiveSchedule describes naiveCalls' attempt times, e.g. "t, t+200ms, t+600ms".
func naiveSchedule(p demoPolicy) string {
	parts := []string{"t"}
	at, delay := time.Duration(0), p.Base
	for range p.MaxAttempts - 1 {
		at += delay
		delay = min(2*delay, p.Cap)
		parts = append(parts, "t+"+at.String())
	}
	return strings.Join(parts, ", ")
}

func (s *demoSummary) print(w io.Writer) {
	l, c, sv, u := s.Ledger, s.Client, s.Saved, s.Upstream
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "NO"
	}
	fmt.Fprintf(w, "\nRun reconciliation (AdminService.GetRun %s)\n", s.RunID)
	for _, r := range []struct {
		name string
		v    uint64
		note string
	}{
		{"succeeded", l.Succeeded, ""}, {"failed terminal", l.FailedTerminal, ""},
		{"dead letter: attempts exhausted", l.DeadLetterExhausted, ""}, {"dead letter: budget", l.DeadLetterBudget, ""},
		{"dead letter: not idempotent", l.DeadLetterNotIdempotent, ""}, {"dead letter: server pushback", l.DeadLetterPushback, ""},
		{"circuit open", l.CircuitOpen, ""}, {"deadline cut", l.DeadlineCut, ""},
		{"total", l.total(), fmt.Sprintf("  (of %d documents)", s.Docs)},
		{"retries spent", l.RetriesSpent, fmt.Sprintf("  (of a pool of %d)", l.RetryPool)},
	} {
		fmt.Fprintf(w, "  %-32s %6d%s\n", r.name, r.v, r.note)
	}
	fmt.Fprintf(w, "  every count equals the workers' own Results: %s\n", yes(s.LedgerMatches))
	if !s.LedgerMatches {
		fmt.Fprintf(w, "  the workers counted %+v\n", s.ClientLedger)
	}

	fmt.Fprintf(w, "\nFinal dispositions (policyclient Results, one per document)\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  DISPOSITION\tSTOP REASON\tDOCS\tUPSTREAM CALLS\tLAST FAILURE OR REFUSAL (docs)")
	total := 0
	for _, r := range s.Dispositions {
		total += r.Docs
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\n", r.Disposition, orDash(r.StopReason), r.Docs, r.Attempts, histogram(r.LastFailures))
	}
	fmt.Fprintf(tw, "  total\t\t%d\t%d\t\n", total, c.Attempts)
	tw.Flush()

	inOutage := 0
	for _, t := range s.Breaker.Transitions {
		if t.To == "OPEN" && t.At >= u.OutageStart && t.At <= u.OutageEnd {
			inOutage++
		}
	}
	fmt.Fprintf(w, "\nBreaker %s/%s (WatchBreakers): opened %s, %d of them during the outage\n",
		s.Policy.Tenant, s.Policy.Target, plural(s.Breaker.Opened, "time"), inOutage)
	var steps []string
	for _, t := range s.Breaker.Transitions {
		steps = append(steps, fmt.Sprintf("%.1fs %s", t.At, t.To))
	}
	if len(steps) > 0 {
		fmt.Fprintf(w, "  %s\n", strings.Join(steps, " -> "))
	}

	uc := u.Counts
	fmt.Fprintf(w, "\nUpstream (counted by the fake server; refusals and timeouts by the workers)\n")
	fmt.Fprintf(w, "  requests   %d: 200 x %d, 200 replayed x %d, 429 x %d (Retry-After windows opened: %d), 503 flaky x %d,\n"+
		"             503 outage x %d, 400 x %d, hung x %d\n", uc.Requests, uc.OK, uc.Replays, uc.Throttled, uc.RateWindows,
		uc.Flaky503, uc.Outage503, uc.BadRequest, uc.Hung)
	fmt.Fprintf(w, "  workers    connections refused while the port was closed: %d; attempts timed out (%gs): %d\n",
		u.ConnectionsRefused, s.Policy.AttemptTimeoutSeconds, u.Timeouts)
	fmt.Fprintf(w, "  writes     applied: %d, applied twice: %d; retries of a write applied before its answer was lost,\n"+
		"             answered from the idempotency-key cache instead of writing again: %d\n",
		uc.WritesApplied, uc.DuplicateWrites, uc.Replays)

	fmt.Fprintf(w, "\nUpstream calls the breaker and the cool-down saved (all measured in this run)\n")
	fmt.Fprintf(w, "  breaker    %s ended CIRCUIT_OPEN having made %s; at %d attempts each they were\n"+
		"             allowed %d: %s not made. %d were refused before their first call, %d after a failed one.\n"+
		"             Of the refusals, %d were fast-fails from the client's WatchBreakers cache (Stats.FastFails:\n"+
		"             no RPC, no call), %d Admit refusals (OPEN, or every probe permit taken), %d NextDelay stops.\n",
		plural(sv.CircuitOpenDocs, "document"), plural(sv.CircuitOpenCalls, "call"), s.Policy.MaxAttempts,
		s.Policy.MaxAttempts*sv.CircuitOpenDocs, plural(sv.CircuitOpenNotMade, "call"), sv.RefusedBeforeCall, sv.StoppedAfterCall, sv.FastFails, sv.AdmitRefusals,
		sv.NextDelayStops)
	pct := 0.0
	if sv.NaiveCalls > 0 {
		pct = 100 * float64(sv.SavedCalls) / float64(sv.NaiveCalls)
	}
	fmt.Fprintf(w, "  outage     %.1fs-%.1fs (503, then connection refused): %s started in it. A naive loop\n"+
		"             (%d attempts at %s, no breaker) sends them %s before the outage\n"+
		"             ends; through policyd they sent %d: %d fewer (%.0f%%).\n",
		u.OutageStart, u.OutageEnd, plural(sv.DocsInOutage, "document"), s.Policy.MaxAttempts, sv.NaiveSchedule,
		plural(sv.NaiveCalls, "call"), sv.ActualCalls, sv.SavedCalls, pct)
	fmt.Fprintf(w, "  cool-down  Retry-After windows the upstream opened with a 429 (it answers 429 to every call inside\n"+
		"             one): %d. Attempts that waited at Admit for the fleet-wide cool-down instead of calling into a\n"+
		"             window: %d (%.1fs of waiting in all). Requests that arrived inside a window all the same: %d.\n",
		uc.RateWindows, sv.CooldownWaits, sv.CooldownWaitSeconds, uc.InsideWindow)
	if sv.CooldownBurst > 0 {
		fmt.Fprintf(w, "             The waiting attempts went out together when a cool-down ended: the largest burst was\n"+
			"             %d calls within %s, at %.1fs.\n", sv.CooldownBurst, burstSpan, sv.CooldownBurstAt)
	}

	fmt.Fprintf(w, "\nClient (policyclient Stats): %d calls, %d attempts, %d Admit RPCs, %d fast fails, %d local decisions, "+
		"%d outcomes sent, %d dropped\n", c.Calls, c.Attempts, c.AdmitRPCs, c.FastFails, c.LocalDecisions, c.OutcomesSent, c.OutcomesDropped)
	fmt.Fprintf(w, "The batch took %.1fs.\n", s.DurationSeconds)
}

// plural returns "1 call", "2 calls".
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// histogram prints counts as "a x 3, b x 1", largest first.
func histogram(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s (%d)", k, m[k])
	}
	return strings.Join(parts, ", ")
}
