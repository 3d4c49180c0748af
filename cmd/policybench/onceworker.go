package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/clients/go/policyclient"
)

// onceWorkerConfig is what the parent tells one worker process.
type onceWorkerConfig struct {
	Addrs          []string
	Upstream       string
	Tenant, Target string
	Run            string
	Docs           int
	Worker         int
	Workers        int
	Overlap        float64
	Concurrency    int
	AttemptTimeout time.Duration
	KeepAlive      bool
	RequireClaim   bool
}

// onceWorkerCmd is the hidden child mode of `policybench once`: one
// worker process submitting its documents, printing one JSON line per
// call it made and a last line with the client's counters.
func onceWorkerCmd() *cobra.Command {
	var cfg onceWorkerConfig
	cmd := &cobra.Command{
		Use:    "once-worker",
		Short:  "One worker process of the once command (started by it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runOnceWorker(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&cfg.Addrs, "addrs", nil, "policyd replicas (host:port)")
	f.StringVar(&cfg.Upstream, "upstream", "", "the fake upstream's base URL")
	f.StringVar(&cfg.Tenant, "tenant", "", "tenant")
	f.StringVar(&cfg.Target, "target", "", "target")
	f.StringVar(&cfg.Run, "run", "", "run id")
	f.IntVar(&cfg.Docs, "docs", 0, "documents in the batch")
	f.IntVar(&cfg.Worker, "worker", 0, "this worker's index")
	f.IntVar(&cfg.Workers, "workers", 0, "worker processes")
	f.Float64Var(&cfg.Overlap, "overlap", 0, "share of documents also submitted by the next worker")
	f.IntVar(&cfg.Concurrency, "concurrency", 16, "goroutines")
	f.DurationVar(&cfg.AttemptTimeout, "attempt-timeout", 2*time.Second, "the client's attempt timeout")
	f.BoolVar(&cfg.KeepAlive, "keepalive", false, "reuse connections to the upstream")
	f.BoolVar(&cfg.RequireClaim, "require-claim", false, "the client's Config.RequireClaim")
	return cmd
}

// docName is document i's id, which is also its idempotency key.
func docName(i int) string { return fmt.Sprintf("doc-%04d", i) }

// docsOf returns the documents worker w of n submits, with the call id of
// each: document i is worker i mod n's (call id = document id); with
// overlap, a share of documents (every document whose index falls in the
// share, spread evenly) is also submitted by the next worker, under a
// call id of its own, so that two workers race on one key.
func docsOf(w, n, docs int, overlap float64) (ids, callIDs []string) {
	for i := range docs {
		if i%n == w {
			ids, callIDs = append(ids, docName(i)), append(callIDs, docName(i))
		}
		if overlap > 0 && (i+1)%n == w && n > 1 && float64(i%100) < overlap*100 {
			ids, callIDs = append(ids, docName(i)), append(callIDs, fmt.Sprintf("%s~w%d", docName(i), w))
		}
	}
	return ids, callIDs
}

// onceWorkerEnd is a worker's last line: its client's counters.
type onceWorkerEnd struct {
	Stats   policyclient.Stats `json:"stats"`
	Elapsed float64            `json:"elapsed_seconds"`
}

func runOnceWorker(ctx context.Context, cfg onceWorkerConfig, out io.Writer) error {
	if len(cfg.Addrs) == 0 || cfg.Upstream == "" || cfg.Workers < 1 || cfg.Concurrency < 1 {
		return errors.New("once-worker: --addrs, --upstream, --workers and --concurrency are required")
	}
	c, err := policyclient.DialReplicas(cfg.Addrs, policyclient.Config{Tenant: cfg.Tenant, AttemptTimeout: cfg.AttemptTimeout,
		RequireClaim: cfg.RequireClaim,
		Logger:       slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		return err
	}
	// net/http sends a request carrying an Idempotency-Key again by itself
	// when a reused connection fails before the answer (Transport's
	// shouldRetryRequest): beneath the ledger, a second write of a lost
	// answer. Without keep-alives every write has a fresh connection,
	// which net/http never retries on.
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency, DisableKeepAlives: !cfg.KeepAlive}}
	ids, callIDs := docsOf(cfg.Worker, cfg.Workers, cfg.Docs, cfg.Overlap)
	jobs := make(chan int)
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	start := time.Now()
	var wg sync.WaitGroup
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				s := submitDoc(ctx, c, hc, cfg, ids[j], callIDs[j])
				mu.Lock()
				_ = enc.Encode(s)
				mu.Unlock()
			}
		}()
	}
	for j := range ids {
		select {
		case jobs <- j:
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	cctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cerr := c.Close(cctx) // flushes the outcomes, final dispositions among them
	mu.Lock()
	defer mu.Unlock()
	_ = enc.Encode(onceWorkerEnd{Stats: c.Stats(), Elapsed: time.Since(start).Seconds()})
	return cerr
}

// submitDoc writes one document through the Go client: a non-idempotent
// POST whose idempotency key is the document id.
func submitDoc(ctx context.Context, c *policyclient.Client, hc *http.Client, cfg onceWorkerConfig, doc, callID string) submission {
	body := []byte(`{"doc":"` + doc + `"}`)
	res, err := c.Do(ctx, policyclient.Call{Target: cfg.Target, IdempotencyKey: doc, CallID: callID, RunID: cfg.Run,
		TriageRef: doc}, func(actx context.Context, a policyclient.Attempt) error {
		req, err := http.NewRequestWithContext(actx, http.MethodPost, cfg.Upstream+"/documents", bytes.NewReader(body))
		if err != nil {
			return policyclient.ValidationError(err)
		}
		req.Header.Set("Idempotency-Key", a.IdempotencyKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode >= 400 {
			_, _ = io.Copy(io.Discard, resp.Body)
			return policyclient.HTTPError(resp.StatusCode, resp.Header)
		}
		var rec struct{ ID string }
		if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
			return policyclient.ParseError(err)
		}
		a.SetResultRef(rec.ID)
		return nil
	})
	s := submission{Doc: doc, CallID: callID, Worker: cfg.Worker}
	if err != nil {
		s.Disposition, s.Err = "misuse", err.Error()
		return s
	}
	s.Disposition, s.Attempts, s.Local, s.Dedup, s.ResultRef = res.Disposition.String(), res.Attempts, res.Local, res.Deduplicated, res.ResultRef
	s.StopReason, s.Reason = res.StopReason.String(), res.Reason
	if res.Err != nil {
		s.Err = res.Err.Error()
	}
	return s
}

// onceChild is a worker process and what it printed.
type onceChild struct {
	cmd    *exec.Cmd
	stderr *strings.Builder
	subs   []submission
	end    *onceWorkerEnd
	done   chan error
}

// startOnceChild re-executes this binary as `policybench once-worker` for
// worker w and reads its lines as they come.
func startOnceChild(cfg onceWorkerConfig) (*onceChild, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"once-worker", "--addrs", strings.Join(cfg.Addrs, ","), "--upstream", cfg.Upstream,
		"--tenant", cfg.Tenant, "--target", cfg.Target, "--run", cfg.Run, "--docs", strconv.Itoa(cfg.Docs),
		"--worker", strconv.Itoa(cfg.Worker), "--workers", strconv.Itoa(cfg.Workers),
		"--overlap", strconv.FormatFloat(cfg.Overlap, 'f', -1, 64), "--concurrency", strconv.Itoa(cfg.Concurrency),
		"--attempt-timeout", cfg.AttemptTimeout.String(), "--keepalive=" + strconv.FormatBool(cfg.KeepAlive),
		"--require-claim=" + strconv.FormatBool(cfg.RequireClaim)}
	ch := &onceChild{cmd: exec.Command(self, args...), stderr: new(strings.Builder), done: make(chan error, 1)}
	ch.cmd.Stderr = ch.stderr
	stdout, err := ch.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := ch.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		dec := json.NewDecoder(stdout)
		for {
			var line struct {
				submission
				Stats   *policyclient.Stats `json:"stats"`
				Elapsed float64             `json:"elapsed_seconds"`
			}
			if err := dec.Decode(&line); err != nil {
				break
			}
			if line.Stats != nil {
				ch.end = &onceWorkerEnd{Stats: *line.Stats, Elapsed: line.Elapsed}
				continue
			}
			ch.subs = append(ch.subs, line.submission)
		}
		ch.done <- ch.cmd.Wait()
	}()
	return ch, nil
}

// logged counts the lines the worker's client logged, by message and
// cause (addresses and quoted names left out).
func (ch *onceChild) logged() map[string]int {
	out := map[string]int{}
	for _, line := range strings.Split(ch.stderr.String(), "\n") {
		var rec struct {
			Msg string `json:"msg"`
			Err string `json:"err"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg == "" {
			continue
		}
		k := rec.Msg
		if rec.Err != "" {
			k += ": " + failureClass(rec.Err)
		}
		out[k]++
	}
	return out
}

// kill ends a worker that did not finish in time.
func (ch *onceChild) kill() { _ = ch.cmd.Process.Kill() }
