package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// replicaSweepConfig is what `policybench replicas-sweep` is told.
type replicaSweepConfig struct {
	Policyd      string
	StoreTimeout time.Duration
	Concurrency  []int
	Duration     time.Duration
	Warmup       time.Duration
	Rounds       int // windows each side is measured in, (i) and (ii) in turn
	Transitions  int
	Seed         uint64
	Runtime      replicaRuntime // each replica's Go runtime settings
}

func replicaSweepCmd() *cobra.Command {
	var cfg replicaSweepConfig
	cmd := &cobra.Command{
		Use:   "replicas-sweep",
		Short: "The sweep against one bbolt daemon and three replicas on Redis, in one run, as ratios",
		Long: `replicas-sweep builds policyd and measures in the same run (i) one daemon
on a bbolt file (--sync group) and (ii) three replicas on one redis-server
(AOF always), each driven over one connection (for the replicas, spread over
them by gRPC round_robin). Both run throughout. Each phase at each level is
measured in --rounds rounds, each a window of --duration/--rounds on (i)
and one on (ii), the order turned round every round ((i) (ii), (ii) (i),
...), and each side's figures are of its windows together: the speed of
this machine's share of its host moves by a third within seconds, and
windows taken in turn, in both orders, see the same moments on both sides.
Phases, each at every --concurrency level: admit (breakers
CLOSED: it runs first), nextdelay and report (ReportOutcome of 256
outcomes), as in the sweep. For (ii) it prints
each figure as a ratio to (i), the Redis commands per request read from
INFO commandstats just before and after each measured window (INFO itself
left out), and the CPU per request of the replicas and of Redis (with the
children it forks to rewrite its AOF, whose rewrites it counts). Then the
propagation of a breaker transition: ForceBreaker on one replica, timed
until both other replicas' WatchBreakers subscribers receive it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReplicaSweep(cmd.Context(), cfg, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Policyd, "policyd", "", "policyd binary (default: go build ./cmd/policyd)")
	f.DurationVar(&cfg.StoreTimeout, "store-timeout", 50*time.Millisecond, "the replicas' --store-timeout")
	f.IntSliceVar(&cfg.Concurrency, "concurrency", []int{16, 64}, "concurrent callers, one level after another")
	f.DurationVar(&cfg.Duration, "duration", 5*time.Second, "measured time of each phase at each level, on each side (split over --rounds windows)")
	f.DurationVar(&cfg.Warmup, "warmup", time.Second, "unmeasured time before each window")
	f.IntVar(&cfg.Rounds, "rounds", 4, "windows each phase at each level is measured in on each side, (i) and (ii) in turn")
	f.IntVar(&cfg.Transitions, "transitions", 200, "breaker transitions timed for the propagation latency")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the request mix")
	rt := defaultReplicaRuntime(3)
	f.IntVar(&cfg.Runtime.Procs, "replica-procs", rt.Procs, "each replica's GOMAXPROCS (0: Go's default, a P per core); the bbolt daemon keeps Go's default")
	f.StringVar(&cfg.Runtime.Godebug, "replica-godebug", rt.Godebug, "each replica's GODEBUG (\"\": Go's default); the default keeps the runtime's sysmon out of its deep sleep; the bbolt daemon keeps this process's environment")
	return cmd
}

// sweepPhaseOrder runs Admit first, while every breaker is CLOSED.
var sweepPhaseOrder = []string{"admit", "nextdelay", "report"}

// fleetRow is one phase at one level of one configuration.
type fleetRow struct {
	Callers     int
	Phase       string
	Requests    uint64
	Errors      uint64
	RPS, P99us  float64
	Outcomes    uint64
	ServerCPUus float64 // the daemon, or the three replicas together, per request
	ClientCPUus float64 // policybench's own callers, per request: the load generator's share of the machine
	RedisCPUus  float64 // -1: no Redis
	RedisCalls  uint64  // commands run by Redis in the window (INFO left out)
	RedisForks  uint64  // the server's forks in the window: AOF rewrites
	Stolen      float64 // the share of the machine's CPU stolen by the hypervisor in the window; -1: unknown
	RedisByCmd  map[string]uint64
	// Trips are the round trips the replicas made to Redis in the window,
	// by call (policyd_store_round_trips_total); RequestTrips those of
	// them not in backgroundCalls: the requests' own, and for the report
	// phase the flushes of held outcomes and audit records.
	Trips        map[string]uint64
	RequestTrips uint64
	Handled      uint64 // the RPCs the replicas handled between the same two scrapes
	// AuditDropped is the audit records the daemon or the replicas
	// dropped between the same two scrapes (policyd_audit_dropped_total:
	// appended faster than written); -1: not read.
	AuditDropped int64
	// Downs is the times a replica went into degraded mode between the
	// same two scrapes (policyd_store_down_total); -1: not read.
	Downs      int64
	FirstError string
	win        window     // what the load generator measured
	rounds     []fleetRow // the windows a row of several was made of, in the order measured
}

func runReplicaSweep(ctx context.Context, cfg replicaSweepConfig, out, log io.Writer) error {
	if len(cfg.Concurrency) == 0 || cfg.Duration <= 0 || cfg.Transitions < 1 || cfg.Rounds < 1 {
		return errors.New("--concurrency needs a level, --duration > 0, --rounds >= 1, --transitions >= 1")
	}
	window := cfg.Duration / time.Duration(cfg.Rounds)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Duration(2*len(cfg.Concurrency)*len(sweepPhaseOrder)*cfg.Rounds)*(window+cfg.Warmup)+3*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "policybench-rsweep")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := policydBinary(cfg.Policyd, dir)
	if err != nil {
		return err
	}
	m := machineInfo()
	fmt.Fprintf(out, "machine: %d CPUs (%s), %s, %s, load %s\n", m.NumCPU, m.CPUModel, m.MemTotal, m.GoVersion, m.LoadAvg)

	fmt.Fprintln(log, "replicas-sweep: (i) one bbolt daemon, (ii) three replicas on Redis")
	single, err := startDaemon(bin, filepath.Join(dir, "single.db"), "--sync", "group")
	if err != nil {
		return err
	}
	defer func() { _ = single.stop() }()
	fl, err := startFleet(ctx, filepath.Join(dir, "fleet"), bin, 3, cfg.StoreTimeout, cfg.Runtime)
	if err != nil {
		return err
	}
	defer fl.stop()
	var metrics []string
	for _, d := range fl.reps {
		metrics = append(metrics, d.metrics)
	}
	bolt, err := openTarget(ctx, "(i)", single.addr, single.db+".admin-token", "", []int{single.pid()}, nil, []string{single.metrics})
	if err != nil {
		return fmt.Errorf("bbolt daemon: %w", err)
	}
	defer bolt.conn.Close()
	reps, err := openTarget(ctx, "(ii)", fl.addrs(), fl.tokenFile, fl.token, fl.pids(), fl.redis, metrics)
	if err != nil {
		return fmt.Errorf("replicas: %w", err)
	}
	defer reps.conn.Close()
	var one, three []fleetRow
	for _, ph := range sweepPhaseOrder {
		for _, n := range cfg.Concurrency {
			var b, r []fleetRow
			for round := range cfg.Rounds {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if round%2 == 0 {
					b = append(b, bolt.measure(ctx, cfg, ph, n, window, log))
					r = append(r, reps.measure(ctx, cfg, ph, n, window, log))
				} else {
					r = append(r, reps.measure(ctx, cfg, ph, n, window, log))
					b = append(b, bolt.measure(ctx, cfg, ph, n, window, log))
				}
			}
			one = append(one, combine(b))
			three = append(three, combine(r))
		}
	}
	fmt.Fprintln(log, "replicas-sweep: transition propagation")
	resetErr := fl.redis.resetLatency(ctx)
	prop, err := measurePropagation(ctx, fl, cfg.Transitions)
	if err != nil {
		fmt.Fprintf(out, "propagation not measured: %v\n", err)
		prop = &propagation{FromAck: new(hist), FromSend: new(hist)}
	}
	prop.RedisLatency = "not read"
	if resetErr == nil {
		if events, err := fl.redis.latencyEvents(ctx); err == nil {
			prop.RedisLatency = fmtLatencyEvents(events)
		}
	}
	printFleetSweep(out, cfg, one, three, prop)
	return nil
}

// backgroundCalls are the round trips a replica makes whatever its
// requests: the feeds' XREAD, the heartbeat, the breaker cache's reads,
// the tenant list, the metrics page's listing of breakers, and a new
// connection's handshake.
var backgroundCalls = map[string]bool{"xread": true, "zadd": true, "zrange": true, "zremrangebyscore": true,
	"pipeline zadd": true, "smembers": true, "policyd_read": true, "policyd_read_many": true, "hello": true, "pipeline client": true}

// tripSample is the replicas' round trips to Redis by call
// (policyd_store_round_trips_total) and the RPCs they handled
// (grpc_server_handled_total), read together, so their ratio does not
// depend on when the scrape ran.
type tripSample struct {
	trips        map[string]uint64
	handled      uint64
	auditDropped uint64
	auditKnown   bool // every page has policyd_audit_dropped_total (a replica built before it has not)
	downs        uint64
	downsKnown   bool // every page has policyd_store_down_total (the bbolt daemon's has not)
}

// sampleTrips scrapes every replica's metrics page at once; nil without
// replicas or when one does not answer.
func sampleTrips(ctx context.Context, metrics []string) *tripSample {
	if len(metrics) == 0 {
		return nil
	}
	type page struct {
		text string
		err  error
	}
	pages := make([]page, len(metrics))
	var wg sync.WaitGroup
	for i, url := range metrics {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pages[i].text, pages[i].err = fetchMetrics(ctx, url)
		}()
	}
	wg.Wait()
	out := &tripSample{trips: map[string]uint64{}, auditKnown: true, downsKnown: true}
	for _, p := range pages {
		if p.err != nil {
			return nil
		}
		for call, v := range byLabel(p.text, "policyd_store_round_trips_total", "call") {
			out.trips[call] += uint64(v)
		}
		for _, v := range byLabel(p.text, "grpc_server_handled_total", "") {
			out.handled += uint64(v)
		}
		dropped := byLabel(p.text, "policyd_audit_dropped_total", "")
		out.auditKnown = out.auditKnown && len(dropped) > 0
		for _, v := range dropped {
			out.auditDropped += uint64(v)
		}
		downs := byLabel(p.text, "policyd_store_down_total", "")
		out.downsKnown = out.downsKnown && len(downs) > 0
		for _, v := range downs {
			out.downs += uint64(v)
		}
	}
	return out
}

// sweepTarget is one configuration of the sweep, its workload set up and
// its connection open: the bbolt daemon, or the replicas (with their
// Redis and metrics pages).
type sweepTarget struct {
	name    string
	conn    *grpc.ClientConn
	workers pb.RetryPolicyServiceClient
	pids    []int
	redis   *redisProc
	metrics []string // the metrics pages: the bbolt daemon's, or the replicas'
}

// openTarget sets up the workload at addrs and opens the connection the
// phases are measured over.
func openTarget(ctx context.Context, name, addrs, tokenFile, token string, pids []int, r *redisProc, metrics []string) (*sweepTarget, error) {
	if token == "" {
		var err error
		if token, err = readToken(tokenFile); err != nil {
			return nil, err
		}
	}
	aconn, err := dial(addrs, token)
	if err != nil {
		return nil, err
	}
	err = setupWorkload(ctx, pb.NewAdminServiceClient(aconn))
	aconn.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: admin setup: %w", name, err)
	}
	conn, err := dial(addrs, "")
	if err != nil {
		return nil, err
	}
	t := &sweepTarget{name: name, conn: conn, workers: pb.NewRetryPolicyServiceClient(conn), pids: pids, redis: r, metrics: metrics}
	if err := waitReady(ctx, t.workers); err != nil {
		conn.Close()
		return nil, err
	}
	return t, nil
}

// measure runs phase ph at n callers on t for one window of d.
func (t *sweepTarget) measure(ctx context.Context, cfg replicaSweepConfig, ph string, n int, d time.Duration, log io.Writer) fleetRow {
	fmt.Fprintf(log, "  %s, %d callers: %s\n", t.name, n, ph)
	var cpu0, cpu1, rcpu0, rcpu1 time.Duration
	var cs0, cs1 map[string]uint64
	var forks0, forks1 uint64
	var host0, host1 hostCPU
	var rt0, rt1 *tripSample
	var cpuOK, rOK bool
	around := func(open bool) {
		// The scrapes (tens of ms under load) go before the window's
		// CPU and commandstats readings at its start and after them
		// at its end, so those bracket the window closely.
		if open {
			rt0 = sampleTrips(ctx, t.metrics)
		} else {
			defer func() { rt1 = sampleTrips(ctx, t.metrics) }()
		}
		c, ok := cpuOf(t.pids)
		h, _ := readHostCPU()
		if open {
			host0 = h
		} else {
			host1 = h
		}
		var rc time.Duration
		var cs map[string]uint64
		var forks uint64
		rok := false
		if r := t.redis; r != nil {
			var err1, err2, err3 error
			rc, err1 = cpuTimeWithChildren(r.pid())
			cs, err2 = r.commandStats(ctx)
			forks, err3 = r.forks(ctx)
			rok = err1 == nil && err2 == nil && err3 == nil
		}
		if open {
			cpu0, cpuOK, rcpu0, cs0, forks0, rOK = c, ok, rc, cs, forks, rok
		} else {
			cpu1, cpuOK, rcpu1, cs1, forks1, rOK = c, cpuOK && ok, rc, cs, forks, rOK && rok
		}
	}
	w := measureAround(ctx, n, cfg.Warmup, d, cfg.Seed, 0, "", phaseLoop(ph, t.workers, nil, defaultReportBatch), around)
	rr := rowsOf(n, ph, w)[0]
	fr := fleetRow{Callers: n, Phase: ph, Requests: rr.Requests, Errors: rr.Errors, RPS: rr.RPS, P99us: rr.P99us,
		Outcomes: w.outcomes, ServerCPUus: -1, RedisCPUus: -1, FirstError: rr.FirstError, win: w,
		Stolen: host1.stolen(host0), AuditDropped: -1, Downs: -1, ClientCPUus: -1}
	if rr.Requests > 0 {
		fr.ClientCPUus = us(w.clientCPU) / float64(rr.Requests)
	}
	if cpuOK && rr.Requests > 0 {
		fr.ServerCPUus = us(cpu1-cpu0) / float64(rr.Requests)
	}
	if rOK && rr.Requests > 0 {
		fr.RedisCPUus = us(rcpu1-rcpu0) / float64(rr.Requests)
		fr.RedisForks = forks1 - forks0
		fr.RedisByCmd = map[string]uint64{}
		for k, v := range cs1 {
			if d := v - cs0[k]; d > 0 && k != "info" {
				fr.RedisByCmd[k] = d
				fr.RedisCalls += d
			}
		}
	}
	if rt0 != nil && rt1 != nil {
		if rt0.auditKnown && rt1.auditKnown {
			fr.AuditDropped = int64(rt1.auditDropped - rt0.auditDropped)
		}
		if rt0.downsKnown && rt1.downsKnown {
			fr.Downs = int64(rt1.downs - rt0.downs)
		}
		fr.Trips, fr.Handled = map[string]uint64{}, rt1.handled-rt0.handled
		for call, v := range rt1.trips {
			if d := v - rt0.trips[call]; d > 0 {
				fr.Trips[call] = d
				if !backgroundCalls[call] {
					fr.RequestTrips += d
				}
			}
		}
	}
	return fr
}

// combine makes the rows of one phase at one level, each of a window,
// the row of those windows taken as one: requests/s over their time
// together, p99 of their latencies merged, each CPU per request over
// their requests together (unknown when one window's is), steal over
// their time, and the counts summed. One row is itself.
func combine(parts []fleetRow) fleetRow {
	if len(parts) == 1 {
		return parts[0]
	}
	var w window
	for _, p := range parts {
		w.join(p.win)
	}
	first := parts[0]
	rr := rowsOf(first.Callers, first.Phase, w)[0]
	c := fleetRow{Callers: first.Callers, Phase: first.Phase, Requests: rr.Requests, Errors: rr.Errors, RPS: rr.RPS,
		P99us: rr.P99us, Outcomes: w.outcomes, FirstError: rr.FirstError, win: w, rounds: parts,
		RedisByCmd: map[string]uint64{}, Trips: map[string]uint64{}}
	// perRequest is the mean of f over the windows, each weighted by its
	// requests: the window's total over the total of requests.
	perRequest := func(f func(fleetRow) float64) float64 {
		var sum float64
		var n uint64
		for _, p := range parts {
			if p.Requests == 0 {
				continue
			}
			if f(p) < 0 {
				return -1
			}
			sum += f(p) * float64(p.Requests)
			n += p.Requests
		}
		if n == 0 {
			return -1
		}
		return sum / float64(n)
	}
	c.ServerCPUus = perRequest(func(p fleetRow) float64 { return p.ServerCPUus })
	c.ClientCPUus = perRequest(func(p fleetRow) float64 { return p.ClientCPUus })
	c.RedisCPUus = perRequest(func(p fleetRow) float64 { return p.RedisCPUus })
	var stolen, secs float64
	for _, p := range parts {
		if p.Stolen < 0 || stolen < 0 {
			stolen = -1
		} else {
			stolen += p.Stolen * p.win.elapsed.Seconds()
			secs += p.win.elapsed.Seconds()
		}
		if p.AuditDropped < 0 || c.AuditDropped < 0 {
			c.AuditDropped = -1
		} else {
			c.AuditDropped += p.AuditDropped
		}
		if p.Downs < 0 || c.Downs < 0 {
			c.Downs = -1
		} else {
			c.Downs += p.Downs
		}
		c.RedisCalls += p.RedisCalls
		c.RedisForks += p.RedisForks
		for k, v := range p.RedisByCmd {
			c.RedisByCmd[k] += v
		}
		for k, v := range p.Trips {
			c.Trips[k] += v
		}
		c.RequestTrips += p.RequestTrips
		c.Handled += p.Handled
	}
	c.Stolen = stolen
	if stolen > 0 {
		c.Stolen = stolen / secs
	}
	return c
}

// propagation is the time from a ForceBreaker on one replica to the
// transition's arrival at WatchBreakers subscribers of the others.
type propagation struct {
	Samples           int
	FromAck, FromSend *hist // measured from the RPC's answer, and from its sending
	Missed            int   // transitions a subscriber did not receive within 2s
	NoSnapshot        int   // subscribers that had no snapshot_complete within 10s
	Resubscribed      int   // watches refused UNAVAILABLE before their snapshot, and sent again
	ForceErrors       int   // ForceBreaker calls that failed (not timed)
	// RedisLatency is what Redis's latency monitor recorded meanwhile
	// (fmtLatencyEvents): a slow fsync of the AOF holds up the
	// ForceBreaker's answer and every subscriber's XREAD alike.
	RedisLatency string
}

// measurePropagation forces a breaker OPEN and CLOSED n times in turn
// through replica 0 and times each transition's arrival at subscribers
// on replicas 1 and 2.
func measurePropagation(ctx context.Context, fl *replicaFleet, n int) (*propagation, error) {
	// A tenant of its own, quiet but for these transitions (a benchmark
	// tenant's cycling breakers fill a subscriber's queue).
	const tenant, target = "prop", "propagation"
	aconn, err := dial(fl.reps[0].addr, fl.token)
	if err != nil {
		return nil, err
	}
	defer aconn.Close()
	admin := pb.NewAdminServiceClient(aconn)
	// The breaker and the tenant exist before anyone subscribes.
	if err := retryRead(ctx, func(ctx context.Context) error {
		_, err := admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: &pb.BreakerKey{Tenant: tenant, Target: target},
			State: pb.BreakerState_BREAKER_STATE_CLOSED})
		return err
	}); err != nil {
		return nil, err
	}
	type arrival struct {
		state pb.BreakerState
		at    time.Time
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	p := &propagation{FromAck: new(hist), FromSend: new(hist)}
	var streamErr atomic.Value
	var resubscribed atomic.Int64
	defer func() { p.Resubscribed = int(resubscribed.Load()) }()
	var subs []chan arrival
	for _, d := range fl.reps[1:] {
		conn, err := dial(d.addr, "")
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		// The replica uses the tenant before the subscription, so it
		// follows the tenant's events.
		if err := retryRead(ctx, func(ctx context.Context) error {
			_, err := pb.NewRetryPolicyServiceClient(conn).Admit(ctx, &pb.AdmitRequest{
				Call: &pb.CallRef{Tenant: tenant, Target: target, CallId: "prop-" + d.addr, Idempotent: true}, Attempt: 1})
			return err
		}); err != nil {
			return nil, fmt.Errorf("Admit on %s: %w", d.addr, err)
		}
		watch := func() (grpc.ServerStreamingClient[pb.WatchBreakersResponse], error) {
			return pb.NewRetryPolicyServiceClient(conn).WatchBreakers(sctx, &pb.WatchBreakersRequest{Tenant: tenant})
		}
		st, err := watch()
		if err != nil {
			return nil, err
		}
		ch := make(chan arrival, 4*n)
		ready := make(chan struct{})
		go func() {
			defer close(ch)
			once := false
			for {
				resp, err := st.Recv()
				if err != nil && !once && status.Code(err) == codes.Unavailable && sctx.Err() == nil {
					// Its snapshot's read outlasted the replica's
					// --store-timeout (an fsync of Redis's, say): watch
					// again, as the clients do.
					resubscribed.Add(1)
					sleepCtx(sctx, 100*time.Millisecond)
					if st, err = watch(); err == nil {
						continue
					}
				}
				if err != nil {
					streamErr.Store(err.Error())
					return
				}
				if resp.GetSnapshotComplete() && !once {
					once = true
					close(ready)
				}
				b := resp.GetBreaker()
				if resp.GetSnapshot() || b == nil || b.GetKey().GetTarget() != target {
					continue
				}
				ch <- arrival{b.GetState(), time.Now()}
			}
		}()
		select {
		case <-ready:
		case <-time.After(10 * time.Second):
			p.NoSnapshot++
		}
		subs = append(subs, ch)
	}
	for i := range n {
		want := pb.BreakerState_BREAKER_STATE_OPEN
		if i%2 == 1 {
			want = pb.BreakerState_BREAKER_STATE_CLOSED
		}
		sent := time.Now()
		if _, err := admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: &pb.BreakerKey{Tenant: tenant, Target: target}, State: want}); err != nil {
			// Ended at --store-timeout, the transition may or may not
			// have been made: drain what arrives and force it again.
			p.ForceErrors++
			sleepCtx(ctx, 100*time.Millisecond)
			for _, ch := range subs {
				for len(ch) > 0 {
					<-ch
				}
			}
			continue
		}
		acked := time.Now()
		for _, ch := range subs {
			timeout := time.After(2 * time.Second)
		wait:
			for {
				select {
				case a, ok := <-ch:
					if !ok {
						msg, _ := streamErr.Load().(string)
						return nil, fmt.Errorf("a WatchBreakers stream ended after %d arrivals: %s", p.Samples, msg)
					}
					if a.state != want {
						continue
					}
					p.FromSend.record(a.at.Sub(sent))
					p.FromAck.record(max(a.at.Sub(acked), 0))
					p.Samples++
					break wait
				case <-timeout:
					p.Missed++
					break wait
				}
			}
		}
		sleepCtx(ctx, 5*time.Millisecond)
	}
	return p, nil
}

// machineCPUus is the CPU per request of every process r measured: the
// daemon or the replicas, Redis, and the load generator; -1 when one of
// them was not read.
func (r fleetRow) machineCPUus() float64 {
	if r.ServerCPUus < 0 || r.ClientCPUus < 0 {
		return -1
	}
	return r.ServerCPUus + r.ClientCPUus + max(r.RedisCPUus, 0)
}

// fmtBound is the req/s cores allow at r's CPU per request, and the share
// of it r measured.
func fmtBound(r fleetRow, cores int) string {
	c := r.machineCPUus()
	if c <= 0 {
		return "-"
	}
	bound := float64(cores) * 1e6 / c
	return fmt.Sprintf("at most %.0f req/s, %.0f%%", bound, 100*r.RPS/bound)
}

func printFleetSweep(out io.Writer, cfg replicaSweepConfig, one, three []fleetRow, prop *propagation) {
	fmt.Fprintf(out, "(i) one policyd on bbolt (--sync group, GOMAXPROCS Go's default, GODEBUG %q); (ii) three replicas on one redis-server (AOF always, --store-timeout %s, %s each); each phase at each level measured for %s on each side, in %s, each after %s warm-up; one connection (round_robin over the replicas); ReportOutcome carries %d outcomes\n\n",
		os.Getenv("GODEBUG"), cfg.StoreTimeout, cfg.Runtime, cfg.Duration, fmtRounds(cfg), cfg.Warmup, defaultReportBatch)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tcallers\t(i) req/s\t(i) p99\t(ii) req/s\t(ii) p99\treq/s (ii)÷(i)\tp99 (ii)÷(i)\terrors (i)/(ii)\tcpu/req (i)\tcpu/req (ii) replicas\tcpu/req Redis\tcpu/req load generator (i)/(ii)\tRedis cmds/req\tRedis cmds/outcome\t")
	for i, b := range one {
		if i >= len(three) {
			break
		}
		r := three[i]
		perReq, perOutcome := "-", "-"
		if r.Requests > 0 && r.RedisCPUus >= 0 {
			perReq = fmt.Sprintf("%.3f", float64(r.RedisCalls)/float64(r.Requests))
		}
		if r.Phase == "report" && r.Outcomes > 0 {
			perOutcome = fmt.Sprintf("%.4f", float64(r.RedisCalls)/float64(r.Outcomes))
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%.0f\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\t%s/%s\t%s\t%s\t\n", b.Phase, b.Callers, b.RPS, fmtUs(b.P99us), r.RPS, fmtUs(r.P99us),
			fmtRatio(safeDiv(r.RPS, b.RPS)), fmtRatio(safeDiv(r.P99us, b.P99us)), b.Errors, r.Errors,
			fmtUs(b.ServerCPUus), fmtUs(r.ServerCPUus), fmtUs(r.RedisCPUus), fmtUs(b.ClientCPUus), fmtUs(r.ClientCPUus), perReq, perOutcome)
	}
	tw.Flush()
	if cfg.Rounds > 1 {
		fmt.Fprint(out, "\neach round's req/s (ii)÷(i) and p99 (ii)÷(i), in the order measured (a round's two windows are seconds apart; the table's ratios are of every round's windows together):")
		for i, b := range one {
			if i < len(three) {
				fmt.Fprintf(out, "  %s %d %s;", b.Phase, b.Callers, fmtRoundRatios(b.rounds, three[i].rounds))
			}
		}
		fmt.Fprintln(out)
	}
	fmt.Fprint(out, "\nthe machine's CPU stolen by the hypervisor in each phase's windows, (i) / (ii) (steal in /proc/stat: other guests ran; ratios from windows with much of it are the host's, not policyd's):")
	for i, b := range one {
		if i < len(three) {
			fmt.Fprintf(out, "  %s %d %s / %s;", b.Phase, b.Callers, fmtShare(b.Stolen), fmtShare(three[i].Stolen))
		}
	}
	fmt.Fprintln(out)
	cores := runtime.NumCPU()
	fmt.Fprintf(out, "\nthe machine's CPU per request in each phase's windows, every process measured, (i) the daemon and the load generator / (ii) the replicas, Redis and the load generator, with the req/s %d cores allow at that cost and the share of it measured (near 100%%: the windows were bound by the machine's CPU, and their latency follows their req/s):", cores)
	for i, b := range one {
		if i < len(three) {
			r := three[i]
			fmt.Fprintf(out, "  %s %d %s / %s (%s / %s);", b.Phase, b.Callers, fmtUs(b.machineCPUus()), fmtUs(r.machineCPUus()),
				fmtBound(b, cores), fmtBound(r, cores))
		}
	}
	fmt.Fprintln(out)
	fmt.Fprint(out, "\naudit records dropped in each phase's windows, (i) / (ii) (policyd_audit_dropped_total: appended faster than written; a window with any is not comparable):")
	for i, b := range one {
		if i < len(three) {
			fmt.Fprintf(out, "  %s %d %s / %s;", b.Phase, b.Callers, fmtCount(b.AuditDropped), fmtCount(three[i].AuditDropped))
		}
	}
	fmt.Fprintln(out)
	fmt.Fprint(out, "\ntimes a replica went into degraded mode in each phase's windows of (ii) (policyd_store_down_total: Redis calls past --store-timeout; its decisions were then its own, flagged degraded, for at least a second):")
	for _, r := range three {
		fmt.Fprintf(out, "  %s %d %s;", r.Phase, r.Callers, fmtCount(r.Downs))
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "\nRedis commands in each phase's measured windows of (ii), by command:")
	for _, r := range three {
		parts := byCount(r.RedisByCmd, func(string) string { return "" })
		fmt.Fprintf(out, "  %-9s %3d callers: %d requests, %d outcomes, %d AOF rewrites, %d commands: %s\n", r.Phase, r.Callers, r.Requests, r.Outcomes, r.RedisForks, r.RedisCalls, parts)
	}
	fmt.Fprintln(out, "\nRound trips the replicas made in each phase's measured windows of (ii), by call (policyd_store_round_trips_total; * background, not counted as the requests'):")
	for _, r := range three {
		parts := byCount(r.Trips, func(call string) string {
			if backgroundCalls[call] {
				return "*"
			}
			return ""
		})
		fmt.Fprintf(out, "  %-9s %3d callers: %d RPCs handled, %d round trips of the requests: %s\n", r.Phase, r.Callers, r.Handled, r.RequestTrips, parts)
	}
	for _, rows := range [][]fleetRow{one, three} {
		for _, r := range rows {
			if r.FirstError != "" {
				fmt.Fprintf(out, "  %s %d callers: %d errors, first: %s\n", r.Phase, r.Callers, r.Errors, r.FirstError)
			}
		}
	}
	fmt.Fprintf(out, "\ntransition propagation (ForceBreaker on replica 0 -> WatchBreakers on replicas 1 and 2): %d arrivals, %d missed (2s); ForceBreaker errors %d; subscribers without a snapshot_complete within 10s: %d; watches sent again after UNAVAILABLE before their snapshot: %d\n",
		prop.Samples, prop.Missed, prop.ForceErrors, prop.NoSnapshot, prop.Resubscribed)
	fmt.Fprintf(out, "  from the RPC's answer: p50 %s p99 %s max %s; from its sending: p50 %s p99 %s max %s\n",
		fmtUs(us(prop.FromAck.quantile(0.5))), fmtUs(us(prop.FromAck.quantile(0.99))), fmtUs(us(time.Duration(prop.FromAck.max))),
		fmtUs(us(prop.FromSend.quantile(0.5))), fmtUs(us(prop.FromSend.quantile(0.99))), fmtUs(us(time.Duration(prop.FromSend.max))))
	fmt.Fprintf(out, "  Redis's events of %s or more meanwhile (its latency monitor): %s\n", latencyThreshold, prop.RedisLatency)
	goals(out, one, three, prop)
}

// fmtRounds is how each phase at each level was measured on each side.
func fmtRounds(cfg replicaSweepConfig) string {
	if cfg.Rounds == 1 {
		return "one window, (i) then (ii)"
	}
	return fmt.Sprintf("%d windows of %s, (i) and (ii) in turn, the order turned round every round", cfg.Rounds, cfg.Duration/time.Duration(cfg.Rounds))
}

// fmtRoundRatios is each round's two ratios, (ii)'s window to (i)'s, as
// "0.55x/1.80x 0.61x/1.62x ...".
func fmtRoundRatios(one, three []fleetRow) string {
	var parts []string
	for i := range min(len(one), len(three)) {
		parts = append(parts, fmtRatio(safeDiv(three[i].RPS, one[i].RPS))+"/"+fmtRatio(safeDiv(three[i].P99us, one[i].P99us)))
	}
	return strings.Join(parts, " ")
}

// byCount lists counts as "name<mark> count, ...", the largest first.
func byCount(counts map[string]uint64, mark func(name string) string) string {
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return counts[keys[i]] > counts[keys[j]] })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s%s %d", k, mark(k), counts[k])
	}
	return strings.Join(parts, ", ")
}

// goals prints issue 13's goals against what was measured.
func goals(out io.Writer, one, three []fleetRow, prop *propagation) {
	find := func(rows []fleetRow, phase string, n int) *fleetRow {
		i := slices.IndexFunc(rows, func(r fleetRow) bool { return r.Phase == phase && r.Callers == n })
		if i < 0 {
			return nil
		}
		return &rows[i]
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "NOT met"
	}
	fmt.Fprintln(out, "\ngoals:")
	if b, r := find(one, "admit", 64), find(three, "admit", 64); b != nil && r != nil {
		x := safeDiv(r.RPS, b.RPS)
		fmt.Fprintf(out, "  Admit (CLOSED) req/s at 64 callers >= 0.8x: %.2fx  %s\n", x, verdict(x >= 0.8))
	}
	if b, r := find(one, "nextdelay", 64), find(three, "nextdelay", 64); b != nil && r != nil {
		x := safeDiv(r.RPS, b.RPS)
		fmt.Fprintf(out, "  NextDelay req/s at 64 callers >= 0.5x:      %.2fx  %s\n", x, verdict(x >= 0.5))
	}
	for _, ph := range sweepPhaseOrder {
		if b, r := find(one, ph, 16), find(three, ph, 16); b != nil && r != nil {
			x := safeDiv(r.P99us, b.P99us)
			fmt.Fprintf(out, "  %s p99 at 16 callers <= 2x:  %.2fx  %s\n", ph, x, verdict(x > 0 && x <= 2))
		}
	}
	perReq := func(ph string, limit float64) {
		for _, r := range three {
			if r.Phase != ph || r.Requests == 0 || r.Handled == 0 {
				continue
			}
			// Per RPC the replicas handled between the scrapes that read
			// the round trips; per outcome for the report phase.
			den, what := float64(r.Handled), "request"
			cmds := float64(r.RedisCalls) / float64(r.Requests)
			if ph == "report" {
				den, what = den*defaultReportBatch, "outcome"
				cmds = float64(r.RedisCalls) / float64(r.Outcomes)
			}
			x := float64(r.RequestTrips) / den
			fmt.Fprintf(out, "  Redis round trips per %s, %s at %d callers <= %g: %.4f  %s (commands, those inside functions included: %.4f)\n",
				what, ph, r.Callers, limit, x, verdict(x <= limit), cmds)
		}
	}
	perReq("admit", 0)
	perReq("nextdelay", 1)
	perReq("report", 0.01)
	p99 := time.Duration(prop.FromSend.quantile(0.99))
	fmt.Fprintf(out, "  transition reaches the other replicas' subscribers within 50ms p99: %s (from sending)  %s\n",
		fmtUs(us(p99)), verdict(prop.Samples > 0 && prop.Missed == 0 && p99 <= 50*time.Millisecond))
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// fmtShare prints a share as a percentage, "-" when unknown.
func fmtShare(x float64) string {
	if x < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*x)
}

// fmtCount formats a count, "-" when unknown (negative).
func fmtCount(n int64) string {
	if n < 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}
