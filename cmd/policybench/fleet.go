package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// replicaFleet is one redis-server and policyd replicas on it, all on
// loopback, sharing one admin token file.
type replicaFleet struct {
	dir          string
	bin          string
	storeTimeout time.Duration
	rt           replicaRuntime
	redis        *redisProc
	reps         []*daemon // nil where a replica was killed
	gone         []*daemon // the killed replicas, for their logs
	tokenFile    string
	token        string
	// slowRequest is the replicas' --slow-request: a handler that answers
	// past the store's bound by more than a few ms is logged. 0 for a
	// policyd built before the flag.
	slowRequest time.Duration
}

// slowMargin is how far past --store-timeout a replica's handler may
// answer before the fleet's replicas log it (--slow-request).
const slowMargin = 10 * time.Millisecond

// startFleet starts Redis in dir and n replicas of bin on it, each with
// the Go runtime settings rt.
func startFleet(ctx context.Context, dir, bin string, n int, storeTimeout time.Duration, rt replicaRuntime) (*replicaFleet, error) {
	f := &replicaFleet{dir: dir, bin: bin, storeTimeout: storeTimeout, rt: rt, tokenFile: filepath.Join(dir, "admin-token")}
	if servesFlag(bin, "--slow-request") {
		f.slowRequest = storeTimeout + slowMargin
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	raw := make([]byte, 16)
	_, _ = rand.Read(raw)
	f.token = hex.EncodeToString(raw)
	if err := os.WriteFile(f.tokenFile, []byte(f.token+"\n"), 0o600); err != nil {
		return nil, err
	}
	rdir := filepath.Join(dir, "redis")
	if err := os.MkdirAll(rdir, 0o700); err != nil {
		return nil, err
	}
	var err error
	if f.redis, err = startRedis(ctx, rdir); err != nil {
		return nil, err
	}
	f.reps = make([]*daemon, n)
	for i := range n {
		if err := f.startReplica(i); err != nil {
			f.stop()
			return nil, err
		}
	}
	return f, nil
}

// replicaRuntime is the Go runtime settings of each replica, as an
// operator sets them in the environment of processes that share a host.
type replicaRuntime struct {
	Procs   int    // GOMAXPROCS; 0: Go's default, a P per core
	Godebug string // GODEBUG; "": Go's default
}

// sysmonAwake is the GODEBUG setting that keeps the Go runtime's sysmon
// thread out of its deep sleep. schedtrace=X makes sysmon print a line to
// standard error every X ms and never sleep deeply; at its largest value
// (about 24.8 days of the host's uptime, so one line at most that often)
// what is left is a sysmon that backs off to one wake-up every 10 ms
// when it finds nothing to do. Without it, a process with one P that
// idles between requests sends sysmon to its deep sleep each time; the
// first system call after the sleep wakes it, and it then polls every 20
// µs for a millisecond: thousands of wake-ups a second, each a
// nanosleep and two context switches (BENCHMARKS.md, "Session 22").
// Go has no other setting for it.
const sysmonAwake = "schedtrace=2147483647"

// defaultReplicaRuntime is the settings of each of n replicas sharing
// this machine with Redis and the load generator. GOMAXPROCS is its share
// of the cores, at least one, as an operator sets it for processes sharing
// a host (Go reads a container's CPU limit itself): with Go's default
// every replica runs a P per core, and on two cores three replicas then
// spend their CPU in the scheduler, idle Ps spinning and a thread woken
// for each goroutine readied, as the profiles in BENCHMARKS.md show. With
// one P each, sysmonAwake.
func defaultReplicaRuntime(n int) replicaRuntime {
	return replicaRuntime{Procs: max(1, runtime.NumCPU()/n), Godebug: sysmonAwake}
}

// env is rt as environment variables, for startDaemonEnv.
func (rt replicaRuntime) env() []string {
	var env []string
	if rt.Procs > 0 {
		env = append(env, "GOMAXPROCS="+strconv.Itoa(rt.Procs))
	}
	if rt.Godebug != "" {
		env = append(env, "GODEBUG="+rt.Godebug)
	}
	return env
}

// String is rt as the sweep's header prints it.
func (rt replicaRuntime) String() string {
	procs, godebug := "Go's default", "Go's default"
	if rt.Procs > 0 {
		procs = strconv.Itoa(rt.Procs)
	}
	if rt.Godebug != "" {
		godebug = rt.Godebug
	}
	return fmt.Sprintf("GOMAXPROCS %s, GODEBUG %s", procs, godebug)
}

// startReplica starts replica i (again) on the fleet's Redis.
func (f *replicaFleet) startReplica(i int) error {
	args := []string{"--store", f.redis.url(), "--store-timeout", f.storeTimeout.String(), "--admin-token-file", f.tokenFile}
	if f.slowRequest > 0 {
		args = append(args, "--slow-request", f.slowRequest.String())
	}
	d, err := startDaemonEnv(f.bin, filepath.Join(f.dir, fmt.Sprintf("replica-%d.db", i)), f.rt.env(), args...)
	if err != nil {
		return fmt.Errorf("replica %d: %w", i, err)
	}
	f.reps[i] = d
	return nil
}

// takeSlow sums the live replicas' slow requests logged since the last
// call (see daemonLog.takeSlow).
func (f *replicaFleet) takeSlow() slowRequests {
	var sum slowRequests
	for _, d := range f.reps {
		if d != nil {
			sum.merge(d.log.takeSlow())
		}
	}
	return sum
}

// histSample is a histogram read from the live replicas' metrics pages,
// summed over them: samples at or under each finite bound, and in all.
type histSample struct {
	le    map[float64]float64
	count float64
}

// sampleHist reads the histogram name from every live replica; nil when
// one does not answer or has no such series (a policyd built before it).
func (f *replicaFleet) sampleHist(ctx context.Context, name string) *histSample {
	sum := &histSample{le: map[float64]float64{}}
	for _, d := range f.reps {
		if d == nil {
			continue
		}
		le, count, err := scrapeBuckets(ctx, d.metrics, name)
		if err != nil || len(le) == 0 {
			return nil
		}
		for b, n := range le {
			sum.le[b] += n
		}
		sum.count += count
	}
	return sum
}

// over is how many samples since earlier lie above the largest bound at
// or under limit, that bound, and how many samples there were in all.
func (h *histSample) over(earlier *histSample, limit float64) (over, bound, all float64) {
	le := map[float64]float64{}
	for b, n := range h.le {
		le[b] = n - earlier.le[b]
	}
	all = h.count - earlier.count
	over, bound = bucketsOver(le, all, limit)
	return over, bound, all
}

// addrs is the live replicas' addresses, comma-separated, for dial.
func (f *replicaFleet) addrs() string {
	var a []string
	for _, d := range f.reps {
		if d != nil {
			a = append(a, d.addr)
		}
	}
	return strings.Join(a, ",")
}

// pids are the live replicas' process ids.
func (f *replicaFleet) pids() []int {
	var p []int
	for _, d := range f.reps {
		if d != nil {
			p = append(p, d.pid())
		}
	}
	return p
}

// stop ends every replica (SIGTERM, then SIGKILL) and Redis.
func (f *replicaFleet) stop() {
	var wg sync.WaitGroup
	for _, d := range f.reps {
		if d != nil {
			wg.Add(1)
			go func() { defer wg.Done(); _ = d.stop() }()
		}
	}
	wg.Wait()
	if f.redis != nil {
		f.redis.close()
	}
}

// cpuOf sums the CPU time of pids; ok is false when one cannot be read.
func cpuOf(pids []int) (time.Duration, bool) {
	var sum time.Duration
	for _, p := range pids {
		t, err := cpuTime(p)
		if err != nil {
			return 0, false
		}
		sum += t
	}
	return sum, true
}

// waitAdmin retries a read of the admin service until it answers, for at
// most limit: a replica whose Redis just came back.
func waitAdmin(ctx context.Context, admin pb.AdminServiceClient, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := admin.ListBreakers(cctx, &pb.ListBreakersRequest{Tenant: "bench-t0", PageSize: 1})
		cancel()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// rpcRecorder counts the unary RPCs of a connection, by method and by
// period (before a fault, during it, after it): answers with their
// latencies, and errors by code. It is safe for concurrent use.
type rpcRecorder struct {
	mu      sync.Mutex
	period  int
	names   []string
	answers []map[string]*hist
	errs    []map[string]map[codes.Code]int
	slow    []int                 // answers and errors that took longer than slowAfter
	slowest []slowCall            // the slowest call of each period
	first   map[codes.Code]string // the first message of each error code
	// slowAfter is the decision timeout of the clients.
	slowAfter time.Duration
}

// slowCall is a period's slowest call: how long it took and what it was.
type slowCall struct {
	took time.Duration
	what string
}

func newRPCRecorder(slowAfter time.Duration, periods ...string) *rpcRecorder {
	r := &rpcRecorder{names: periods, slowAfter: slowAfter, slow: make([]int, len(periods)), slowest: make([]slowCall, len(periods)),
		first: map[codes.Code]string{}}
	for range periods {
		r.answers = append(r.answers, map[string]*hist{})
		r.errs = append(r.errs, map[string]map[codes.Code]int{})
	}
	return r
}

// next moves to the next period.
func (r *rpcRecorder) next() {
	r.mu.Lock()
	r.period = min(r.period+1, len(r.names)-1)
	r.mu.Unlock()
}

// interceptor records every unary call of the connection in the period
// it started in.
func (r *rpcRecorder) interceptor() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		r.mu.Lock()
		p := r.period
		r.mu.Unlock()
		t0 := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		took := time.Since(t0)
		m := method[strings.LastIndexByte(method, '/')+1:]
		r.mu.Lock()
		defer r.mu.Unlock()
		if took > r.slowAfter {
			r.slow[p]++
		}
		if took > r.slowest[p].took {
			r.slowest[p] = slowCall{took: took, what: server.DescribeCall(m, req, reply, err)}
		}
		if err != nil {
			if r.errs[p][m] == nil {
				r.errs[p][m] = map[codes.Code]int{}
			}
			code := status.Code(err)
			r.errs[p][m][code]++
			if _, ok := r.first[code]; !ok {
				r.first[code] = m + ": " + status.Convert(err).Message()
			}
			return err
		}
		if r.answers[p][m] == nil {
			r.answers[p][m] = new(hist)
		}
		r.answers[p][m].record(took)
		return nil
	})
}

