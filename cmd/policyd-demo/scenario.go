package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// demoConfig is everything `policyd-demo` is told by its flags, plus the
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
		if opts, err = adminCredentials("policyd.db.admin-token"); err != nil {
			return nil, err
		}
	}
	conn, err := dialPolicyd(addr, opts...)
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
	// Each write is sent again while policyd answers UNAVAILABLE: a
	// replica on Redis refuses admin writes while it cannot reach Redis
	// (a store timeout on a loaded machine is enough). Each may run twice:
	// the policy and the reset are the same again, and a run opened by a
	// try whose answer was lost is there (ALREADY_EXISTS: read it).
	err := again(ctx, func() error {
		_, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: cfg.Tenant, Target: cfg.Target, Policy: pol},
			grpc.WaitForReady(true))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("SetPolicy: %w", err)
	}
	key := &pb.BreakerKey{Tenant: cfg.Tenant, Target: cfg.Target}
	err = again(ctx, func() error {
		_, err := admin.ResetBreaker(ctx, &pb.ResetBreakerRequest{Key: key})
		if status.Code(err) == codes.NotFound {
			return nil
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("ResetBreaker: %w", err)
	}
	id := fmt.Sprintf("demo-seed%d-%s", cfg.Seed, time.Now().UTC().Format("20060102T150405.000"))
	var run *pb.Run
	err = again(ctx, func() error {
		resp, err := admin.OpenRun(ctx, &pb.OpenRunRequest{
			RunId:       id,
			Tenant:      cfg.Tenant,
			RetryPool:   3 * uint64(cfg.Docs),
			CutoffTime:  timestamppb.New(time.Now().Add(cfg.Cutoff)),
			Description: fmt.Sprintf("policyd demo: %d documents, %d workers, seed %d", cfg.Docs, cfg.Workers, cfg.Seed),
		})
		if status.Code(err) == codes.AlreadyExists {
			var got *pb.GetRunResponse
			got, err = admin.GetRun(ctx, &pb.GetRunRequest{RunId: id})
			run = got.GetRun()
			return err
		}
		run = resp.GetRun()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("OpenRun: %w", err)
	}
	return run, nil
}

// again calls f until it returns something other than UNAVAILABLE, or
// ctx ends, pausing 100ms between tries.
func again(ctx context.Context, f func() error) error {
	for {
		err := f()
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return err
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return err
		}
	}
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

// dialPolicyd connects to addr, which may list several policyd replicas
// sharing one store, comma-separated: calls are then spread over them
// (gRPC round_robin) and move off a replica that stops answering.
func dialPolicyd(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	addrs := strings.Split(addr, ",")
	if len(addrs) == 1 {
		return grpc.NewClient(addr, opts...)
	}
	r := manual.NewBuilderWithScheme("policyd-demo")
	var st resolver.State
	for _, a := range addrs {
		st.Addresses = append(st.Addresses, resolver.Address{Addr: strings.TrimSpace(a)})
	}
	r.InitialState(st)
	opts = append(opts, grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	return grpc.NewClient(r.Scheme()+":///replicas", opts...)
}
