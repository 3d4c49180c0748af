package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// slowWatchConfig is `policybench slowwatch`'s flags.
type slowWatchConfig struct {
	Policyd string
	Watches int
	Flips   int
	Writers int
	Read    bool
}

func slowWatchCmd() *cobra.Command {
	var cfg slowWatchConfig
	cmd := &cobra.Command{
		Use:   "slowwatch",
		Short: "Flip breakers under WatchBreakers clients that never read; measure policyd's RSS",
		Long: `slowwatch builds policyd (or runs --policyd), starts it on a temporary file,
opens --watches WatchBreakers streams, each on its own connection, that read
their snapshot and then nothing more, and flips breakers --flips times
(ForceBreaker OPEN, then CLOSED, over 100 breakers, from --writers admin
callers). It prints the daemon's RSS before and after, then reads every
stream to its end and prints how they ended: policyd cuts a watch that
falls a buffer behind with RESOURCE_EXHAUSTED and frees what it queued.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSlowWatch(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Policyd, "policyd", "", "the policyd binary to run (default: go build ./cmd/policyd)")
	f.IntVar(&cfg.Watches, "watches", 50, "WatchBreakers clients that never read")
	f.IntVar(&cfg.Flips, "flips", 15000, "breaker state changes")
	f.IntVar(&cfg.Writers, "writers", 16, "concurrent admin callers flipping breakers")
	f.BoolVar(&cfg.Read, "read", false, "the control: the watches read every change")
	return cmd
}

func runSlowWatch(ctx context.Context, cfg slowWatchConfig, out io.Writer) error {
	d, err := spawn(ctx, "slowwatch", cfg.Policyd)
	if err != nil {
		return err
	}
	defer d.close()
	admin := pb.NewAdminServiceClient(d.conn)
	// The breakers exist before the watches, so the snapshot holds them.
	key := func(i int) *pb.BreakerKey {
		return &pb.BreakerKey{Tenant: "slow", Target: fmt.Sprintf("upstream-%03d", i%100)}
	}
	for i := range 100 {
		if _, err := admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: key(i), State: pb.BreakerState_BREAKER_STATE_CLOSED}); err != nil {
			return fmt.Errorf("ForceBreaker: %w", err)
		}
	}
	before, err := readMem(d.pid())
	if err != nil {
		return err
	}

	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var streams []grpc.ServerStreamingClient[pb.WatchBreakersResponse]
	for i := range cfg.Watches {
		c, err := dial(d.addr, "")
		if err != nil {
			return err
		}
		defer c.Close()
		stream, err := pb.NewRetryPolicyServiceClient(c).WatchBreakers(wctx, &pb.WatchBreakersRequest{Tenant: "slow"})
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
		if cfg.Read {
			go func() {
				for {
					if _, err := stream.Recv(); err != nil {
						return
					}
				}
			}()
			continue
		}
		streams = append(streams, stream)
	}
	watching, err := readMem(d.pid())
	if err != nil {
		return err
	}

	t0 := time.Now()
	var next atomic.Int64
	var writers sync.WaitGroup
	errs := make(chan error, cfg.Writers)
	var peak atomic.Int64
	for range cfg.Writers {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for {
				n := int(next.Add(1)) - 1
				if n >= cfg.Flips {
					return
				}
				st := pb.BreakerState_BREAKER_STATE_OPEN
				if (n/100)%2 == 1 {
					st = pb.BreakerState_BREAKER_STATE_CLOSED
				}
				if _, err := admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: key(n), State: st}); err != nil {
					errs <- fmt.Errorf("ForceBreaker: %w", err)
					return
				}
				if n%500 == 0 {
					if m, err := readMem(d.pid()); err == nil && m.VmRSS > peak.Load() {
						peak.Store(m.VmRSS)
					}
				}
			}
		}()
	}
	writers.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	took := time.Since(t0)
	after, err := readMem(d.pid())
	if err != nil {
		return err
	}
	peak.Store(max(peak.Load(), after.VmRSS))

	ends := map[string]int{}
	for _, s := range streams {
		msgs := 0
		for {
			if _, err := s.Recv(); err != nil {
				st := status.Convert(err)
				ends[fmt.Sprintf("%s %q", st.Code(), st.Message())]++
				break
			}
			msgs++
		}
	}
	mb := func(m memStatus) string {
		return fmt.Sprintf("%.1f MB (anonymous %.1f MB, file %.1f MB)", float64(m.VmRSS)/(1<<20), float64(m.RssAnon)/(1<<20), float64(m.RssFile)/(1<<20))
	}
	reading := "that never read"
	if cfg.Read {
		reading = "that read every change"
	}
	fmt.Fprintf(out, "policyd slowwatch: %d WatchBreakers clients %s, %d breaker flips in %s\n", cfg.Watches, reading, cfg.Flips, took.Round(time.Millisecond))
	fmt.Fprintf(out, "  RSS before the watches:      %s\n", mb(before))
	fmt.Fprintf(out, "  RSS with the watches open:   %s\n", mb(watching))
	fmt.Fprintf(out, "  RSS after the flips:         %s; peak seen %.1f MB\n", mb(after), float64(peak.Load())/(1<<20))
	keys := make([]string, 0, len(ends))
	for k := range ends {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(out, "  watches ended with:          %d x %s\n", ends[k], k)
	}
	return nil
}
