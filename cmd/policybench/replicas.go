package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
)

// replicasConfig is what `policybench replicas` is told by its flags.
type replicasConfig struct {
	Policyd      string
	Demo         string
	StoreTimeout time.Duration
	Scenarios    []string
	Load         time.Duration // load before and after each fault
	Pause        time.Duration // how long Redis stays stopped
	Clients      int
	Keep         bool
	Godebug      string // each replica's GODEBUG
}

// allScenarios are the fault scenarios, in the order they run.
var allScenarios = []string{"kill-replica", "kill-redis", "stop-redis", "demo"}

func replicasCmd() *cobra.Command {
	var cfg replicasConfig
	cmd := &cobra.Command{
		Use:   "replicas",
		Short: "Three policyd replicas on one Redis under load, through four faults",
		Long: `replicas builds policyd, starts redis-server (appendonly yes, appendfsync
always) on a free loopback port in a temporary directory and three policyd
replicas on it (--store redis://...), drives load through them (Go clients,
each connection spread over the replicas by gRPC round_robin), and runs the
fault scenarios, each bounded in time, each printing its verdict:

  kill-replica  SIGKILL one replica under load: the calls go on through the
                other two. Counted: RPCs slower than the clients' decision
                timeout, RPC errors, and calls the Go client decided locally
                (Result.Local).
  kill-redis    SIGKILL Redis under load and admin writes, restart it on its
                AOF: every admin write (SetTenantBudget, DeleteTenantBudget,
                SetPolicy, ForceBreaker) and breaker transition acknowledged
                before the kill is found again, through every replica and in
                Redis itself; no acknowledged retry spend is refunded.
  stop-redis    SIGSTOP Redis for --pause under load (the mix, spenders of
                a budget and a run pool, and calls escalating to a fallback
                under concurrency ceilings, whose decisions take several
                engine calls): every decision counted as answered or
                failed, with its latency, the slowest named; after SIGCONT a
                tenant budget and a run pool that were spent throughout are
                not overspent, and the replicas agree on the breakers.
  demo          policyd-demo's batch (300 documents) through the three
                replicas and through one bbolt daemon: each run's ledger
                reconciles with what its workers saw.

It exits non-zero when a scenario finds a violation of a durability or
consistency rule; the latency goals are reported, not enforced.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReplicas(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Policyd, "policyd", "", "policyd binary (default: go build ./cmd/policyd)")
	f.StringVar(&cfg.Demo, "demo", "", "policyd-demo binary for the demo scenario (default: go build ./cmd/policyd-demo)")
	f.DurationVar(&cfg.StoreTimeout, "store-timeout", 50*time.Millisecond, "the replicas' --store-timeout")
	f.StringSliceVar(&cfg.Scenarios, "scenarios", allScenarios, "scenarios to run: "+strings.Join(allScenarios, ","))
	f.DurationVar(&cfg.Load, "load", 3*time.Second, "load before and after each fault")
	f.DurationVar(&cfg.Pause, "pause", 10*time.Second, "stop-redis: how long Redis stays stopped")
	f.IntVar(&cfg.Clients, "clients", 6, "Go clients (one connection each, over every replica) driving the load")
	f.BoolVar(&cfg.Keep, "keep", false, "keep the temporary directory (AOF, logs) at the end")
	f.StringVar(&cfg.Godebug, "replica-godebug", sysmonAwake, "each replica's GODEBUG (\"\": Go's default); the default keeps the runtime's sysmon out of its deep sleep")
	return cmd
}

func runReplicas(ctx context.Context, cfg replicasConfig, out io.Writer) error {
	for _, s := range cfg.Scenarios {
		if !slices.Contains(allScenarios, s) {
			return fmt.Errorf("--scenarios: unknown scenario %q (want some of %s)", s, strings.Join(allScenarios, ","))
		}
	}
	if cfg.Clients < 1 || cfg.Load <= 0 || cfg.Pause <= 0 {
		return errors.New("--clients must be >= 1, --load and --pause > 0")
	}
	// Every scenario is bounded; so is the whole run.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "policybench-replicas")
	if err != nil {
		return err
	}
	if !cfg.Keep {
		defer os.RemoveAll(dir)
	} else {
		fmt.Fprintln(out, "keeping", dir)
	}
	bin, err := policydBinary(cfg.Policyd, dir)
	if err != nil {
		return err
	}
	rt := defaultReplicaRuntime(3)
	rt.Godebug = cfg.Godebug
	fl, err := startFleet(ctx, dir, bin, 3, cfg.StoreTimeout, rt)
	if err != nil {
		return err
	}
	defer fl.stop()
	fmt.Fprintf(out, "replicas: redis-server %s (AOF always, pid %d); policyd replicas %s (--store-timeout %s, %s, pids %v)\n",
		fl.redis.addr(), fl.redis.pid(), fl.addrs(), cfg.StoreTimeout, rt, fl.pids())
	aconn, err := dial(fl.addrs(), fl.token)
	if err != nil {
		return err
	}
	defer aconn.Close()
	if err := crashSetup(ctx, pb.NewAdminServiceClient(aconn)); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	var failed []string
	defer func() { printStoreFailures(out, fl) }()
	for _, s := range cfg.Scenarios {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fmt.Fprintf(out, "\n== %s\n", s)
		var err error
		switch s {
		case "kill-replica":
			err = scenarioKillReplica(ctx, cfg, fl, out)
		case "kill-redis":
			err = scenarioKillRedis(ctx, cfg, fl, out)
		case "stop-redis":
			err = scenarioStopRedis(ctx, cfg, fl, out)
		case "demo":
			err = scenarioDemo(ctx, cfg, fl, dir, out)
		}
		if err != nil {
			fmt.Fprintf(out, "verdict: FAIL: %v\n", err)
			failed = append(failed, s)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("scenarios failed: %s", strings.Join(failed, ", "))
	}
	return nil
}

// clientLoad is Go clients calling through every replica: each client's
// connection is recorded by rec; calls counts Do calls and local those
// with a decision made without policyd.
type clientLoad struct {
	calls, local, failed atomic.Int64
	clients              []*policyclient.Client
	conns                []*grpc.ClientConn
	cancel               context.CancelFunc
	wg                   sync.WaitGroup
}

// decisionTimeout is the Go client's default DecisionTimeout, which the
// load's clients keep.
const decisionTimeout = 250 * time.Millisecond

// loadPace is the pause of a load worker between its calls: unpaced, the
// Go clients' cached CLOSED breakers let a worker make a call every few
// microseconds and the load generator takes the CPU the replicas need.
const loadPace = 2 * time.Millisecond

// startClientLoad starts n clients (tenants bench-t0..) with 4 workers
// each, calling targets of which 5% of attempts fail with a 503, one call
// every loadPace. The workers do not sleep the delays they are given.
func startClientLoad(ctx context.Context, n int, addrs string, rec *rpcRecorder) (*clientLoad, error) {
	ctx, cancel := context.WithCancel(ctx)
	l := &clientLoad{cancel: cancel}
	noSleep := func(ctx context.Context, _ time.Duration) error { return ctx.Err() }
	for i := range n {
		conn, err := dial(addrs, "", rec.interceptor())
		if err != nil {
			l.stop()
			return nil, err
		}
		l.conns = append(l.conns, conn)
		c, err := policyclient.New(conn, policyclient.Config{Tenant: tenantName(i % (benchTenants - 1)), Sleep: noSleep,
			Logger: discardLogger})
		if err != nil {
			l.stop()
			return nil, err
		}
		l.clients = append(l.clients, c)
		for w := range 4 {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				g := newGen(i*4+w, uint64(i))
				for seq := 0; ctx.Err() == nil; seq++ {
					target := healthyName(g.rng.IntN(benchHealthy))
					res, err := c.Do(ctx, policyclient.Call{Target: target, Idempotent: true,
						CallID: fmt.Sprintf("load-%d-%d-%x-%d", i, w, g.epoch, seq)},
						func(context.Context, policyclient.Attempt) error {
							if g.rng.Float64() < 0.05 {
								return policyclient.HTTPError(503, nil)
							}
							return nil
						})
					if err != nil || ctx.Err() != nil {
						continue
					}
					l.calls.Add(1)
					if res.Local {
						l.local.Add(1)
					}
					if !res.OK() {
						l.failed.Add(1)
					}
					sleepCtx(ctx, loadPace)
				}
			}()
		}
	}
	return l, nil
}

// stop ends the workers and closes the clients (flushing their outcomes).
func (l *clientLoad) stop() {
	l.cancel()
	l.wg.Wait()
	for _, c := range l.clients {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = c.Close(cctx)
		cancel()
	}
	for _, c := range l.conns {
		c.Close()
	}
}

// scenarioKillReplica SIGKILLs replica 0 under load and restarts it.
func scenarioKillReplica(ctx context.Context, cfg replicasConfig, fl *replicaFleet, out io.Writer) error {
	rec := newRPCRecorder(decisionTimeout, "before", "after")
	load, err := startClientLoad(ctx, cfg.Clients, fl.addrs(), rec)
	if err != nil {
		return err
	}
	sleepCtx(ctx, cfg.Load)
	callsBefore, localBefore := load.calls.Load(), load.local.Load()
	rec.next()
	victim := fl.reps[0]
	fmt.Fprintf(out, "SIGKILL replica %s (pid %d) under load from %d clients\n", victim.addr, victim.pid(), cfg.Clients)
	victim.kill()
	fl.gone = append(fl.gone, victim)
	fl.reps[0] = nil
	sleepCtx(ctx, cfg.Load)
	load.stop()
	callsAfter, localAfter := load.calls.Load()-callsBefore, load.local.Load()-localBefore
	fmt.Fprint(out, rec.summary("  "))
	fmt.Fprintf(out, "  Do calls before the kill %d (local decisions %d); after %d (local decisions %d)\n",
		callsBefore, localBefore, callsAfter, localAfter)
	_, errsAfter, slowAfter := rec.totals(1)
	if err := fl.startReplica(0); err != nil {
		return fmt.Errorf("restarting the killed replica: %w", err)
	}
	if callsAfter == 0 {
		return errors.New("no call finished after the kill")
	}
	goal := "met"
	if localAfter > 0 || slowAfter > 0 {
		goal = "NOT met"
	}
	fmt.Fprintf(out, "verdict: PASS: clients finished %d calls on the other two replicas; goal (no RPC over %v, zero local decisions) %s: %d slow, %d RPC errors, %d calls with a local decision\n",
		callsAfter, decisionTimeout, goal, slowAfter, errsAfter, localAfter)
	return nil
}

// scenarioKillRedis SIGKILLs Redis under load and admin writes, restarts
// it on its AOF and checks every acknowledged write.
func scenarioKillRedis(ctx context.Context, cfg replicasConfig, fl *replicaFleet, out io.Writer) error {
	m := &crashModel{budgets: map[string]float64{}, deleted: map[string]bool{}, policies: map[string]uint32{},
		open: map[string]bool{}, lowest: crashSpendCap}
	conn, err := dial(fl.addrs(), "")
	if err != nil {
		return err
	}
	defer conn.Close()
	aconn, err := dial(fl.addrs(), fl.token)
	if err != nil {
		return err
	}
	defer aconn.Close()
	workers, admin := pb.NewRetryPolicyServiceClient(conn), pb.NewAdminServiceClient(aconn)
	// The spender's level before this scenario: earlier ones may have spent.
	if st, err := admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: crashSpendTenant}); err == nil {
		m.lowest = st.GetStatus().GetTokens()
	}
	rec := newRPCRecorder(decisionTimeout, "load")
	load, err := startClientLoad(ctx, cfg.Clients, fl.addrs(), rec)
	if err != nil {
		return err
	}
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	run := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(lctx) }()
	}
	// Each of these returns at its first error; on this loaded machine a
	// call may end at --store-timeout before the kill, so they start again.
	again := func(f func(context.Context, *crashModel, pb.RetryPolicyServiceClient)) func(context.Context) {
		return func(ctx context.Context) {
			for ctx.Err() == nil {
				f(ctx, m, workers)
			}
		}
	}
	for range 2 {
		run(func(ctx context.Context) {
			for ctx.Err() == nil {
				adminWriter(ctx, m, admin)
			}
		})
	}
	run(again(tripper))
	for range spenders {
		run(again(spender))
	}
	sleepCtx(ctx, cfg.Load)
	fmt.Fprintf(out, "SIGKILL redis-server (pid %d) under load, admin writes, breaker trips and retry spends\n", fl.redis.pid())
	fl.redis.kill()
	cancel()
	wg.Wait()
	load.stop()
	t0 := time.Now()
	if err := fl.redis.start(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "  redis-server restarted on its AOF (pid %d) in %v\n", fl.redis.pid(), time.Since(t0).Round(time.Millisecond))
	if err := visibleAfterRestart(ctx, fl, time.Now(), out); err != nil {
		return err
	}
	m.mu.Lock()
	fmt.Fprintf(out, "  acknowledged before the kill: %d admin writes (budgets %d, deletions %d, policies %d, forced OPEN %d), %d breakers tripped OPEN, %d retries granted; %d answers flagged degraded (not acknowledged by Redis, left out)\n",
		m.writes, len(m.budgets), len(m.deleted), len(m.policies), m.forced, m.tripped, m.granted, m.degraded)
	m.grants = nil // with appendfsync always no acknowledged spend may be lost
	m.mu.Unlock()

	// In Redis itself, not through a replica's cache: what was lost.
	var lost []string
	if err := retryRead(ctx, func(ctx context.Context) (err error) { lost, err = redisMissing(ctx, fl.redis, m); return err }); err != nil {
		return fmt.Errorf("reading Redis after the restart: %w", err)
	}
	for i, k := range lost {
		if i < 10 {
			fmt.Fprintln(out, "  LOST in Redis:", k)
		}
	}
	// Through every replica: at once, and again a second later if one
	// does not show everything yet (stale, not lost, when Redis has it).
	lowest := m.lowest
	var stale int
	for i, d := range fl.reps {
		c, err := dial(d.addr, fl.token)
		if err != nil {
			return err
		}
		rc := pb.NewAdminServiceClient(c)
		t1 := time.Now()
		if err := waitAdmin(ctx, rc, 20*time.Second); err != nil {
			c.Close()
			return fmt.Errorf("replica %d did not answer within 20s of Redis's restart: %w", i, err)
		}
		waited := time.Since(t1)
		var first, last []string
		for try := 0; try < 5; try++ {
			var found []string
			m.lowest = lowest
			refund, _, err := verifyCrash(ctx, m, pb.NewRetryPolicyServiceClient(c), rc, func(f string, a ...any) {
				found = append(found, fmt.Sprintf(f, a...))
			})
			if err == nil && refund > 0 {
				found = append(found, fmt.Sprintf("%d acknowledged retry spends of %s refunded", refund, crashSpendTenant))
			}
			if err != nil {
				found = append(found, "reading: "+err.Error())
			}
			if try == 0 {
				first = found
			}
			if last = found; len(found) == 0 {
				break
			}
			sleepCtx(ctx, time.Second)
		}
		c.Close()
		fmt.Fprintf(out, "  replica %d (%s): answered admin reads %v after the restart; %d writes or transitions not shown at the first read, %d after retries\n",
			i, d.addr, waited.Round(time.Millisecond), len(first), len(last))
		for j, v := range first {
			if j < 5 {
				fmt.Fprintln(out, "    first read:", v)
			}
		}
		for j, v := range last {
			if j < 5 {
				fmt.Fprintln(out, "    after retries:", v)
			}
		}
		stale += len(last)
	}
	if len(lost) > 0 || stale > 0 {
		return fmt.Errorf("%d acknowledged writes or transitions lost in Redis; %d not shown by a replica after retries", len(lost), stale)
	}
	fmt.Fprintf(out, "verdict: PASS: zero acknowledged admin writes or breaker transitions lost (%d writes, %d OPEN breakers checked through 3 replicas and in Redis); no retry spend refunded\n",
		m.writes, len(m.open))
	return nil
}

// visibleAfterRestart writes a policy through replica 0 as soon as it
// takes one after Redis came back (restarted), and times how long after
// the acknowledgement every other replica serves it from its cache
// (GetPolicy): issue 13's "an admin write is visible on every replica
// within 100 ms", right after a restart.
func visibleAfterRestart(ctx context.Context, fl *replicaFleet, restarted time.Time, out io.Writer) error {
	var admins []pb.AdminServiceClient
	for _, d := range fl.reps {
		c, err := dial(d.addr, fl.token)
		if err != nil {
			return err
		}
		defer c.Close()
		admins = append(admins, pb.NewAdminServiceClient(c))
	}
	target := fmt.Sprintf("after-restart-%x", time.Now().UnixNano())
	maxAttempts := uint32(2)
	err := retryRead(ctx, func(ctx context.Context) error {
		_, err := admins[0].SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: crashPolicyTenant, Target: target,
			Policy: &pb.Policy{MaxAttempts: &maxAttempts}})
		return err
	})
	if err != nil {
		return fmt.Errorf("SetPolicy after the restart: %w", err)
	}
	acked := time.Now()
	var lags []string
	for i, a := range admins[1:] {
		for {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := a.GetPolicy(cctx, &pb.GetPolicyRequest{Tenant: crashPolicyTenant, Target: target})
			cancel()
			if err == nil {
				lags = append(lags, fmt.Sprintf("replica %d %v", i+1, time.Since(acked).Round(100*time.Microsecond)))
				break
			}
			if time.Since(acked) > 10*time.Second || ctx.Err() != nil {
				lags = append(lags, fmt.Sprintf("replica %d not within 10s (%v)", i+1, err))
				break
			}
			sleepCtx(ctx, time.Millisecond)
		}
	}
	fmt.Fprintf(out, "  a policy written through replica 0 %v after the restart: visible on %s after its acknowledgement (goal: within 100ms)\n",
		acked.Sub(restarted).Round(time.Millisecond), strings.Join(lags, ", "))
	return nil
}

// redisMissing reads the acknowledged policies, budgets and OPEN breakers
// of the model straight from Redis (the key layout of redisstore/doc.go)
// and names those not found.
func redisMissing(ctx context.Context, r *redisProc, m *crashModel) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var missing []string
	for target := range m.policies {
		ok, err := r.client.HExists(ctx, "{policyd}:policies", crashPolicyTenant+"\x00"+target).Result()
		if err != nil {
			return nil, err
		}
		if !ok {
			missing = append(missing, fmt.Sprintf("policy %s/%s", crashPolicyTenant, target))
		}
	}
	for tenant := range m.budgets {
		ok, err := r.client.HExists(ctx, "{policyd}:budgets", tenant).Result()
		if err != nil {
			return nil, err
		}
		if !ok {
			missing = append(missing, "budget "+tenant)
		}
	}
	for tenant := range m.deleted {
		ok, err := r.client.HExists(ctx, "{policyd}:budgets", tenant).Result()
		if err != nil {
			return nil, err
		}
		if ok {
			missing = append(missing, "deletion of budget "+tenant)
		}
	}
	for key := range m.open {
		tenant, target, _ := strings.Cut(key, "\x00")
		st, ok, err := redisstore.StoredBreakerState(ctx, r.client, policy.BreakerKey{Tenant: tenant, Target: target})
		switch {
		case err != nil:
			return nil, err
		case !ok:
			missing = append(missing, fmt.Sprintf("breaker %s/%s OPEN: not in Redis", tenant, target))
		case st != policy.BreakerOpen:
			missing = append(missing, fmt.Sprintf("breaker %s/%s OPEN: %s in Redis", tenant, target, st))
		}
	}
	return missing, nil
}

// The stop-redis scenario's spending tenants: a budget that never refills
// and a run pool, both smaller than what the spenders ask for.
const (
	stopBudgetTenant = "stop-budget"
	stopPoolTenant   = "stop-pool"
	stopBudgetCap    = 400
	stopPool         = 300
	// stopChainTenant's calls go to a primary with a fallback and a
	// concurrency ceiling on both: their decisions take several engine
	// calls (the lease, the fallback's breaker), which share one timeout.
	stopChainTenant = "stop-chain"
)

// scenarioStopRedis SIGSTOPs Redis under load for cfg.Pause.
func scenarioStopRedis(ctx context.Context, cfg replicasConfig, fl *replicaFleet, out io.Writer) error {
	aconn, err := dial(fl.addrs(), fl.token)
	if err != nil {
		return err
	}
	defer aconn.Close()
	admin := pb.NewAdminServiceClient(aconn)
	// The setup's writes are retried (retryRead): right after an earlier
	// fault, on this loaded machine, one may end at --store-timeout. Each
	// may run twice: the same budget and policy again, and a run opened
	// by a try that timed out is there (ALREADY_EXISTS).
	err = retryRead(ctx, func(ctx context.Context) error {
		_, err := admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{
			Tenant: stopBudgetTenant, Capacity: stopBudgetCap, DepositRatio: 1e-12, MinRetriesPerSecond: 1e-12}})
		return err
	})
	if err != nil {
		return err
	}
	// The spenders' breakers must not open: failure-rate mode that never
	// has enough calls, so what limits the grants is the budget and the pool.
	minCalls := uint32(4_000_000_000)
	for _, t := range []string{stopBudgetTenant, stopPoolTenant} {
		err := retryRead(ctx, func(ctx context.Context) error {
			_, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: t, Policy: &pb.Policy{
				Breaker: &pb.BreakerSettings{Mode: pb.BreakerMode_BREAKER_MODE_FAILURE_RATE, MinCalls: &minCalls}}})
			return err
		})
		if err != nil {
			return fmt.Errorf("policy %s: %w", t, err)
		}
	}
	ceiling := uint32(64)
	chainPolicies := map[string]*pb.Policy{
		"primary": {Breaker: &pb.BreakerSettings{Mode: pb.BreakerMode_BREAKER_MODE_FAILURE_RATE, MinCalls: &minCalls},
			Flow:     &pb.FlowSettings{MaxInFlight: &ceiling},
			Fallback: &pb.FallbackSettings{Targets: []string{"backup"}, AfterAttempts: 1, OnCircuitOpen: true}},
		"backup": {Breaker: &pb.BreakerSettings{Mode: pb.BreakerMode_BREAKER_MODE_FAILURE_RATE, MinCalls: &minCalls},
			Flow: &pb.FlowSettings{MaxInFlight: &ceiling}},
	}
	for target, p := range chainPolicies {
		err := retryRead(ctx, func(ctx context.Context) error {
			_, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: stopChainTenant, Target: target, Policy: p})
			return err
		})
		if err != nil {
			return fmt.Errorf("policy %s/%s: %w", stopChainTenant, target, err)
		}
	}
	runID := fmt.Sprintf("stop-%x", time.Now().UnixNano())
	err = retryRead(ctx, func(ctx context.Context) error {
		_, err := admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: runID, Tenant: stopPoolTenant, RetryPool: stopPool,
			CutoffTime: timestamppb.New(time.Now().Add(time.Hour))})
		if status.Code(err) == codes.AlreadyExists {
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("OpenRun: %w", err)
	}

	rec := newRPCRecorder(cfg.StoreTimeout+20*time.Millisecond, "before", "stopped", "after")
	conn, err := dial(fl.addrs(), "", rec.interceptor())
	if err != nil {
		return err
	}
	defer conn.Close()
	workers := pb.NewRetryPolicyServiceClient(conn)
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 8 {
		c := &caller{g: newGen(100+i, uint64(i)), on: new(atomic.Bool)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lctx.Err() == nil {
				mixLoop(lctx, c, workers)
			}
		}()
	}
	// Spenders ask for retries of the budget and of the pool, paced, all
	// along: the grants they are given are counted against the limits.
	var budgetGrants, poolGrants atomic.Int64
	spend := func(tenant, run string, grants *atomic.Int64) {
		defer wg.Done()
		for i := 0; lctx.Err() == nil; i++ {
			resp, err := workers.NextDelay(lctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: tenant, Target: "spend",
				CallId: fmt.Sprintf("%s-%x-%d", tenant, time.Now().UnixNano(), i), RunId: run, Idempotent: true},
				Attempt: 1, Failure: httpFailure(503)})
			if err == nil && resp.GetDecision() == pb.Decision_DECISION_RETRY {
				grants.Add(1)
			}
			sleepCtx(lctx, 10*time.Millisecond)
		}
	}
	for range 2 {
		wg.Add(2)
		go spend(stopBudgetTenant, "", &budgetGrants)
		go spend(stopPoolTenant, runID, &poolGrants)
	}
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; lctx.Err() == nil; n++ {
				escalate(lctx, workers, fmt.Sprintf("chain-%d-%x-%d", i, time.Now().UnixNano(), n))
				sleepCtx(lctx, 5*time.Millisecond)
			}
		}()
	}
	sleepCtx(ctx, cfg.Load)
	fmt.Fprintf(out, "SIGSTOP redis-server (pid %d) for %v under load (8 callers of the mix, 4 spenders, 2 callers escalating to a fallback under ceilings)\n", fl.redis.pid(), cfg.Pause)
	// Read before the stopped period starts: a replica with one P
	// answers nothing while it renders its metrics page.
	fl.takeSlow() // from here on
	schedBefore := fl.sampleHist(ctx, schedLatencies)
	rec.next()
	if err := fl.redis.pause(); err != nil {
		cancel()
		wg.Wait()
		return err
	}
	sleepCtx(ctx, cfg.Pause)
	if err := fl.redis.resume(); err != nil {
		cancel()
		wg.Wait()
		return err
	}
	rec.next()
	fmt.Fprintln(out, "SIGCONT redis-server")
	sleepCtx(ctx, cfg.Load)
	cancel()
	wg.Wait()
	fmt.Fprint(out, rec.summary("  "))
	ans, errs, slow := rec.totals(1)
	fmt.Fprintf(out, "  while stopped: %d answered, %d errors, %d slower than --store-timeout+20ms (%v)\n",
		ans, errs, slow, cfg.StoreTimeout+20*time.Millisecond)
	fmt.Fprintln(out, "  "+handlersSlow(fl))
	fmt.Fprintln(out, "  "+schedWaits(ctx, fl, schedBefore))

	// Consistency after SIGCONT.
	var bad []string
	var st *pb.GetTenantBudgetResponse
	err = retryRead(ctx, func(ctx context.Context) (err error) {
		st, err = admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: stopBudgetTenant})
		return err
	})
	if err != nil {
		return fmt.Errorf("GetTenantBudget after SIGCONT: %w", err)
	}
	tokens := st.GetStatus().GetTokens()
	if tokens < 0 || float64(budgetGrants.Load()) > stopBudgetCap {
		bad = append(bad, fmt.Sprintf("budget %s overspent: %d grants of %d, tokens %.1f", stopBudgetTenant, budgetGrants.Load(), stopBudgetCap, tokens))
	}
	var gr *pb.GetRunResponse
	err = retryRead(ctx, func(ctx context.Context) (err error) {
		gr, err = admin.GetRun(ctx, &pb.GetRunRequest{RunId: runID})
		return err
	})
	if err != nil {
		return fmt.Errorf("GetRun after SIGCONT: %w", err)
	}
	spent := gr.GetRun().GetRetriesSpent()
	if spent > stopPool || poolGrants.Load() > stopPool {
		bad = append(bad, fmt.Sprintf("run pool overspent: %d grants, %d spent of %d", poolGrants.Load(), spent, stopPool))
	}
	fmt.Fprintf(out, "  budget %s: %d retries granted of %d, %.1f tokens left; run pool: %d granted, %d spent of %d\n",
		stopBudgetTenant, budgetGrants.Load(), stopBudgetCap, tokens, poolGrants.Load(), spent, stopPool)
	diverged, compared, err := breakersDiverge(ctx, fl)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  breakers compared across the 3 replicas: %d, diverging: %d\n", compared, len(diverged))
	for _, d := range diverged {
		bad = append(bad, "breaker states differ: "+d)
	}
	for _, b := range bad {
		fmt.Fprintln(out, "  VIOLATION:", b)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d inconsistencies after SIGCONT", len(bad))
	}
	goal := "met"
	if errs > 0 || slow > 0 {
		goal = "NOT met"
	}
	fmt.Fprintf(out, "verdict: PASS: consistent after SIGCONT (budget and pool not overspent, breakers agree); goal (every decision answered within --store-timeout plus a few ms, flagged degraded) %s: %d answered, %d errors while stopped\n",
		goal, ans, errs)
	return nil
}

// handlersSlow says what the replicas' own slow-request logs counted
// since the SIGSTOP (every window closed a second after its first call, so
// the after-period's last second may be missing): time a handler took,
// from its start to its answer. A call the load generator timed past the
// bound that no handler logged spent the difference outside policyd's
// handlers: in the sockets, or waiting for a core.
func handlersSlow(fl *replicaFleet) string {
	if fl.slowRequest == 0 {
		return "the replicas' handlers: not timed (a policyd without --slow-request)"
	}
	s := fl.takeSlow()
	if s.Count == 0 {
		return fmt.Sprintf("the replicas' handlers (--slow-request %v): none answered past %v", fl.slowRequest, fl.slowRequest)
	}
	return fmt.Sprintf("the replicas' handlers (--slow-request %v): %d answered past it, the slowest %s, %s",
		fl.slowRequest, s.Count, s.What, fmtUs(us(s.Slowest)))
}

// schedLatencies is the Go runtime's histogram of how long runnable
// goroutines waited to run, on the replicas' metrics pages.
const schedLatencies = "go_sched_latencies_seconds"

// schedWaits says how many of the replicas' goroutines waited long to run
// since before: a replica whose process was not given a core (or whose one
// P was busy) for that long answers that much later, whatever its code.
func schedWaits(ctx context.Context, fl *replicaFleet, before *histSample) string {
	now := fl.sampleHist(ctx, schedLatencies)
	if before == nil || now == nil {
		return "the replicas' scheduler: not read (a policyd without " + schedLatencies + ")"
	}
	over, bound, all := now.over(before, 0.02)
	return fmt.Sprintf("the replicas' goroutines (%s): %.0f of %.0f runs waited over %s to run", schedLatencies, over, all,
		fmtUs(us(time.Duration(bound*float64(time.Second)))))
}

// escalate is one call of stopChainTenant as a worker makes it: Admit on
// the primary (a lease), a failure's NextDelay with the lease (answered
// RETRY on the fallback, after_attempts 1), Admit of attempt 2 where the
// answer says, and the attempt's success reported with its lease. Errors
// are the recorder's to count; the call then ends.
func escalate(ctx context.Context, workers pb.RetryPolicyServiceClient, id string) {
	call := &pb.CallRef{Tenant: stopChainTenant, Target: "primary", CallId: id, Idempotent: true}
	a, err := workers.Admit(ctx, &pb.AdmitRequest{Call: call, Attempt: 1})
	if err != nil || !a.GetAdmitted() {
		return
	}
	nd, err := workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call, Attempt: 1, Failure: httpFailure(503),
		LeaseId: a.GetLeaseId(), AttemptTarget: a.GetTarget()})
	if err != nil || nd.GetDecision() != pb.Decision_DECISION_RETRY {
		return
	}
	a, err = workers.Admit(ctx, &pb.AdmitRequest{Call: call, Attempt: 2, AttemptTarget: nd.GetTarget()})
	if err != nil || !a.GetAdmitted() {
		return
	}
	_, _ = workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: outcomeRef(call), Attempt: 2,
		Success: true, LeaseId: a.GetLeaseId(), AttemptTarget: a.GetTarget(), FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}}})
}

// breakersDiverge lists the benchmark tenants' breakers through every
// replica (retrying for a few seconds, as states propagate) and names the
// keys whose states differ.
func breakersDiverge(ctx context.Context, fl *replicaFleet) (diverged []string, compared int, err error) {
	var admins []pb.AdminServiceClient
	for _, d := range fl.reps {
		c, err := dial(d.addr, fl.token)
		if err != nil {
			return nil, 0, err
		}
		defer c.Close()
		admins = append(admins, pb.NewAdminServiceClient(c))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		diverged, compared = nil, 0
		states := make([]map[string]pb.BreakerState, len(admins))
		for i, a := range admins {
			states[i] = map[string]pb.BreakerState{}
			for t := range benchTenants {
				for tok := ""; ; {
					var resp *pb.ListBreakersResponse
					err := retryRead(ctx, func(ctx context.Context) (err error) {
						resp, err = a.ListBreakers(ctx, &pb.ListBreakersRequest{Tenant: tenantName(t), PageSize: 1000, PageToken: tok})
						return err
					})
					if err != nil {
						return nil, 0, fmt.Errorf("ListBreakers: %w", err)
					}
					for _, b := range resp.GetBreakers() {
						states[i][b.GetKey().GetTenant()+"/"+b.GetKey().GetTarget()] = b.GetState()
					}
					if tok = resp.GetNextPageToken(); tok == "" {
						break
					}
				}
			}
		}
		for k, s := range states[0] {
			compared++
			for i := 1; i < len(states); i++ {
				if states[i][k] != s {
					diverged = append(diverged, fmt.Sprintf("%s: replica 0 %v, replica %d %v", k, s, i, states[i][k]))
				}
			}
		}
		if len(diverged) == 0 || time.Now().After(deadline) {
			return diverged, compared, nil
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

// retryRead calls read, each call bounded by 2s, until it succeeds or 15s
// have passed: a read right after a fault, on a loaded machine.
func retryRead(ctx context.Context, read func(context.Context) error) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := read(cctx)
		cancel()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// printStoreFailures prints the causes of the INTERNAL answers the
// replicas logged ("store failure"), summed over every replica process.
func printStoreFailures(out io.Writer, fl *replicaFleet) {
	sum := map[string]int{}
	for _, d := range append(slices.Clone(fl.gone), fl.reps...) {
		if d == nil {
			continue
		}
		for k, n := range d.log.storeFailures() {
			sum[failureClass(k)] += n
		}
	}
	fmt.Fprintf(out, "\nINTERNAL answers of the replicas (\"store failure\" log lines), by cause: %d causes\n", len(sum))
	keys := slices.Sorted(maps.Keys(sum))
	for _, k := range keys {
		fmt.Fprintf(out, "  %6d  %s\n", sum[k], k)
	}
}

var (
	addrPattern   = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+:\d+`)
	quotedPattern = regexp.MustCompile(`"[^"]*"`)
)

// failureClass is a logged cause without its addresses and names, so that
// causes differing only in a port or a tenant count as one.
func failureClass(cause string) string {
	return quotedPattern.ReplaceAllString(addrPattern.ReplaceAllString(cause, "ADDR"), `"…"`)
}
