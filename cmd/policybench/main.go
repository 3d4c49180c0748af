// Command policybench is policyd's proof tooling: a load generator that
// compares a running daemon to a bare gRPC echo on the same machine, and
// the crash, disk-full and soak tests. Everything runs on loopback, is
// bounded in time, and stops by itself.
//
//	go run ./cmd/policybench --addr 127.0.0.1:50051 --token-file policyd.db.admin-token
//	go run ./cmd/policybench --spawn --sync always
//	go run ./cmd/policybench crash --duration 60s
//	go run ./cmd/policybench diskfull
//	go run ./cmd/policybench adaptive
//	go run ./cmd/policybench soak --duration 10m
//	go run ./cmd/policybench flow
//	go run ./cmd/policybench replicas
//	go run ./cmd/policybench replicas-sweep
//	go run ./cmd/policybench escalate
//	go run ./cmd/policybench once --mode redis
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := rootCmd().ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "policybench:", err)
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	var cfg sweepConfig
	var spawn spawnFlags
	var conc []int
	cmd := &cobra.Command{
		Use:   "policybench",
		Short: "Measure policyd against a bare gRPC echo on the same machine",
		Long: `policybench drives a running policyd (--addr) with a mix of Admit, NextDelay
and batched ReportOutcome calls from several tenants to healthy and failing
targets, at each --concurrency level, over one connection. At every level it
measures a bare grpc-go echo server (unary and bidirectional streaming, 32-byte
messages, in a child process) the same way and prints each policyd figure
as a ratio to the echo: requests/s, p99 latency and server CPU per request
(read from /proc/<pid>/stat; --pid, else found from the listening socket).

Phases at each level: echo-unary, echo-stream, admit, nextdelay, report (each
callers doing only that call), admit-ceiling and admit-ceiling-report (Admit
to targets with a concurrency ceiling of 1000000, which never refuses, each
lease returned at once by ReleaseLease, or by a ReportOutcome of the
attempt's success carrying it), admit-ceiling-batch (leases returned as the
Go client returns them: one more caller sends in one ReportOutcome every
outcome the others queued, woken by each) and mix (a worker's loop: Admit,
on failure NextDelay, outcomes reported in batches). With --metrics (policyd's
--metrics-listen address) the report phase also gives commits/s and
outcomes per commit from policyd_store_commits_total.

--spawn builds policyd and runs it on a temporary file for the sweep, with
--sync and --flush-interval, so one command measures one durability mode.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Concurrency = conc
			if spawn.Spawn {
				d, cleanup, err := spawn.start()
				if err != nil {
					return err
				}
				defer cleanup()
				cfg.Addr, cfg.PID, cfg.Metrics, cfg.TokenFile = d.addr, d.pid(), d.metrics, d.db+".admin-token"
				cfg.Label = "spawned: sync=" + spawn.Sync + " flush-interval=" + spawn.FlushInterval.String()
			}
			return runSweep(cmd.Context(), cfg, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Addr, "addr", "127.0.0.1:50051", "policyd's gRPC address (loopback)")
	f.StringVar(&cfg.TokenFile, "token-file", "", "admin token file (the daemon writes <db>.admin-token) for setting up budgets and policies")
	f.IntVar(&cfg.PID, "pid", 0, "policyd's process id, for server CPU per request (0: find the process listening on --addr)")
	f.StringVar(&cfg.Metrics, "metrics", "", "policyd's --metrics-listen address (host:port or URL), for commits/s")
	f.IntSliceVar(&conc, "concurrency", []int{1, 16, 64, 256}, "concurrent callers, one level after another")
	f.DurationVar(&cfg.Duration, "duration", 5*time.Second, "measured time of each phase at each level")
	f.DurationVar(&cfg.Warmup, "warmup", time.Second, "unmeasured time before each phase")
	f.StringSliceVar(&cfg.Phases, "phases", allPhases, "phases to run at each level: "+strings.Join(allPhases, ","))
	f.BoolVar(&cfg.JSON, "json", false, "print a JSON document instead of the table")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the request mix")
	f.IntVar(&cfg.ReportBatch, "report-batch", defaultReportBatch, "outcomes per ReportOutcome (1..1000; the Go client's default batch size is 256)")
	cmd.AddCommand(flowCmd(), flowWorkerCmd())
	spawn.register(cmd)
	cmd.AddCommand(crashCmd(), diskfullCmd(), escalateCmd(), replicasCmd(), replicaSweepCmd(), soakCmd(), drainCmd(), slowWatchCmd(), profileServerCmd(), onceCmd(), onceWorkerCmd(), &cobra.Command{
		Use:    "echo-server",
		Short:  "Serve the bare gRPC echo on a loopback port (used by the sweep)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE:   func(*cobra.Command, []string) error { return runEchoServer() },
	})
	cmd.AddCommand(adaptiveCmd())
	return cmd
}

// spawnFlags start a policyd for the sweep.
type spawnFlags struct {
	Spawn         bool
	Policyd       string
	Sync          string
	FlushInterval time.Duration
}

func (s *spawnFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&s.Spawn, "spawn", false, "build and start policyd on a temporary file for this run (ignores --addr, --pid, --metrics, --token-file)")
	f.StringVar(&s.Policyd, "policyd", "", "with --spawn: the policyd binary to run (default: go build ./cmd/policyd)")
	f.StringVar(&s.Sync, "sync", "group", "with --spawn: policyd's --sync (group or always)")
	f.DurationVar(&s.FlushInterval, "flush-interval", 100*time.Millisecond, "with --spawn: policyd's --flush-interval")
}

func (s *spawnFlags) start() (*daemon, func(), error) {
	dir, err := os.MkdirTemp("", "policybench")
	if err != nil {
		return nil, nil, err
	}
	bin, err := policydBinary(s.Policyd, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	d, err := startDaemon(bin, dir+"/policyd.db", "--sync", s.Sync, "--flush-interval", s.FlushInterval.String())
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return d, func() { _ = d.stop(); os.RemoveAll(dir) }, nil
}
