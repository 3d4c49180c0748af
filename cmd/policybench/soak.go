package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// soakConfig is what `policybench soak` is told by its flags.
type soakConfig struct {
	Duration  time.Duration
	Warmup    time.Duration
	Callers   int
	Samples   int
	Tolerance float64
	Addr      string
	PID       int
	Metrics   string
	TokenFile string
	Spawn     spawnFlags
}

func soakCmd() *cobra.Command {
	var cfg soakConfig
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Run the mixed load for a long time and check policyd's memory and goroutines stay flat",
		Long: `soak runs the sweep's mix (Admit, NextDelay, batched ReportOutcome) with
--callers callers for --duration, sampling the daemon's memory
(/proc/<pid>/status: VmRSS, and RssAnon, its heap and stacks without the
mapped state file) and goroutines (go_goroutines from its metrics endpoint).
It passes when, at the end, RssAnon and goroutines are within --tolerance
times their value after --warmup (goroutines: plus 10); VmRSS is judged
too unless the state file grew (its mapped pages count in VmRSS).

By default it builds and starts its own policyd (--sync, --flush-interval);
with --addr it attaches to a running one instead (give --pid and --metrics).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Spawn.Spawn = !cmd.Flags().Changed("addr")
			return runSoak(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.DurationVar(&cfg.Duration, "duration", 10*time.Minute, "how long to run, warm-up included")
	f.DurationVar(&cfg.Warmup, "warmup", 30*time.Second, "time before the reference sample")
	f.IntVar(&cfg.Callers, "callers", 16, "concurrent callers")
	f.IntVar(&cfg.Samples, "samples", 10, "samples after the warm-up")
	f.Float64Var(&cfg.Tolerance, "tolerance", 1.5, "most the end sample may be, as a multiple of the post-warm-up one")
	f.StringVar(&cfg.Addr, "addr", "", "attach to the policyd at this address instead of starting one")
	f.IntVar(&cfg.PID, "pid", 0, "with --addr: policyd's process id (0: find the process listening on --addr)")
	f.StringVar(&cfg.Metrics, "metrics", "", "with --addr: policyd's --metrics-listen address, for goroutines")
	f.StringVar(&cfg.TokenFile, "token-file", "", "with --addr: admin token file, to set up budgets and policies")
	f.StringVar(&cfg.Spawn.Policyd, "policyd", "", "policyd binary (default: go build ./cmd/policyd)")
	f.StringVar(&cfg.Spawn.Sync, "sync", "group", "policyd's --sync when started here")
	f.DurationVar(&cfg.Spawn.FlushInterval, "flush-interval", 100*time.Millisecond, "policyd's --flush-interval when started here")
	return cmd
}

type soakSample struct {
	at         time.Duration
	mem        memStatus
	goroutines float64
	rpcs       float64
	dbBytes    int64
}

func runSoak(ctx context.Context, cfg soakConfig, out io.Writer) error {
	if cfg.Warmup >= cfg.Duration || cfg.Samples < 1 || cfg.Callers < 1 {
		return errors.New("need --warmup < --duration, --samples >= 1, --callers >= 1")
	}
	db := ""
	if cfg.Spawn.Spawn {
		d, cleanup, err := cfg.Spawn.start()
		if err != nil {
			return err
		}
		defer cleanup()
		cfg.Addr, cfg.PID, cfg.Metrics, cfg.TokenFile, db = d.addr, d.pid(), d.metrics, d.db+".admin-token", d.db
	}
	if cfg.PID == 0 {
		cfg.PID = pidListening(cfg.Addr)
	}
	if cfg.PID == 0 {
		return errors.New("policyd's pid unknown: pass --pid")
	}
	metrics := metricsURL(cfg.Metrics)
	conn, err := dial(cfg.Addr, "")
	if err != nil {
		return err
	}
	defer conn.Close()
	workers := pb.NewRetryPolicyServiceClient(conn)
	if err := waitReady(ctx, workers); err != nil {
		return err
	}
	if cfg.TokenFile != "" {
		tok, err := readToken(cfg.TokenFile)
		if err != nil {
			return err
		}
		aconn, err := dial(cfg.Addr, tok)
		if err != nil {
			return err
		}
		err = setupWorkload(ctx, pb.NewAdminServiceClient(aconn))
		aconn.Close()
		if err != nil {
			return err
		}
	}
	sample := func(at time.Duration) soakSample {
		s := soakSample{at: at, goroutines: -1, rpcs: -1, dbBytes: -1}
		s.mem, _ = readMem(cfg.PID)
		if metrics != "" {
			if m, err := scrape(ctx, metrics, "go_goroutines", "policyd_rpc_duration_seconds_count"); err == nil {
				if v, ok := m["go_goroutines"]; ok {
					s.goroutines = v
				}
				if v, ok := m["policyd_rpc_duration_seconds_count"]; ok {
					s.rpcs = v
				}
			}
		}
		if db != "" {
			if st, err := os.Stat(db); err == nil {
				s.dbBytes = st.Size()
			}
		}
		return s
	}

	fmt.Fprintf(out, "soak: policyd %s pid %d, %d callers for %s (warm-up %s)\n", cfg.Addr, cfg.PID, cfg.Callers, cfg.Duration, cfg.Warmup)
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration+time.Minute)
	defer cancel()
	lctx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var on atomic.Bool
	on.Store(true)
	begin := time.Now()
	samples := []soakSample{sample(0)}
	callers := make([]*caller, cfg.Callers)
	for i := range callers {
		c := &caller{g: newGen(i, 5), on: &on}
		callers[i] = c
		wg.Add(1)
		go func() { defer wg.Done(); mixLoop(lctx, c, workers) }()
	}
	sleepCtx(ctx, cfg.Warmup)
	samples = append(samples, sample(time.Since(begin)))
	step := (cfg.Duration - cfg.Warmup) / time.Duration(cfg.Samples)
	for i := 1; i <= cfg.Samples && ctx.Err() == nil; i++ {
		sleepCtx(ctx, begin.Add(cfg.Warmup+time.Duration(i)*step).Sub(time.Now()))
		samples = append(samples, sample(time.Since(begin)))
	}
	on.Store(false)
	stopLoad()
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}

	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "t\tVmRSS\tRssAnon\tRssFile\tgoroutines\tthreads\tRPCs/s since last\tstate file\t")
	for i, s := range samples {
		rate := "-"
		if i > 0 && s.rpcs >= 0 && samples[i-1].rpcs >= 0 {
			rate = fmt.Sprintf("%.0f", (s.rpcs-samples[i-1].rpcs)/(s.at-samples[i-1].at).Seconds())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.0f\t%d\t%s\t%s\t\n", s.at.Round(time.Second), mib(s.mem.VmRSS), mib(s.mem.RssAnon),
			mib(s.mem.RssFile), s.goroutines, s.mem.Threads, rate, mib(s.dbBytes))
	}
	tw.Flush()
	ref, last := samples[1], samples[len(samples)-1]
	var fails []string
	check := func(what string, got, ref, slack float64, judged bool) bool {
		verdict := "ok"
		flat := got <= ref*cfg.Tolerance+slack
		switch {
		case !flat && judged:
			verdict = "FAIL"
			fails = append(fails, what)
		case !flat:
			verdict = "grew"
		}
		fmt.Fprintf(out, "%-11s after warm-up %.1f, end %.1f (%.2fx): %s\n", what, ref, got, got/max(ref, 1), verdict)
		return flat
	}
	// VmRSS counts the pages of the state file bbolt maps, which grow with
	// the file (the audit trail, up to --audit-max-records) and are page
	// cache, not the daemon's memory: it is judged only when the file did
	// not grow. RssAnon (heap and stacks) is what a leak would grow.
	fileGrew := last.dbBytes > ref.dbBytes*11/10 || (last.dbBytes < 0 && last.mem.RssFile > ref.mem.RssFile*11/10)
	if !check("VmRSS MiB", float64(last.mem.VmRSS)/(1<<20), float64(ref.mem.VmRSS)/(1<<20), 0, !fileGrew) {
		fmt.Fprintf(out, "            (the mapped state file grew: RssFile %s -> %s, file %s -> %s; not counted as a leak)\n",
			mib(ref.mem.RssFile), mib(last.mem.RssFile), mib(ref.dbBytes), mib(last.dbBytes))
	}
	check("RssAnon MiB", float64(last.mem.RssAnon)/(1<<20), float64(ref.mem.RssAnon)/(1<<20), 0, true)
	if last.goroutines >= 0 {
		check("goroutines", last.goroutines, ref.goroutines, 10, true)
	} else {
		fmt.Fprintln(out, "goroutines: unknown (no --metrics)")
	}
	var calls, failed uint64
	var firstErr error
	for _, c := range callers {
		for r := range numRPC {
			if c.hists[r] != nil {
				calls += c.hists[r].n
			}
			failed += c.errs[r]
		}
		if firstErr == nil {
			firstErr = c.firstErr
		}
	}
	fmt.Fprintf(out, "RPCs answered %d, failed %d", calls, failed)
	if firstErr != nil {
		fmt.Fprintf(out, " (first: %v)", firstErr)
	}
	fmt.Fprintln(out)
	if len(fails) > 0 {
		return fmt.Errorf("soak: not flat: %v", fails)
	}
	fmt.Fprintln(out, "soak: flat (pass)")
	return nil
}

func mib(b int64) string {
	if b < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20))
}
