package main

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// rpc names a measured call.
type rpc int

const (
	rpcAdmit rpc = iota
	rpcNextDelay
	rpcReport
	rpcEchoUnary
	rpcEchoStream
	rpcRelease
	numRPC
)

var rpcNames = [numRPC]string{"Admit", "NextDelay", "ReportOutcome", "echo-unary", "echo-stream", "ReleaseLease"}

// tally is what calls measured: latencies of those answered and errors,
// by RPC, the outcomes accepted and the first error.
type tally struct {
	hists    [numRPC]*hist
	errs     [numRPC]uint64
	outcomes uint64
	firstErr error
}

// add counts o's calls in t too.
func (t *tally) add(o *tally) {
	for r := range numRPC {
		if o.hists[r] != nil {
			if t.hists[r] == nil {
				t.hists[r] = new(hist)
			}
			t.hists[r].merge(o.hists[r])
		}
		t.errs[r] += o.errs[r]
	}
	t.outcomes += o.outcomes
	if t.firstErr == nil {
		t.firstErr = o.firstErr
	}
}

// caller is one simulated worker: its request generator and what it
// measured while the window was open.
type caller struct {
	g  *gen
	on *atomic.Bool
	tally
}

// do times f as one call of r, counting it only while the window is open.
func (c *caller) do(r rpc, f func() error) error {
	t0 := time.Now()
	err := f()
	if c.on.Load() {
		if err != nil {
			c.errs[r]++
			if c.firstErr == nil {
				c.firstErr = err
			}
		} else {
			if c.hists[r] == nil {
				c.hists[r] = new(hist)
			}
			c.hists[r].record(time.Since(t0))
		}
	}
	return err
}

// window is what one phase measured: per RPC the merged histogram and
// errors, the CPU the server and this process used, and the counters read
// from the daemon's metrics.
type window struct {
	tally     // every caller's, while the window was open
	elapsed   time.Duration
	serverCPU time.Duration // -1: unknown
	clientCPU time.Duration
	commits   float64 // -1: unknown
}

// measure runs loop in n callers for warmup, then measures for d, then
// stops them. serverPID (0: unknown) is read for CPU; metrics (empty:
// none) for policyd's commit counter.
func measure(ctx context.Context, n int, warmup, d time.Duration, seed uint64, serverPID int, metrics string,
	loop func(ctx context.Context, c *caller)) window {
	return measureAround(ctx, n, warmup, d, seed, serverPID, metrics, loop, nil)
}

// measureAround is measure calling around(true) just before the window
// opens and around(false) just after it closes (nil: nothing), for
// readings of other processes over the same window.
func measureAround(ctx context.Context, n int, warmup, d time.Duration, seed uint64, serverPID int, metrics string,
	loop func(ctx context.Context, c *caller), around func(open bool)) window {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var on atomic.Bool
	callers := make([]*caller, n)
	var wg sync.WaitGroup
	for i := range callers {
		c := &caller{g: newGen(i, seed), on: &on}
		callers[i] = c
		wg.Add(1)
		go func() { defer wg.Done(); loop(ctx, c) }()
	}
	sleepCtx(ctx, warmup)

	w := window{serverCPU: -1, commits: -1}
	var srv0, self0 time.Duration
	var err error
	if serverPID > 0 {
		if srv0, err = cpuTime(serverPID); err != nil {
			serverPID = 0
		}
	}
	commits0 := commitsOf(ctx, metrics)
	if around != nil {
		around(true)
	}
	// This process's CPU is read inside around's readings, so that its
	// scrapes of the servers' metrics are not counted as the callers'.
	self0, _ = cpuTime(os.Getpid())
	t0 := time.Now()
	on.Store(true)
	sleepCtx(ctx, d)
	on.Store(false)
	w.elapsed = time.Since(t0)
	self1, _ := cpuTime(os.Getpid())
	w.clientCPU = self1 - self0
	if around != nil {
		around(false)
	}
	if serverPID > 0 {
		if srv1, err := cpuTime(serverPID); err == nil {
			w.serverCPU = srv1 - srv0
		}
	}
	if commits1 := commitsOf(ctx, metrics); commits0 >= 0 && commits1 >= 0 {
		w.commits = commits1 - commits0
	}
	cancel()
	wg.Wait()
	for _, c := range callers {
		w.add(&c.tally)
	}
	return w
}

// join makes w the windows w and o measured as one: their time, calls
// (tally.add) and the load generator's CPU summed; the server's CPU and
// the commits only where both knew them.
func (w *window) join(o window) {
	w.elapsed += o.elapsed
	w.add(&o.tally)
	w.clientCPU += o.clientCPU
	if w.serverCPU >= 0 && o.serverCPU >= 0 {
		w.serverCPU += o.serverCPU
	} else {
		w.serverCPU = -1
	}
	if w.commits >= 0 && o.commits >= 0 {
		w.commits += o.commits
	} else {
		w.commits = -1
	}
}

// commitsOf reads policyd_store_commits_total, or -1.
func commitsOf(ctx context.Context, url string) float64 {
	if url == "" {
		return -1
	}
	m, err := scrape(ctx, url, "policyd_store_commits_total")
	if err != nil {
		return -1
	}
	v, ok := m["policyd_store_commits_total"]
	if !ok {
		return -1
	}
	return v
}

// sleepCtx sleeps d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
