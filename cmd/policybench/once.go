package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// onceConfig is what `policybench once` is told by its flags.
type onceConfig struct {
	Mode           string // bbolt or redis
	Policyd        string
	Docs           int
	Workers        int
	Concurrency    int
	Overlap        float64
	Faults         upstreamFaults
	Latency        time.Duration
	KillAfter      float64 // share of documents written before the kill
	Down           time.Duration
	RestartReplica bool
	Sync           string
	FlushInterval  time.Duration
	StoreTimeout   time.Duration
	AttemptTimeout time.Duration
	Dedupes        bool
	KeepAlive      bool
	RequireClaim   bool
	Timeout        time.Duration
	Seed           uint64
	Keep           bool
}

const (
	onceTenant = "once"
	onceTarget = "upstream"
)

func onceCmd() *cobra.Command {
	var cfg onceConfig
	cmd := &cobra.Command{
		Use:   "once",
		Short: "Exactly once across worker processes: policyd (or a replica) SIGKILLed mid-batch, every write reconciled",
		Long: `once starts a fake upstream on loopback that records every write by its
idempotency key (a write with a key it already has a record of is a
duplicate: counted, and answered as the first write was), and that refuses
--fail503 of the writes with a 503 before applying them, resets the
connection after applying --lose of them, answers 504 after applying
--apply504 of them and never answers --hang of them (the attempt times out).

It opens a run and starts --workers worker processes (this binary again),
each with --concurrency goroutines, submitting --docs documents through the
Go client (policyclient Do; a non-idempotent POST whose idempotency key is
the document id, so the client claims the key in policyd's idempotency
ledger before every attempt). Each document is one worker's; --overlap
gives a share of them to the next worker too, so two workers race on one
key.

--mode bbolt: one policyd on a bbolt file, SIGKILLed once --kill-after of
the documents are written, and started again on the same file and port
after --down. --mode redis: redis-server (appendonly yes, appendfsync
always) and three policyd replicas on it, the clients given all three
(DialReplicas); replica 0 is SIGKILLed at the same point (and started again
after --down with --restart-replica).

At the end it reconciles the upstream's records with the documents, the
workers' results, the run's ledger (GetRun), its call table (ListRunCalls)
and the keys' records (GetKey), prints them, and exits non-zero if a
document was written twice, or is neither written nor a dead letter in the
run's ledger, or a worker saw a success the upstream has no record of.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runOnce(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Mode, "mode", "bbolt", "bbolt (one daemon, killed and restarted) or redis (three replicas on one Redis, one killed)")
	f.StringVar(&cfg.Policyd, "policyd", "", "policyd binary (default: go build ./cmd/policyd)")
	f.IntVar(&cfg.Docs, "docs", 300, "documents in the batch")
	f.IntVar(&cfg.Workers, "workers", 3, "worker processes")
	f.IntVar(&cfg.Concurrency, "concurrency", 16, "goroutines per worker process")
	f.Float64Var(&cfg.Overlap, "overlap", 0, "share of documents also submitted by a second worker, racing on the key (0 to 1)")
	f.Float64Var(&cfg.Faults.Fail503, "fail503", 0.10, "share of writes refused with a 503, not applied")
	f.Float64Var(&cfg.Faults.Lose, "lose", 0.05, "share of writes applied whose connection is then reset before the answer")
	f.Float64Var(&cfg.Faults.Apply504, "apply504", 0.05, "share of writes applied and then answered 504")
	f.Float64Var(&cfg.Faults.Hang, "hang", 0.02, "share of writes applied and never answered (the attempt times out)")
	f.DurationVar(&cfg.Latency, "latency", 400*time.Millisecond, "the upstream's time to apply a write")
	f.Float64Var(&cfg.KillAfter, "kill-after", 1.0/3, "share of documents written upstream before the SIGKILL")
	f.DurationVar(&cfg.Down, "down", 3*time.Second, "bbolt: how long policyd stays down; redis: when to restart the replica (with --restart-replica)")
	f.BoolVar(&cfg.RestartReplica, "restart-replica", false, "redis: start the killed replica again on its port after --down")
	f.StringVar(&cfg.Sync, "sync", "group", "bbolt: policyd's --sync")
	f.DurationVar(&cfg.FlushInterval, "flush-interval", 100*time.Millisecond, "bbolt: policyd's --flush-interval")
	f.DurationVar(&cfg.StoreTimeout, "store-timeout", 50*time.Millisecond, "redis: the replicas' --store-timeout")
	f.DurationVar(&cfg.AttemptTimeout, "attempt-timeout", 2*time.Second, "the policy's (and the clients') attempt timeout")
	f.BoolVar(&cfg.Dedupes, "upstream-dedupes", false, "set the policy's upstream_dedupes_by_key: a lost outcome is retried (the upstream's duplicates are then by design)")
	f.BoolVar(&cfg.KeepAlive, "keepalive", false, "the workers reuse connections to the upstream: net/http then sends a write whose reused connection was reset again by itself, beneath the client (a duplicate the ledger cannot see)")
	f.BoolVar(&cfg.RequireClaim, "require-claim", false, "the workers' clients make no attempt without a claim (policyclient Config.RequireClaim): dead letters instead of writes without the ledger")
	f.DurationVar(&cfg.Timeout, "timeout", 2*time.Minute, "bound of the whole run")
	f.Uint64Var(&cfg.Seed, "seed", 1, "seed of the upstream's fault draws")
	f.BoolVar(&cfg.Keep, "keep", false, "keep the temporary directory (state file, AOF, logs) at the end")
	return cmd
}

// onceFleet is the policyd processes of a once run, each on a fixed
// loopback port so that a restart is found again by the clients.
type onceFleet struct {
	bin, dir  string
	redis     *redisProc
	addrs     []string
	dbs       []string
	extra     [][]string
	procs     []*daemon // nil while one is down
	tokenFile string
}

// start starts daemon i (again) on its port.
func (f *onceFleet) start(i int) error {
	d, err := startDaemon(f.bin, f.dbs[i], append(slices.Clone(f.extra[i]), "--listen", f.addrs[i])...)
	if err != nil {
		return err
	}
	f.procs[i] = d
	return nil
}

// kill SIGKILLs daemon i.
func (f *onceFleet) kill(i int) {
	f.procs[i].kill()
	f.procs[i] = nil
}

// live is the address of a daemon that is up.
func (f *onceFleet) live() string {
	for i, d := range f.procs {
		if d != nil {
			return f.addrs[i]
		}
	}
	return f.addrs[0]
}

func (f *onceFleet) stop() {
	for _, d := range f.procs {
		if d != nil {
			_ = d.stop()
		}
	}
	if f.redis != nil {
		f.redis.close()
	}
}

// startOnceFleet starts the daemons of mode in dir.
func startOnceFleet(ctx context.Context, cfg onceConfig, bin, dir string) (*onceFleet, error) {
	f := &onceFleet{bin: bin, dir: dir}
	n := 1
	if cfg.Mode == "redis" {
		n = 3
		f.tokenFile = filepath.Join(dir, "admin-token")
		raw := make([]byte, 16)
		_, _ = rand.Read(raw)
		if err := os.WriteFile(f.tokenFile, []byte(hex.EncodeToString(raw)+"\n"), 0o600); err != nil {
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
	}
	f.procs = make([]*daemon, n)
	for i := range n {
		port, err := freeLoopbackPort()
		if err != nil {
			f.stop()
			return nil, err
		}
		f.addrs = append(f.addrs, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		db := filepath.Join(dir, fmt.Sprintf("policyd-%d.db", i))
		f.dbs = append(f.dbs, db)
		if cfg.Mode == "redis" {
			f.extra = append(f.extra, []string{"--store", f.redis.url(), "--store-timeout", cfg.StoreTimeout.String(),
				"--admin-token-file", f.tokenFile})
		} else {
			f.tokenFile = db + ".admin-token"
			f.extra = append(f.extra, []string{"--sync", cfg.Sync, "--flush-interval", cfg.FlushInterval.String()})
		}
		if err := f.start(i); err != nil {
			f.stop()
			return nil, fmt.Errorf("policyd %d: %w", i, err)
		}
	}
	return f, nil
}

func runOnce(ctx context.Context, cfg onceConfig, out io.Writer) error {
	switch {
	case cfg.Mode != "bbolt" && cfg.Mode != "redis":
		return fmt.Errorf("--mode: %q is neither bbolt nor redis", cfg.Mode)
	case cfg.Docs < 1 || cfg.Workers < 1 || cfg.Concurrency < 1:
		return errors.New("--docs, --workers and --concurrency must be >= 1")
	case cfg.Overlap < 0 || cfg.Overlap > 1:
		return errors.New("--overlap must be in [0, 1]")
	case cfg.KillAfter <= 0 || cfg.KillAfter >= 1:
		return errors.New("--kill-after must be in (0, 1)")
	}
	if err := cfg.Faults.check(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "policybench-once")
	if err != nil {
		return err
	}
	if cfg.Keep {
		fmt.Fprintln(out, "keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	bin, err := policydBinary(cfg.Policyd, dir)
	if err != nil {
		return err
	}
	up, err := startWritesUpstream(cfg.Faults, cfg.Latency, cfg.Seed)
	if err != nil {
		return err
	}
	defer up.close()
	fl, err := startOnceFleet(ctx, cfg, bin, dir)
	if err != nil {
		return err
	}
	defer fl.stop()
	token, err := readToken(fl.tokenFile)
	if err != nil {
		return err
	}
	runID, err := onceSetup(ctx, cfg, fl, token)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	where := "policyd on a bbolt file (--sync " + cfg.Sync + ", --flush-interval " + cfg.FlushInterval.String() + ") at " + fl.addrs[0]
	if cfg.Mode == "redis" {
		where = fmt.Sprintf("3 policyd replicas %s on redis-server %s (appendfsync always, --store-timeout %s)",
			strings.Join(fl.addrs, ","), fl.redis.addr(), cfg.StoreTimeout)
	}
	fmt.Fprintf(out, "once (%s): %d documents, %d worker processes x %d goroutines, overlap %.2f; %s\n",
		cfg.Mode, cfg.Docs, cfg.Workers, cfg.Concurrency, cfg.Overlap, where)
	fmt.Fprintf(out, "  upstream %s: latency %s; 503 not applied %.0f%%, applied then connection reset %.0f%%, applied then 504 %.0f%%, applied then no answer %.0f%%\n",
		up.addr, cfg.Latency, 100*cfg.Faults.Fail503, 100*cfg.Faults.Lose, 100*cfg.Faults.Apply504, 100*cfg.Faults.Hang)
	fmt.Fprintf(out, "  policy: non-idempotent calls with a key, attempt timeout %s, max attempts 5, upstream_dedupes_by_key %v; client RequireClaim %v; run %s\n",
		cfg.AttemptTimeout, cfg.Dedupes, cfg.RequireClaim, runID)

	start := time.Now()
	var children []*onceChild
	for w := range cfg.Workers {
		ch, err := startOnceChild(onceWorkerConfig{Addrs: fl.addrs, Upstream: up.url(), Tenant: onceTenant, Target: onceTarget,
			Run: runID, Docs: cfg.Docs, Worker: w, Workers: cfg.Workers, Overlap: cfg.Overlap, Concurrency: cfg.Concurrency,
			AttemptTimeout: cfg.AttemptTimeout, KeepAlive: cfg.KeepAlive,
			RequireClaim: cfg.RequireClaim})
		if err != nil {
			for _, c := range children {
				c.kill()
			}
			return err
		}
		children = append(children, ch)
	}
	faultCtx, stopFault := context.WithCancel(ctx)
	var faultLog []string
	var faultErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		faultLog, faultErr = onceFault(faultCtx, cfg, fl, up, up.epoch)
	}()
	var childErrs []string
	for i, ch := range children {
		select {
		case err := <-ch.done:
			if err != nil {
				childErrs = append(childErrs, fmt.Sprintf("worker %d: %v\n%s", i, err, tail(ch.stderr.String(), 10)))
			}
		case <-ctx.Done():
			ch.kill()
			<-ch.done
			childErrs = append(childErrs, fmt.Sprintf("worker %d: killed at --timeout %s", i, cfg.Timeout))
		}
	}
	wall := time.Since(start)
	stopFault()
	wg.Wait()
	for _, l := range faultLog {
		fmt.Fprintln(out, "  "+l)
	}
	if faultErr != nil {
		return fmt.Errorf("fault: %w", faultErr)
	}
	for _, e := range childErrs {
		fmt.Fprintln(out, "  WORKER FAILED:", e)
	}
	var subs []submission
	var stats []onceWorkerEnd
	logged := map[string]int{}
	for _, ch := range children {
		for k, n := range ch.logged() {
			logged[k] += n
		}
		subs = append(subs, ch.subs...)
		if ch.end != nil {
			stats = append(stats, *ch.end)
		}
	}
	fmt.Fprintf(out, "  the workers' clients logged (warnings and errors, by cause):\n")
	for _, k := range slices.Sorted(maps.Keys(logged)) {
		fmt.Fprintf(out, "  %6d  %s\n", logged[k], k)
	}
	return onceReconcile(ctx, cfg, fl, up, token, runID, subs, stats, wall, out)
}

// onceSetup sets the tenant's policy and budget and opens the run. Admin
// writes are refused (UNAVAILABLE) while a replica's store is slow: each
// is tried again, for up to 15 s.
func onceSetup(ctx context.Context, cfg onceConfig, fl *onceFleet, token string) (string, error) {
	conn, err := dial(strings.Join(fl.addrs, ","), token)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	admin := pb.NewAdminServiceClient(conn)
	attempts, minCalls, factor := uint32(5), uint32(4_000_000_000), 2.0
	// The breaker must not open on the upstream's faults: failure-rate
	// mode that never has enough calls; what ends a call is the ledger,
	// the attempts and the budget.
	pol := &pb.Policy{
		MaxAttempts: &attempts, AttemptTimeout: durationpb.New(cfg.AttemptTimeout), IdempotencyTtl: durationpb.New(time.Hour),
		UpstreamDedupesByKey: cfg.Dedupes,
		Backoff: &pb.BackoffSettings{BaseDelay: durationpb.New(100 * time.Millisecond), Factor: &factor,
			MaxDelay: durationpb.New(time.Second)},
		Breaker: &pb.BreakerSettings{Mode: pb.BreakerMode_BREAKER_MODE_FAILURE_RATE, MinCalls: &minCalls}}
	if err := retryUnavailable(ctx, func(ctx context.Context) error {
		_, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: onceTenant, Target: onceTarget, Policy: pol})
		return err
	}); err != nil {
		return "", fmt.Errorf("SetPolicy: %w", err)
	}
	if err := retryUnavailable(ctx, func(ctx context.Context) error {
		_, err := admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: onceTenant, Capacity: 100_000}})
		return err
	}); err != nil {
		return "", fmt.Errorf("SetTenantBudget: %w", err)
	}
	runID := fmt.Sprintf("once-%s-%x", cfg.Mode, time.Now().UnixNano())
	cutoff := timestamppb.New(time.Now().Add(cfg.Timeout + time.Minute))
	if err := retryUnavailable(ctx, func(ctx context.Context) error {
		_, err := admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: runID, Tenant: onceTenant, RetryPool: uint64(3 * cfg.Docs),
			CutoffTime: cutoff, Description: "policybench once"})
		if status.Code(err) == codes.AlreadyExists {
			return nil // an earlier try opened it, unanswered
		}
		return err
	}); err != nil {
		return "", fmt.Errorf("OpenRun: %w", err)
	}
	return runID, nil
}

// retryUnavailable calls write until it returns anything but UNAVAILABLE
// or 15 s have passed.
func retryUnavailable(ctx context.Context, write func(context.Context) error) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := write(ctx)
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// onceFault waits until the share cfg.KillAfter of the documents are
// written upstream, SIGKILLs policyd (bbolt) or replica 0 (redis), and
// starts it again after cfg.Down (bbolt always; redis with
// --restart-replica). It returns what it did, one line per step.
func onceFault(ctx context.Context, cfg onceConfig, fl *onceFleet, up *writesUpstream, start time.Time) ([]string, error) {
	var log []string
	at := func(format string, a ...any) {
		log = append(log, fmt.Sprintf("t=%5.2fs ", time.Since(start).Seconds())+fmt.Sprintf(format, a...))
	}
	want := int(float64(cfg.Docs)*cfg.KillAfter + 0.5)
	for up.created() < want {
		if ctx.Err() != nil {
			at("the workers ended before %d documents were written: no kill", want)
			return log, nil
		}
		sleepCtx(ctx, 5*time.Millisecond)
	}
	victim := fl.procs[0]
	pid := victim.pid()
	killAt := time.Now()
	fl.kill(0)
	if cfg.Mode == "bbolt" {
		up.markDown(killAt, time.Time{})
		at("%d documents written upstream: SIGKILL policyd (pid %d)", up.created(), pid)
	} else {
		at("%d documents written upstream: SIGKILL replica 0 %s (pid %d); replicas %s stay", up.created(), fl.addrs[0], pid,
			strings.Join(fl.addrs[1:], ","))
	}
	if cfg.Mode == "redis" && !cfg.RestartReplica {
		return log, nil
	}
	sleepCtx(ctx, cfg.Down)
	if ctx.Err() != nil && cfg.Mode == "redis" {
		return log, nil
	}
	// bbolt: start it again even when the workers are done, for the
	// reconciliation's reads.
	if err := fl.start(0); err != nil {
		return log, err
	}
	if cfg.Mode == "bbolt" {
		up.markDown(time.Time{}, time.Now())
		at("policyd serving again on the same file and port (pid %d), down %s", fl.procs[0].pid(), time.Since(killAt).Round(time.Millisecond))
	} else {
		at("replica 0 serving again on %s (pid %d)", fl.addrs[0], fl.procs[0].pid())
	}
	return log, nil
}

// ledgerTotal is the number of final dispositions a run's ledger counts.
func ledgerTotal(l *pb.RunLedger) uint64 {
	return l.GetSucceeded() + l.GetFailedTerminal() + l.GetDeadLetterExhausted() + l.GetDeadLetterBudget() +
		l.GetDeadLetterNotIdempotent() + l.GetDeadLetterPushback() + l.GetCircuitOpen() + l.GetDeadlineCut() +
		l.GetDeadLetterDeadline()
}

// enumName is an API enum value's name without its prefix, lower case:
// DISPOSITION_DEAD_LETTER -> dead_letter.
func enumName(v fmt.Stringer, prefix string) string {
	return strings.ToLower(strings.TrimPrefix(v.String(), prefix))
}

// onceReconcile reads the run's ledger, call table and key records,
// reconciles them with the upstream and the workers, and prints it all.
func onceReconcile(ctx context.Context, cfg onceConfig, fl *onceFleet, up *writesUpstream, token, runID string,
	subs []submission, stats []onceWorkerEnd, wall time.Duration, out io.Writer) error {
	conn, err := dial(fl.live(), token)
	if err != nil {
		return err
	}
	defer conn.Close()
	admin, workers := pb.NewAdminServiceClient(conn), pb.NewRetryPolicyServiceClient(conn)
	// The workers flushed their outcomes before exiting; the ledger may
	// still be a group commit behind.
	var run *pb.Run
	for deadline := time.Now().Add(5 * time.Second); ; {
		err := retryRead(ctx, func(ctx context.Context) error {
			r, err := admin.GetRun(ctx, &pb.GetRunRequest{RunId: runID})
			run = r.GetRun()
			return err
		})
		if err != nil {
			return fmt.Errorf("GetRun: %w", err)
		}
		if ledgerTotal(run.GetLedger()) >= uint64(len(subs)) || time.Now().After(deadline) {
			break
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	var calls []ledgerCall
	var untracked uint64
	for tok := ""; ; {
		var resp *pb.ListRunCallsResponse
		err := retryRead(ctx, func(ctx context.Context) (err error) {
			resp, err = admin.ListRunCalls(ctx, &pb.ListRunCallsRequest{RunId: runID, PageSize: 1000, PageToken: tok})
			return err
		})
		if err != nil {
			return fmt.Errorf("ListRunCalls: %w", err)
		}
		untracked = resp.GetUntracked()
		for _, c := range resp.GetCalls() {
			calls = append(calls, ledgerCall{CallID: c.GetCallId(), Doc: c.GetTriageRef(),
				Disposition: enumName(c.GetDisposition(), "DISPOSITION_"),
				StopReason:  strings.TrimPrefix(c.GetStopReason().String(), "STOP_REASON_"), Detail: c.GetLastDetail()})
		}
		if tok = resp.GetNextPageToken(); tok == "" {
			break
		}
	}
	for i := range calls {
		if calls[i].StopReason == "UNSPECIFIED" {
			calls[i].StopReason = ""
		}
		if calls[i].Disposition == "unspecified" {
			calls[i].Disposition = ""
		}
	}
	docs := make([]string, cfg.Docs)
	for i := range docs {
		docs[i] = docName(i)
	}
	keyState := map[string]string{}
	for _, d := range docs {
		var st string
		err := retryRead(ctx, func(ctx context.Context) error {
			r, err := workers.GetKey(ctx, &pb.GetKeyRequest{Tenant: onceTenant, IdempotencyKey: d})
			if err != nil {
				if status.Code(err) == codes.NotFound {
					st = "not found"
					return nil
				}
				return err
			}
			st = enumName(r.GetRecord().GetState(), "KEY_STATE_")
			return nil
		})
		if err != nil {
			return fmt.Errorf("GetKey %s: %w", d, err)
		}
		keyState[d] = st
	}
	records, requests, downRequests, outcomes := up.snapshot()
	byState := map[string]int{}
	for d, st := range keyState {
		if _, ok := records[d]; ok {
			byState[st+" (written)"]++
		} else {
			byState[st+" (not written)"]++
		}
	}
	rep := reconcileOnce(docs, records, subs, calls)

	fmt.Fprintf(out, "\nupstream: %d write requests (%d while policyd was down), by outcome:\n", requests, downRequests)
	for _, k := range slices.Sorted(maps.Keys(outcomes)) {
		fmt.Fprintf(out, "  %6d  %s\n", outcomes[k], k)
	}
	workerDisp := map[string]int{}
	var local, dedup int
	for _, s := range subs {
		k := s.Disposition
		if s.StopReason != "" {
			k += " (" + s.StopReason + ")"
		}
		workerDisp[k]++
		if s.Local {
			local++
		}
	}
	fmt.Fprintf(out, "workers: %d calls, by how they ended:\n", len(subs))
	for _, k := range slices.Sorted(maps.Keys(workerDisp)) {
		fmt.Fprintf(out, "  %6d  %s\n", workerDisp[k], k)
	}
	var st struct{ attempts, local, admits, dropped, dedup uint64 }
	for _, s := range stats {
		st.attempts += s.Stats.Attempts
		st.local += s.Stats.LocalDecisions
		st.admits += s.Stats.AdmitRPCs
		st.dropped += s.Stats.OutcomesDropped
		st.dedup += s.Stats.Deduplicated
	}
	dedup = int(st.dedup)
	fmt.Fprintf(out, "  client counters (%d processes): attempts %d, local decisions %d (calls with one: %d), Admit RPCs %d, outcomes dropped %d, deduplicated %d\n",
		len(stats), st.attempts, st.local, local, st.admits, st.dropped, dedup)
	l := run.GetLedger()
	fmt.Fprintf(out, "run ledger (GetRun %s): %d final dispositions; succeeded %d (deduplicated %d), failed_terminal %d, dead_letter: exhausted %d, not_idempotent %d, deadline %d, budget %d, pushback %d; circuit_open %d, deadline_cut %d; retries spent %d of %d\n",
		runID, ledgerTotal(l), l.GetSucceeded(), l.GetDeduplicated(), l.GetFailedTerminal(), l.GetDeadLetterExhausted(),
		l.GetDeadLetterNotIdempotent(), l.GetDeadLetterDeadline(), l.GetDeadLetterBudget(), l.GetDeadLetterPushback(),
		l.GetCircuitOpen(), l.GetDeadlineCut(), run.GetRetriesSpent(), run.GetRetryPool())
	fmt.Fprintf(out, "idempotency records (GetKey, all %d documents):", len(docs))
	for _, k := range slices.Sorted(maps.Keys(byState)) {
		fmt.Fprintf(out, " %s %d;", k, byState[k])
	}
	fmt.Fprintln(out)

	fmt.Fprintf(out, "\nreconciliation:\n")
	fmt.Fprintf(out, "  documents submitted:               %d (%d calls)\n", rep.Documents, rep.Submissions)
	fmt.Fprintf(out, "  distinct records created upstream: %d\n", rep.Records)
	fmt.Fprintf(out, "  duplicate writes upstream:         %d %v (goal 0)\n", rep.Duplicates, rep.DuplicateDocs)
	if rep.Duplicates > 0 {
		fmt.Fprintf(out, "    of which sent while policyd was down (the client goes on without the ledger; [down] below): %d\n",
			up.duplicatesWhileDown())
	}
	bySub := map[string][]submission{}
	for _, s := range subs {
		bySub[s.Doc] = append(bySub[s.Doc], s)
	}
	for i, d := range rep.DuplicateDocs {
		if i == 10 {
			fmt.Fprintf(out, "    ... %d more\n", len(rep.DuplicateDocs)-i)
			break
		}
		var ends []string
		for _, s := range bySub[d] {
			ends = append(ends, fmt.Sprintf("%s %s after %d attempts, local %v", s.CallID, s.Disposition, s.Attempts, s.Local))
		}
		fmt.Fprintf(out, "    %s: upstream %v; worker %v\n", d, up.historyOf(d), ends)
	}
	fmt.Fprintf(out, "  upstream calls saved by SUCCEEDED claims: %d\n", rep.Deduplicated)
	fmt.Fprintf(out, "  written, but no worker saw success (answers lost): %d\n", len(rep.WrittenNotSucceeded))
	fmt.Fprintf(out, "  written without any claim (no idempotency record: the client went on without the ledger): %d\n",
		byState["not found (written)"])
	fmt.Fprintf(out, "  documents without a record:        %d, each in the ledger (ListRunCalls) as:\n", len(rep.Unwritten))
	for _, u := range rep.Unwritten {
		dl := u.DeadLetter
		if dl == "" {
			dl = "NOT A DEAD LETTER IN THE LEDGER"
		}
		fmt.Fprintf(out, "    %s  %s  (workers: %s)\n", u.Doc, dl, u.Worker)
	}
	if len(rep.SucceededUnwritten) > 0 {
		fmt.Fprintf(out, "  SUCCEEDED WITHOUT A RECORD: %v\n", rep.SucceededUnwritten)
	}
	fmt.Fprintf(out, "  run call table (ListRunCalls): %d calls listed, %d untracked (beyond its cap)\n", len(calls), untracked)
	fmt.Fprintf(out, "  calls whose final disposition the call table lacks: %d %v; with another disposition than the worker's: %d %v\n",
		len(rep.LedgerMissing), rep.LedgerMissing, len(rep.LedgerDiffers), rep.LedgerDiffers)
	if rep.Foreign > 0 {
		fmt.Fprintf(out, "  records of keys that are no document's: %d\n", rep.Foreign)
	}
	fmt.Fprintf(out, "  wall time:                         %s\n", wall.Round(time.Millisecond))
	if !rep.OK() || len(subs) == 0 {
		verdict := fmt.Sprintf("%d duplicate writes, %d documents neither written nor dead-lettered, %d successes without a record",
			rep.Duplicates, len(rep.Unaccounted), len(rep.SucceededUnwritten))
		fmt.Fprintln(out, "verdict: FAIL:", verdict)
		return errors.New(verdict)
	}
	fmt.Fprintf(out, "verdict: PASS: every document written exactly once (%d) or dead-lettered with a reason (%d); 0 duplicates\n",
		rep.Records, len(rep.Unwritten))
	return nil
}
