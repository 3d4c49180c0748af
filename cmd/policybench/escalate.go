package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// escalateConfig is what `policybench escalate` is told by its flags.
type escalateConfig struct {
	Docs      int
	Workers   int
	FailRate  float64
	Latency   time.Duration
	Attempts  uint32
	Threshold uint32
	Seed      uint64
	Timeout   time.Duration
	Policyd   string
}

func escalateCmd() *cobra.Command {
	var cfg escalateConfig
	cmd := &cobra.Command{
		Use:   "escalate",
		Short: "Measure escalation to a fallback provider against a struggling primary",
		Long: `escalate starts policyd on a temporary file and two fake HTTP upstreams on
loopback: a primary that answers 503 (no pushback) to --fail-rate of its
requests, chosen at random, and a healthy fallback; both take --latency per
request. It sends --docs documents through the Go client's Transport with
--workers workers, twice, each run under a tenant of its own (fresh breakers,
an ample retry budget): without escalation (max_attempts --attempts, primary
only) and with fallback after_attempts 1 (and on_circuit_open). The client
sleeps the delays policyd hands out. For each run it prints the wall time,
the upstream calls made per target and the calls' dispositions. Each run is
bounded by --timeout.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runEscalate(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Docs, "docs", 300, "documents per run")
	f.IntVar(&cfg.Workers, "workers", 16, "concurrent workers")
	f.Float64Var(&cfg.FailRate, "fail-rate", 0.6, "share of the primary's answers that are 503")
	f.DurationVar(&cfg.Latency, "latency", 20*time.Millisecond, "each upstream's time per request")
	f.Uint32Var(&cfg.Attempts, "attempts", 3, "max_attempts of the primary's policy")
	f.Uint32Var(&cfg.Threshold, "breaker-threshold", 5, "consecutive failures that open a target's breaker (policyd's default: 5)")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the primary's failures")
	f.DurationVar(&cfg.Timeout, "timeout", 3*time.Minute, "most a run may take")
	f.StringVar(&cfg.Policyd, "policyd", "", "the policyd binary to run (default: go build ./cmd/policyd)")
	return cmd
}

// fakeUpstream is an HTTP upstream on loopback that fails a share of its
// requests with a 503 and counts what it answered.
type fakeUpstream struct {
	srv      *http.Server
	addr     string
	latency  time.Duration
	failRate float64
	mu       sync.Mutex
	rng      *rand.Rand
	calls    atomic.Int64
	failures atomic.Int64
}

func startFakeUpstream(failRate float64, latency time.Duration, seed uint64) (*fakeUpstream, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &fakeUpstream{addr: lis.Addr().String(), latency: latency, failRate: failRate, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	u.srv = &http.Server{Handler: u, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = u.srv.Serve(lis) }()
	return u, nil
}

func (u *fakeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.calls.Add(1)
	select {
	case <-time.After(u.latency):
	case <-r.Context().Done():
		return
	}
	u.mu.Lock()
	fail := u.rng.Float64() < u.failRate
	u.mu.Unlock()
	if fail {
		u.failures.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "struggling")
		return
	}
	io.WriteString(w, "ok")
}

func (u *fakeUpstream) close() { _ = u.srv.Close() }

// escalateRun is what one run measured.
type escalateRun struct {
	name            string
	wall            time.Duration
	primary, backup int64 // upstream calls
	primaryFailed   int64
	dispositions    map[policyclient.Disposition]int
	fallbacks       int64 // EventFallbackTaken
	unfinished      int   // documents the run's timeout cut
}

func runEscalate(ctx context.Context, cfg escalateConfig, out io.Writer) error {
	if cfg.Docs < 1 || cfg.Workers < 1 || cfg.FailRate < 0 || cfg.FailRate > 1 || cfg.Attempts < 2 {
		return errors.New("escalate: --docs and --workers must be >= 1, --fail-rate in [0, 1], --attempts >= 2")
	}
	d, err := spawn(ctx, "escalate", cfg.Policyd)
	if err != nil {
		return err
	}
	defer d.close()
	admin := pb.NewAdminServiceClient(d.conn)

	runs := []struct {
		name, tenant string
		fallback     *pb.FallbackSettings
	}{
		{"no escalation", "esc-off", nil},
		{"fallback after 1 attempt", "esc-on", &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1, OnCircuitOpen: true}},
	}
	var results []escalateRun
	for i, r := range runs {
		if _, err := admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{
			Tenant: r.tenant, Capacity: 1e6, MinRetriesPerSecond: 1e4}}); err != nil {
			return fmt.Errorf("SetTenantBudget: %w", err)
		}
		p := &pb.Policy{MaxAttempts: &cfg.Attempts, Breaker: &pb.BreakerSettings{ConsecutiveFailures: &cfg.Threshold}, Fallback: r.fallback}
		if _, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: r.tenant, Target: "geo-a", Policy: p}); err != nil {
			return fmt.Errorf("SetPolicy: %w", err)
		}
		res, err := escalateOnce(ctx, cfg, d.addr, r.tenant, cfg.Seed+uint64(i))
		if err != nil {
			return err
		}
		res.name = r.name
		results = append(results, res)
	}

	fmt.Fprintf(out, "escalate: %d documents, %d workers, primary fails %.0f%% (503, no pushback), fallback healthy, "+
		"%s per upstream request, max_attempts %d, breaker threshold %d\n\n",
		cfg.Docs, cfg.Workers, 100*cfg.FailRate, cfg.Latency, cfg.Attempts, cfg.Threshold)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tWALL\tPRIMARY CALLS (503)\tFALLBACK CALLS\tFALLBACKS TAKEN\tSUCCEEDED\tDEAD_LETTER\tCIRCUIT_OPEN\tOTHER\tUNFINISHED")
	for _, r := range results {
		other := 0
		for disp, n := range r.dispositions {
			if disp != policyclient.Succeeded && disp != policyclient.DeadLetter && disp != policyclient.CircuitOpen {
				other += n
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d (%d)\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", r.name, r.wall.Round(10*time.Millisecond),
			r.primary, r.primaryFailed, r.backup, r.fallbacks, r.dispositions[policyclient.Succeeded],
			r.dispositions[policyclient.DeadLetter], r.dispositions[policyclient.CircuitOpen], other, r.unfinished)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// What policyd advises from the runs' attempt statistics, as `policyd
	// advise` says it.
	for _, r := range runs {
		adv, err := admin.AdviseTargets(ctx, &pb.AdviseTargetsRequest{Tenant: r.tenant, Since: durationpb.New(time.Hour)})
		if err != nil {
			return fmt.Errorf("AdviseTargets: %w", err)
		}
		for _, a := range adv.GetAdvice() {
			fmt.Fprintf(out, "\nadvice %s/%s: successes by attempt %v, failures by attempt %v\n  %s\n  %s\n",
				a.GetTenant(), a.GetTarget(), trimCounts(a.GetSuccessesByAttempt()), trimCounts(a.GetFailuresByAttempt()),
				a.GetSummary(), a.GetRecommendation())
			for _, c := range a.GetChanges() {
				fmt.Fprintf(out, "  proposed: %s\n", c)
			}
		}
	}
	return nil
}

// trimCounts drops the trailing zeros of counts by attempt.
func trimCounts(c []uint64) []uint64 {
	for len(c) > 1 && c[len(c)-1] == 0 {
		c = c[:len(c)-1]
	}
	return c
}

// escalateOnce sends cfg.Docs documents for tenant through a fresh Go
// client and two fresh upstreams, and measures the run.
func escalateOnce(ctx context.Context, cfg escalateConfig, addr, tenant string, seed uint64) (escalateRun, error) {
	primary, err := startFakeUpstream(cfg.FailRate, cfg.Latency, seed)
	if err != nil {
		return escalateRun{}, err
	}
	defer primary.close()
	backup, err := startFakeUpstream(0, cfg.Latency, seed)
	if err != nil {
		return escalateRun{}, err
	}
	defer backup.close()
	conn, err := dial(addr, "")
	if err != nil {
		return escalateRun{}, err
	}
	defer conn.Close()
	var mu sync.Mutex
	res := escalateRun{dispositions: map[policyclient.Disposition]int{}}
	c, err := policyclient.New(conn, policyclient.Config{Tenant: tenant, Logger: discardLogger,
		OnEvent: func(e policyclient.Event) {
			switch e.Kind {
			case policyclient.EventCallEnded:
				mu.Lock()
				res.dispositions[e.Disposition]++
				mu.Unlock()
			case policyclient.EventFallbackTaken:
				mu.Lock()
				res.fallbacks++
				mu.Unlock()
			}
		}})
	if err != nil {
		return escalateRun{}, err
	}
	hc := &http.Client{Transport: &policyclient.Transport{Client: c,
		Call: func(r *http.Request) policyclient.Call {
			return policyclient.Call{Target: "geo-a", SubmissionID: r.URL.Query().Get("doc"), Idempotent: true}
		},
		Hosts: map[string]string{"geo-a": primary.addr, "geo-b": backup.addr}}}
	rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	docs := make(chan int)
	var done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range docs {
				req, _ := http.NewRequestWithContext(rctx, http.MethodGet, fmt.Sprintf("http://%s/geocode?doc=doc-%d", primary.addr, i), nil)
				if resp, err := hc.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if rctx.Err() == nil {
					done.Add(1)
				}
			}
		}()
	}
feed:
	for i := range cfg.Docs {
		select {
		case docs <- i:
		case <-rctx.Done():
			break feed
		}
	}
	close(docs)
	wg.Wait()
	res.wall = time.Since(start)
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	_ = c.Close(cctx)
	ccancel()
	res.primary, res.primaryFailed, res.backup = primary.calls.Load(), primary.failures.Load(), backup.calls.Load()
	res.unfinished = cfg.Docs - int(done.Load())
	return res, nil
}
