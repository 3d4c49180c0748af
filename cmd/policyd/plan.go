package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// planJSON is the --json shape of `policyd plan`.
type planJSON struct {
	Window                float64    `json:"window_seconds"`
	RemainingSeconds      float64    `json:"remaining_seconds"`
	UsableSeconds         float64    `json:"usable_seconds"`
	MaxAttempts           int        `json:"max_attempts"`
	Reason                string     `json:"reason,omitempty"`
	TotalSeconds          float64    `json:"total_seconds"`
	IdempotencyTTLSeconds float64    `json:"idempotency_ttl_seconds"`
	DelaysSeconds         []float64  `json:"delays_seconds"`
	Hops                  []planJSON `json:"hops,omitempty"`
}

func toPlanJSON(p policy.Plan) planJSON {
	out := planJSON{
		Window: p.Window.Seconds(), RemainingSeconds: p.Remaining.Seconds(), UsableSeconds: p.Usable.Seconds(),
		MaxAttempts: p.MaxAttempts, Reason: p.Reason, TotalSeconds: p.WorstCase.Seconds(),
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
		origin  string
		now     string
	)
	def := policy.Default().Backoff
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Plan retries into a time window (offline)",
		Long: `Plan the largest number of attempts whose nominal delays plus per-attempt
timeouts fit --window, the schedule, the worst case, and the idempotency-key
TTL (window + --ttl-margin, never jittered). Jitter never raises a delay above
its nominal value, so the plan is a safe upper bound.

With --origin (when the window began, e.g. the event's timestamp) the plan
fits what is left of the window at --now (default: the clock); --reserve keeps
a fraction of it as headroom, so the schedule fits remaining * (1 - reserve).
A spent window plans no attempt and says why. Without --ttl-margin the margin
is the largest of --attempt-timeout, a tenth of the window and 1ms, so the TTL
always outlives the window.

Example: policyd plan --window 72h --base 2s --factor 2 --cap 1h --attempt-timeout 30s --ttl-margin 6h
         policyd plan --window 72h --attempt-timeout 30s --cap 1h --origin 2026-11-28T10:00:00Z --reserve 0.5`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in.MaxAttempts = attempt
			if err := planOrigin(&in, origin, now, nextSecond(time.Now())); err != nil {
				return err
			}
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
	f.StringVar(&origin, "origin", "", "when the window began (RFC 3339): plan what is left of it at --now")
	f.StringVar(&now, "now", "", "the time to plan at with --origin (RFC 3339; default: the clock)")
	f.Float64Var(&in.Reserve, "reserve", 0, "fraction of the remaining window kept as headroom, in [0, 1)")
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
		"ttl_margin": "--ttl-margin", "max_attempts": "--max-attempts", "reserve": "--reserve",
		"origin_time": "--origin",
	}
	if f, ok := flags[fe.Field]; ok {
		return fmt.Errorf("%s: %s", f, fe.Rule)
	}
	return err
}

// planOrigin sets in's origin and time of planning from --origin and --now
// (clock when empty), refusing an origin more than the daemon's default
// clock skew after it, as PlanBudget does.
func planOrigin(in *policy.PlanInput, origin, now string, clock time.Time) error {
	if origin == "" {
		if now != "" {
			return fmt.Errorf("--now: needs --origin")
		}
		return nil
	}
	var err error
	if in.Origin, err = time.Parse(time.RFC3339Nano, origin); err != nil {
		return fmt.Errorf("--origin: must be an RFC 3339 time, got %q", origin)
	}
	in.Now = clock
	if now != "" {
		if in.Now, err = time.Parse(time.RFC3339Nano, now); err != nil {
			return fmt.Errorf("--now: must be an RFC 3339 time, got %q", now)
		}
	}
	if ahead := in.Origin.Sub(in.Now); ahead > server.DefaultMaxClockSkew {
		return fmt.Errorf("--origin: must not be more than %s after --now, got %s ahead", server.DefaultMaxClockSkew, ahead)
	}
	return nil
}

// nextSecond rounds t up to a whole second: a plan against the clock is
// then printed in whole seconds and fits the window still (it counts a
// little more of it as spent, never less).
func nextSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); r.Before(t) {
		return r.Add(time.Second)
	}
	return t
}

func printPlan(w io.Writer, p policy.Plan) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "window\t%s\n", p.Window)
	if p.Remaining != p.Window || p.Usable != p.Remaining {
		fmt.Fprintf(tw, "remaining\t%s\n", p.Remaining)
		fmt.Fprintf(tw, "usable (less reserve)\t%s\n", p.Usable)
	}
	fmt.Fprintf(tw, "max attempts\t%d\n", p.MaxAttempts)
	if p.Reason != "" {
		fmt.Fprintf(tw, "no attempt\t%s\n", p.Reason)
	}
	fmt.Fprintf(tw, "worst case (nominal)\t%s\n", p.WorstCase)
	fmt.Fprintf(tw, "idempotency-key TTL\t%s\n", p.IdempotencyTTL)
	var at time.Duration
	for i, d := range p.Delays {
		at += d
		fmt.Fprintf(tw, "  retry %d\twait %s\t(waits so far %s)\n", i+1, d, at)
	}
	tw.Flush()
}
