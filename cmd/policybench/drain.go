package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// drainConfig is `policybench drain`'s flags.
type drainConfig struct {
	Policyd string
	Watches int
	Callers int
	Grace   time.Duration
	Sync    string
	Load    time.Duration
}

func drainCmd() *cobra.Command {
	var cfg drainConfig
	cmd := &cobra.Command{
		Use:   "drain",
		Short: "SIGTERM policyd with watch streams open and callers in flight; time its exit",
		Long: `drain builds policyd (or runs --policyd), starts it on a temporary file, opens
--watches WatchBreakers streams (each read to its snapshot, then followed),
starts --callers callers each looping NextDelay on a failing target, lets
them run for --load, then sends SIGTERM and measures:

  - the time from SIGTERM to the process's exit, against --grace;
  - how each watch stream ended (policyd ends them with UNAVAILABLE
    "draining") and when;
  - every unary call sent before the SIGTERM: answered, or cut. A cut one
    is a failure of the drain; calls sent after it are refused, as they
    should be.

It exits non-zero when a call sent before the SIGTERM was cut, or when
the daemon did not exit inside --grace.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDrain(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Policyd, "policyd", "", "the policyd binary to run (default: go build ./cmd/policyd)")
	f.IntVar(&cfg.Watches, "watches", 100, "WatchBreakers streams open at the SIGTERM")
	f.IntVar(&cfg.Callers, "callers", 64, "callers with a unary call in flight")
	f.DurationVar(&cfg.Grace, "grace", 10*time.Second, "policyd's --grace")
	f.StringVar(&cfg.Sync, "sync", "always", "policyd's --sync (always makes every NextDelay wait for an fsync, so calls are really in flight)")
	f.DurationVar(&cfg.Load, "load", 2*time.Second, "how long the callers run before the SIGTERM")
	return cmd
}

// unaryTally counts the unary calls of the drain run.
type unaryTally struct {
	beforeOK, beforeCut, afterOK, afterRefused atomic.Int64
	// inFlightOK counts the calls sent before the SIGTERM and answered
	// after it: the ones the drain let finish.
	inFlightOK atomic.Int64
	cutCodes   sync.Map // code string -> *atomic.Int64
}

func runDrain(ctx context.Context, cfg drainConfig, out io.Writer) error {
	dir, err := os.MkdirTemp("", "policybench-drain")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin, err := policydBinary(cfg.Policyd, dir)
	if err != nil {
		return err
	}
	d, err := startDaemon(bin, dir+"/policyd.db", "--sync", cfg.Sync, "--grace", cfg.Grace.String())
	if err != nil {
		return err
	}
	defer func() {
		select {
		case <-d.exited:
		default:
			d.kill()
		}
	}()

	// Watches on their own connections (as workers' would be), callers
	// sharing a few.
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	newConn := func() (pb.RetryPolicyServiceClient, error) {
		c, err := dial(d.addr, "")
		if err != nil {
			return nil, err
		}
		conns = append(conns, c)
		return pb.NewRetryPolicyServiceClient(c), nil
	}
	first, err := newConn()
	if err != nil {
		return err
	}
	if err := waitReady(ctx, first); err != nil {
		return fmt.Errorf("policyd not ready: %w", err)
	}

	var sigterm atomic.Pointer[time.Time]
	type watchEnd struct {
		code codes.Code
		msg  string
		at   time.Duration // after the SIGTERM
	}
	ends := make(chan watchEnd, cfg.Watches)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	for i := range cfg.Watches {
		cl, err := newConn()
		if err != nil {
			return err
		}
		stream, err := cl.WatchBreakers(wctx, &pb.WatchBreakersRequest{Tenant: fmt.Sprintf("drain-%d", i%8)})
		if err != nil {
			return err
		}
		for {
			msg, err := stream.Recv()
			if err != nil {
				return fmt.Errorf("watch %d snapshot: %w", i, err)
			}
			if msg.GetSnapshotComplete() {
				break
			}
		}
		go func() {
			for {
				if _, err := stream.Recv(); err != nil {
					st := status.Convert(err)
					var at time.Duration
					if t := sigterm.Load(); t != nil {
						at = time.Since(*t)
					}
					ends <- watchEnd{st.Code(), st.Message(), at}
					return
				}
			}
		}()
	}

	var tally unaryTally
	callerConns := make([]pb.RetryPolicyServiceClient, 4)
	for i := range callerConns {
		if callerConns[i], err = newConn(); err != nil {
			return err
		}
	}
	var callers sync.WaitGroup
	stopCallers := make(chan struct{})
	for i := range cfg.Callers {
		cl := callerConns[i%len(callerConns)]
		callers.Add(1)
		go func() {
			defer callers.Done()
			for n := 0; ; n++ {
				select {
				case <-stopCallers:
					return
				default:
				}
				sentBefore := sigterm.Load() == nil
				cctx, cancel := context.WithTimeout(ctx, cfg.Grace+5*time.Second)
				_, err := cl.NextDelay(cctx, &pb.NextDelayRequest{
					Call:    &pb.CallRef{Tenant: fmt.Sprintf("drain-%d", i%8), Target: "upstream", CallId: fmt.Sprintf("c%d-%d", i, n), Idempotent: true},
					Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}},
				})
				cancel()
				switch {
				case sentBefore && err == nil:
					tally.beforeOK.Add(1)
					if sigterm.Load() != nil {
						tally.inFlightOK.Add(1)
					}
				case sentBefore:
					tally.beforeCut.Add(1)
					v, _ := tally.cutCodes.LoadOrStore(status.Code(err).String()+": "+status.Convert(err).Message(), new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
				case err == nil:
					tally.afterOK.Add(1)
				default:
					tally.afterRefused.Add(1)
					return // the daemon is going; this caller is done
				}
			}
		}()
	}

	sleepCtx(ctx, cfg.Load)
	t0 := time.Now()
	sigterm.Store(&t0)
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	var exit time.Duration
	select {
	case <-d.exited:
		exit = time.Since(t0)
	case <-time.After(cfg.Grace + 5*time.Second):
		return fmt.Errorf("policyd did not exit within --grace (%s) + 5s of SIGTERM", cfg.Grace)
	}
	close(stopCallers)
	callers.Wait()

	byEnd := map[string]int{}
	var last time.Duration
	for range cfg.Watches {
		e := <-ends
		byEnd[e.code.String()+" "+fmt.Sprintf("%q", e.msg)]++
		last = max(last, e.at)
	}
	fmt.Fprintf(out, "policyd drain: %d watch streams, %d callers (NextDelay, --sync %s), --grace %s\n", cfg.Watches, cfg.Callers, cfg.Sync, cfg.Grace)
	fmt.Fprintf(out, "  exit after SIGTERM:          %s (%.1f%% of --grace)\n", exit.Round(time.Millisecond), 100*exit.Seconds()/cfg.Grace.Seconds())
	fmt.Fprintf(out, "  last watch stream ended:     %s after SIGTERM\n", last.Round(time.Microsecond))
	keys := make([]string, 0, len(byEnd))
	for k := range byEnd {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(out, "  watch streams ended with:    %d x %s\n", byEnd[k], k)
	}
	fmt.Fprintf(out, "  unary sent before SIGTERM:   %d answered (%d of them after it: in flight), %d cut\n",
		tally.beforeOK.Load(), tally.inFlightOK.Load(), tally.beforeCut.Load())
	fmt.Fprintf(out, "  unary sent after SIGTERM:    %d answered, %d refused\n", tally.afterOK.Load(), tally.afterRefused.Load())
	tally.cutCodes.Range(func(k, v any) bool {
		fmt.Fprintf(out, "    cut: %d x %s\n", v.(*atomic.Int64).Load(), k)
		return true
	})
	if d.waitErr != nil {
		fmt.Fprintf(out, "  policyd exit status: %v\n%s\n", d.waitErr, d.log.tail(5))
	}
	switch {
	case tally.beforeCut.Load() > 0:
		return errors.New("calls sent before the SIGTERM were cut")
	case exit >= cfg.Grace:
		return errors.New("policyd waited out the whole --grace")
	}
	return nil
}
