package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// diskfullConfig is what `policybench diskfull` is told by its flags.
type diskfullConfig struct {
	MaxDBBytes      int
	AuditMaxRecords int
	Policyd         string
	Hold            time.Duration
	Keep            bool
}

func diskfullCmd() *cobra.Command {
	var cfg diskfullConfig
	cmd := &cobra.Command{
		Use:   "diskfull",
		Short: "Fill policyd's file to its size cap, keep deciding, free space, and write again without a restart",
		Long: `diskfull builds policyd and starts it with a small --max-db-bytes (bbolt's
MaxSize) while callers keep asking for decisions. It then:

  1. fills the file with admin writes (policies) until one fails, which must
     be RESOURCE_EXHAUSTED;
  2. holds it full for --hold: every admin write is RESOURCE_EXHAUSTED, and
     Admit/NextDelay keep being answered (from memory; the group commits of
     counters fail and are retried);
  3. frees space by deleting most of the policies it wrote (admin deletes);
  4. writes again, on the same process: the writes must succeed, and the
     group commits must resume.

It prints what happened at each step and exits non-zero if a step fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDiskfull(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.MaxDBBytes, "max-db-bytes", 2<<20, "policyd's --max-db-bytes")
	f.IntVar(&cfg.AuditMaxRecords, "audit-max-records", 500, "policyd's --audit-max-records (the trail would otherwise fill the file by itself)")
	f.StringVar(&cfg.Policyd, "policyd", "", "policyd binary (default: go build ./cmd/policyd)")
	f.DurationVar(&cfg.Hold, "hold", 3*time.Second, "how long to keep the file full while deciding")
	f.BoolVar(&cfg.Keep, "keep", false, "keep the temporary directory at the end")
	return cmd
}

// decisionLoad counts decisions answered and failed, per stage.
type decisionLoad struct {
	stage    atomic.Int32
	ok, fail [4]atomic.Int64
	lastErr  atomic.Value
}

var stageNames = [4]string{"filling", "full", "freeing", "after"}

func (l *decisionLoad) run(ctx context.Context, workers pb.RetryPolicyServiceClient, i int) {
	g := newGen(i, 99)
	for ctx.Err() == nil {
		var err error
		if g.rng.IntN(2) == 0 {
			_, err = workers.Admit(ctx, g.admit())
		} else {
			_, err = workers.NextDelay(ctx, g.nextDelay())
		}
		s := l.stage.Load()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			l.fail[s].Add(1)
			l.lastErr.Store(err.Error())
		} else {
			l.ok[s].Add(1)
		}
		// A light load: the point is that decisions are answered, not speed.
		sleepCtx(ctx, time.Millisecond)
	}
}

// fillPolicy is a policy with long status tables (60 codes each), about
// 1 KiB stored.
func fillPolicy(n int) *pb.Policy {
	attempts := uint32(1 + n%100)
	p := &pb.Policy{MaxAttempts: &attempts}
	for c := uint32(400); c < 460; c++ {
		p.TerminalHttpStatuses = append(p.TerminalHttpStatuses, c)
	}
	for c := uint32(500); c < 560; c++ {
		p.TransientHttpStatuses = append(p.TransientHttpStatuses, c)
	}
	return p
}

func runDiskfull(ctx context.Context, cfg diskfullConfig, out io.Writer) error {
	dir, err := os.MkdirTemp("", "policybench-diskfull")
	if err != nil {
		return err
	}
	if !cfg.Keep {
		defer os.RemoveAll(dir)
	}
	bin, err := policydBinary(cfg.Policyd, dir)
	if err != nil {
		return err
	}
	db := dir + "/policyd.db"
	d, err := startDaemon(bin, db, "--max-db-bytes", fmt.Sprint(cfg.MaxDBBytes),
		"--audit-max-records", fmt.Sprint(cfg.AuditMaxRecords))
	if err != nil {
		return err
	}
	defer d.kill()
	pid := d.pid()
	tok, err := d.token()
	if err != nil {
		return err
	}
	conn, err := dial(d.addr, "")
	if err != nil {
		return err
	}
	defer conn.Close()
	aconn, err := dial(d.addr, tok)
	if err != nil {
		return err
	}
	defer aconn.Close()
	workers, admin := pb.NewRetryPolicyServiceClient(conn), pb.NewAdminServiceClient(aconn)
	if err := setupWorkload(ctx, admin); err != nil {
		return err
	}
	fmt.Fprintf(out, "diskfull: policyd pid %d, --max-db-bytes %d, --audit-max-records %d, file %s\n",
		pid, cfg.MaxDBBytes, cfg.AuditMaxRecords, db)

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var load decisionLoad
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() { defer wg.Done(); load.run(lctx, workers, i) }()
	}
	defer wg.Wait()
	defer cancel()
	fileSize := func() int64 {
		st, err := os.Stat(db)
		if err != nil {
			return -1
		}
		return st.Size()
	}
	flushStats := func() (commits, errs float64) {
		m, err := scrape(ctx, d.metrics, "policyd_store_commits_total", "policyd_store_flush_errors_total")
		if err != nil {
			return -1, -1
		}
		return m["policyd_store_commits_total"], m["policyd_store_flush_errors_total"]
	}
	var failed []string
	fail := func(format string, a ...any) {
		msg := fmt.Sprintf(format, a...)
		failed = append(failed, msg)
		fmt.Fprintln(out, "FAIL:", msg)
	}

	// 1. Fill.
	start := time.Now()
	var written []string
	var fullErr error
	for n := 0; n < 1_000_000 && time.Since(start) < 3*time.Minute; n++ {
		target := fmt.Sprintf("fill-%06d", n)
		_, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "diskfull", Target: target, Policy: fillPolicy(n)})
		if err != nil {
			fullErr = err
			break
		}
		written = append(written, target)
	}
	if fullErr == nil {
		return fmt.Errorf("the file never filled (%d writes, %d bytes)", len(written), fileSize())
	}
	fmt.Fprintf(out, "1. filled: %d policies written in %s, file %d bytes; write %d failed: %s: %s\n",
		len(written), time.Since(start).Round(time.Millisecond), fileSize(), len(written)+1,
		status.Code(fullErr), status.Convert(fullErr).Message())
	if status.Code(fullErr) != codes.ResourceExhausted {
		fail("the write past the cap failed with %s, want RESOURCE_EXHAUSTED", status.Code(fullErr))
	}

	// 2. Hold full: writes refused, decisions answered.
	load.stage.Store(1)
	c0, e0 := flushStats()
	var refused, otherErr, accepted int
	for t := time.Now(); time.Since(t) < cfg.Hold; sleepCtx(ctx, 100*time.Millisecond) {
		_, err := admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{
			Tenant: fmt.Sprintf("full-%d", refused+otherErr+accepted), Capacity: 10}})
		switch status.Code(err) {
		case codes.OK:
			accepted++
		case codes.ResourceExhausted:
			refused++
		default:
			otherErr++
			fmt.Fprintln(out, "   write while full:", err)
		}
	}
	c1, e1 := flushStats()
	ok, bad := load.ok[1].Load(), load.fail[1].Load()
	fmt.Fprintf(out, "2. full for %s: admin writes RESOURCE_EXHAUSTED %d, other errors %d, accepted %d; decisions answered %d, failed %d; group commits +%.0f, failed flushes +%.0f\n",
		cfg.Hold, refused, otherErr, accepted, ok, bad, c1-c0, e1-e0)
	if refused == 0 || otherErr > 0 {
		fail("while full, want every admin write RESOURCE_EXHAUSTED")
	}
	if ok == 0 || bad > 0 {
		fail("while full, decisions must keep being answered (answered %d, failed %d, last error %v)", ok, bad, load.lastErr.Load())
	}

	// 3. Free: delete most of what was written, oldest first.
	load.stage.Store(2)
	toDelete := written[:len(written)*3/4]
	var deleted, delFull int
	var delErr error
	for _, target := range toDelete {
		_, err := admin.DeletePolicy(ctx, &pb.DeletePolicyRequest{Tenant: "diskfull", Target: target})
		switch status.Code(err) {
		case codes.OK:
			deleted++
		case codes.ResourceExhausted:
			delFull++
			delErr = err
		default:
			return fmt.Errorf("DeletePolicy %s: %w", target, err)
		}
	}
	fmt.Fprintf(out, "3. freed: %d of %d deletes succeeded, %d refused as full (file stays %d bytes: bbolt reuses freed pages, it does not shrink)\n",
		deleted, len(toDelete), delFull, fileSize())
	if delFull > 0 {
		fail("deletes refused while full (%d, e.g. %v): space could not be freed without a restart", delFull, delErr)
	}

	// 4. Write again, same process.
	load.stage.Store(3)
	sleepCtx(ctx, 500*time.Millisecond) // a few group commits
	c2, e2 := flushStats()
	var again, againFail int
	var againErr error
	for n := range 200 {
		_, err := admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{
			Tenant: fmt.Sprintf("after-%04d", n), Capacity: float64(n + 1)}})
		if err != nil {
			againFail++
			againErr = err
			continue
		}
		again++
	}
	sleepCtx(ctx, 500*time.Millisecond)
	c3, e3 := flushStats()
	samePID := pidListening(d.addr) == pid
	fmt.Fprintf(out, "4. after freeing, same process (pid %d, unchanged: %v): %d of 200 admin writes succeeded; group commits +%.0f, failed flushes +%.0f over 1s; decisions answered %d, failed %d\n",
		pid, samePID, again, c3-c2, e3-e2, load.ok[3].Load(), load.fail[3].Load())
	if againFail > 0 {
		fail("%d writes failed after freeing space, e.g. %v", againFail, againErr)
	}
	if !samePID {
		fail("the daemon's pid changed")
	}
	if e3-e2 > 0 {
		fail("group commits still failing after freeing space")
	}
	cancel()
	wg.Wait()
	if err := d.stop(); err != nil {
		fail("graceful stop: %v", err)
	}
	if msg, err := runCheck(ctx, bin, db); err != nil {
		fail("policyd check: %v: %s", err, msg)
	} else {
		fmt.Fprintf(out, "5. stopped; policyd check: %s\n", msg)
	}
	if len(failed) > 0 {
		return errors.New("diskfull: " + fmt.Sprint(len(failed)) + " failures")
	}
	fmt.Fprintln(out, "diskfull: ok")
	return nil
}
