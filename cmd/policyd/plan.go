package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/policy"
)

// planJSON is the --json shape of `policyd plan`.
type planJSON struct {
	Window                float64    `json:"window_seconds"`
	MaxAttempts           int        `json:"max_attempts"`
	TotalSeconds          float64    `json:"total_seconds"`
	IdempotencyTTLSeconds float64    `json:"idempotency_ttl_seconds"`
	DelaysSeconds         []float64  `json:"delays_seconds"`
	Hops                  []planJSON `json:"hops,omitempty"`
}

func toPlanJSON(p policy.Plan) planJSON {
	out := planJSON{
		Window: p.Window.Seconds(), MaxAttempts: p.MaxAttempts, TotalSeconds: p.WorstCase.Seconds(),
		IdempotencyTTLSeconds: p.IdempotencyTTL.Seconds(), DelaysSeconds: make([]float64, len(p.Delays)),
	}
	for i, d := range p.Delays {
		out.DelaysSeconds[i] = d.Seconds()
	}
	return out
}

func planCmd() *cobra.Command {
	var (
		in      policy.PlanInput
		hops    int
		asJSON  bool
		attempt int
	)
	def := policy.Default().Backoff
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Plan retries into a time window (offline)",
		Long: `Plan the largest number of attempts whose nominal delays plus per-attempt
timeouts fit --window, the schedule, the worst case, and the idempotency-key
TTL (window + --ttl-margin, never jittered). Jitter never raises a delay above
its nominal value, so the plan is a safe upper bound.

Example: policyd plan --window 72h --base 2s --factor 2 --cap 1h --attempt-timeout 30s --ttl-margin 6h`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in.MaxAttempts = attempt
			if err := in.Validate(); err != nil {
				return flagError(err)
			}
			if hops < 0 || hops > 16 {
				return fmt.Errorf("--hops: must be 0 to 16, got %d", hops)
			}
			var plans []policy.Plan
			if hops > 1 {
				ps, err := policy.SplitHops(in, hops)
				if err != nil {
					return flagError(err)
				}
				plans = ps
			} else {
				p, err := policy.PlanBudget(in)
				if err != nil {
					return flagError(err)
				}
				plans = []policy.Plan{p}
			}
			if asJSON {
				out := toPlanJSON(plans[0])
				if len(plans) > 1 {
					for _, p := range plans {
						out.Hops = append(out.Hops, toPlanJSON(p))
					}
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			for i, p := range plans {
				if len(plans) > 1 {
					fmt.Fprintf(cmd.OutOrStdout(), "hop %d\n", i+1)
				}
				printPlan(cmd.OutOrStdout(), p)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&in.Window, "window", 0, "time the whole call may take (required)")
	f.DurationVar(&in.Backoff.Base, "base", def.Base, "nominal delay before the first retry")
	f.Float64Var(&in.Backoff.Factor, "factor", def.Factor, "delay multiplier per retry (> 1)")
	f.DurationVar(&in.Backoff.Max, "cap", def.Max, "largest nominal delay")
	f.DurationVar(&in.AttemptTimeout, "attempt-timeout", 0, "timeout reserved for every attempt")
	f.DurationVar(&in.TTLMargin, "ttl-margin", 0, "added to the window for the idempotency-key TTL")
	f.IntVar(&attempt, "max-attempts", 0, "cap on attempts (0: up to 100)")
	f.IntVar(&hops, "hops", 0, "split the window over this many chained hops")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	_ = cmd.MarkFlagRequired("window")
	return cmd
}

// flagError names the flag behind a policy field error.
func flagError(err error) error {
	fe, ok := err.(*policy.FieldError)
	if !ok {
		return err
	}
	flags := map[string]string{
		"window": "--window", "backoff.base_delay": "--base", "backoff.factor": "--factor",
		"backoff.max_delay": "--cap", "attempt_timeout": "--attempt-timeout",
		"ttl_margin": "--ttl-margin", "max_attempts": "--max-attempts",
	}
	if f, ok := flags[fe.Field]; ok {
		return fmt.Errorf("%s: %s", f, fe.Rule)
	}
	return err
}

func printPlan(w io.Writer, p policy.Plan) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "window\t%s\n", p.Window)
	fmt.Fprintf(tw, "max attempts\t%d\n", p.MaxAttempts)
	fmt.Fprintf(tw, "worst case (nominal)\t%s\n", p.WorstCase)
	fmt.Fprintf(tw, "idempotency-key TTL\t%s\n", p.IdempotencyTTL)
	var at time.Duration
	for i, d := range p.Delays {
		at += d
		fmt.Fprintf(tw, "  retry %d\twait %s\t(waits so far %s)\n", i+1, d, at)
	}
	tw.Flush()
}