// summary prints one line per period and method.
func (r *rpcRecorder) summary(indent string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for p, name := range r.names {
		fmt.Fprintf(&b, "%s%-8s calls slower than %v: %d\n", indent, name, r.slowAfter, r.slow[p])
		for _, m := range []string{"Admit", "NextDelay", "ReportOutcome"} {
			h := r.answers[p][m]
			if h == nil {
				h = new(hist)
			}
			var errs []string
			nerr := 0
			for c, n := range r.errs[p][m] {
				errs = append(errs, fmt.Sprintf("%s %d", c, n))
				nerr += n
			}
			if h.n == 0 && nerr == 0 {
				continue
			}
			fmt.Fprintf(&b, "%s  %-13s answered %6d (p50 %s, p99 %s, max %s)  errors %d %v\n", indent, m, h.n,
				fmtUs(us(h.quantile(0.5))), fmtUs(us(h.quantile(0.99))), fmtUs(us(time.Duration(h.max))), nerr, errs)
		}
		if s := r.slowest[p]; s.took > 0 {
			fmt.Fprintf(&b, "%s  slowest: %s, %s\n", indent, s.what, fmtUs(us(s.took)))
		}
	}
	for _, c := range slices.Sorted(maps.Keys(r.first)) {
		fmt.Fprintf(&b, "%sfirst %s: %s\n", indent, c, r.first[c])
	}
	return b.String()
}

// totals returns answers, errors and slow calls of period p over every method.
func (r *rpcRecorder) totals(p int) (answers, errors, slow int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.answers[p] {
		answers += int(h.n)
	}
	for _, m := range r.errs[p] {
		for _, n := range m {
			errors += n
		}
	}
	return answers, errors, r.slow[p]
}
