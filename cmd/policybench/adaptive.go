package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/adaptivesim"
)

// adaptiveConfig is `policybench adaptive`'s flags.
type adaptiveConfig struct {
	Policyd     string
	Duration    time.Duration
	Step        time.Duration
	Workers     int
	Capacity    int
	RetryAfter  string
	MaxInFlight uint32
}

func adaptiveCmd() *cobra.Command {
	var cfg adaptiveConfig
	cmd := &cobra.Command{
		Use:   "adaptive",
		Short: "Run the adaptive ceiling's scenario (issue 15) in real time against a spawned policyd",
		Long: `adaptive builds policyd (or runs --policyd), starts it on a temporary file,
sets an adaptive concurrency ceiling (at most --max-in-flight, the defaults
otherwise) and plays internal/adaptivesim's scenario in real time: --workers
simulated workers take leases, call a fake upstream that answers 429 with
Retry-After: --retry-after above --capacity concurrent requests, and report
what came of each attempt, in steps of --step (the time a request takes).
The server test TestAdaptiveCeilingSettles plays the same loop on a fake
clock. It prints the ceiling once a second and, for the second half of the
run, the ceiling's range and the share of requests answered 429, and exits
non-zero when that half misses the goal: the ceiling within [8, 14] and
under 2% answered 429.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runAdaptive(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Policyd, "policyd", "", "the policyd binary to run (default: go build ./cmd/policyd)")
	f.DurationVar(&cfg.Duration, "duration", 20*time.Second, "how long the scenario runs")
	f.DurationVar(&cfg.Step, "step", 100*time.Millisecond, "how long an upstream request takes; the step of the scenario")
	f.IntVar(&cfg.Workers, "workers", 48, "simulated workers")
	f.IntVar(&cfg.Capacity, "capacity", 12, "concurrent requests the fake upstream takes before it answers 429")
	f.StringVar(&cfg.RetryAfter, "retry-after", "0", "the Retry-After of the upstream's 429s, in seconds (a hint above 0 also sets the fleet cool-down)")
	f.Uint32Var(&cfg.MaxInFlight, "max-in-flight", 64, "the adaptive ceiling's maximum, where it starts")
	return cmd
}

// realClock is the scenario's time in real time: Advance waits until the
// next step's boundary, counted from the start, so a slow step does not
// push the later ones back.
type realClock struct {
	ctx  context.Context
	next time.Time
}

func (c *realClock) Now() time.Time { return time.Now() }

func (c *realClock) Advance(d time.Duration) {
	if c.next.IsZero() {
		c.next = time.Now()
	}
	c.next = c.next.Add(d)
	sleepCtx(c.ctx, time.Until(c.next))
}

func runAdaptive(ctx context.Context, cfg adaptiveConfig, out io.Writer) error {
	if cfg.Step <= 0 || cfg.Duration < cfg.Step {
		return fmt.Errorf("--step must be > 0 and at most --duration")
	}
	d, err := spawn(ctx, "adaptive", cfg.Policyd)
	if err != nil {
		return err
	}
	defer d.close()
	workers, admin := pb.NewRetryPolicyServiceClient(d.conn), pb.NewAdminServiceClient(d.conn)
	sim := adaptivesim.Config{Tenant: "bench", Target: "portal", Workers: cfg.Workers, Capacity: cfg.Capacity,
		RetryAfter: cfg.RetryAfter, Step: cfg.Step, Steps: int(cfg.Duration / cfg.Step)}
	maxInFlight := cfg.MaxInFlight
	if _, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: sim.Tenant, Target: sim.Target, Policy: &pb.Policy{
		Flow: &pb.FlowSettings{MaxInFlight: &maxInFlight, Adaptive: &pb.AdaptiveCeiling{}}}}); err != nil {
		return fmt.Errorf("SetPolicy: %w", err)
	}
	fmt.Fprintf(out, "adaptive ceiling: %d workers, upstream capacity %d (429 + Retry-After: %s above it), requests of %s, max_in_flight %d, %s in real time\n",
		sim.Workers, sim.Capacity, sim.RetryAfter, sim.Step, maxInFlight, cfg.Duration)
	samples, err := adaptivesim.Run(ctx, sim, workers, admin, &realClock{ctx: ctx})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%6s  %7s  %8s  %8s  %4s  %14s\n", "t", "ceiling", "adaptive", "requests", "429", "Admits refused")
	perSecond := max(int(time.Second/sim.Step), 1)
	for i := 0; i < len(samples); i += perSecond {
		var req, cong, ref int
		for _, s := range samples[i:min(i+perSecond, len(samples))] {
			req, cong, ref = req+s.Requests, cong+s.Congested, ref+s.Refused
		}
		last := samples[min(i+perSecond, len(samples))-1]
		fmt.Fprintf(out, "%6s  %7d  %8.2f  %8d  %4d  %14d\n", last.Elapsed.Round(100*time.Millisecond), last.Ceiling, last.Adaptive, req, cong, ref)
	}
	sum := adaptivesim.SecondHalf(samples)
	fmt.Fprintf(out, "second half: ceiling %d to %d, %d of %d requests answered 429 (%.2f%%), the upstream held at most %d at once\n",
		sum.Lo, sum.Hi, sum.Congested, sum.Requests, 100*sum.Share(), sum.MostInside)
	if sum.Lo < 8 || sum.Hi > 14 || sum.Share() >= 0.02 {
		return fmt.Errorf("goal missed: want the ceiling within [8, 14] and under 2%% answered 429 over the second half")
	}
	fmt.Fprintln(out, "goal met: the ceiling within [8, 14] and under 2% answered 429 over the second half")
	return nil
}
