// Command policyd-demo works a batch of documents against a fake flaky
// HTTP API on loopback, with policyd deciding every retry, and prints the
// run's reconciliation:
//
//	go run ./cmd/policyd-demo
//
// It embeds policyd through server.Server on a temporary state file, or
// uses a running one (--addr). Its parts: the scenario (scenario.go), the
// fake upstream (upstream.go), the breaker watcher (watcher.go), the
// summary (summary.go) and its printing (print.go). It lives apart from
// the daemon so the production binary links none of it.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

func main() {
	if err := demoCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "policyd-demo:", err)
		os.Exit(1)
	}
}

func demoCmd() *cobra.Command {
	cfg := defaultDemoConfig()
	cmd := &cobra.Command{
		Use:   "policyd-demo",
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
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
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
				return errors.New("the run's ledger does not match the workers' results")
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Docs, "docs", cfg.Docs, "documents in the batch")
	f.IntVar(&cfg.Workers, "workers", cfg.Workers, "concurrent workers")
	f.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the documents and of the upstream's faults")
	f.StringVar(&cfg.Addr, "addr", "", "use the policyd at this address instead of one started in the demo process (several replicas of one store: comma-separated)")
	f.BoolVar(&cfg.JSON, "json", false, "print the summary as JSON (progress goes to stderr)")
	f.DurationVar(&cfg.Cutoff, "cutoff", cfg.Cutoff, "the run's cut-off, from its opening")
	return cmd
}
