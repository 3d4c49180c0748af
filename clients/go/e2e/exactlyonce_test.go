package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// writeUpstream is a fake upstream on loopback that applies writes (one
// record per document, without deduplicating) and answers some of them
// 504 after applying, some 503 before.
type writeUpstream struct {
	mu      sync.Mutex
	applied map[string]int // document -> times applied
	calls   int
	tricked map[string]bool // documents already answered 504 or 503 once
}

func (u *writeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	doc := strings.TrimPrefix(r.URL.Path, "/docs/")
	var n int
	fmt.Sscanf(doc, "doc-%d", &n)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls++
	if n%7 == 3 && !u.tricked[doc] { // refused before applying: a retry is safe
		u.tricked[doc] = true
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	u.applied[doc]++
	if n%5 == 1 && !u.tricked[doc] { // applied, but the answer is lost
		u.tricked[doc] = true
		w.WriteHeader(http.StatusGatewayTimeout)
		return
	}
	fmt.Fprintf(w, "rec-%s", doc)
}

// TestExactlyOnceThroughTheLedger: 3 clients x 8 workers submit 60
// non-idempotent documents, each document twice (by two workers of
// different clients), to an upstream that applies writes and sometimes
// answers 504 after applying them. Every document is applied exactly
// once: a second worker arriving at a succeeded key gets its result
// without calling the upstream, a 503 frees the key for a retry, and a
// 504 leaves the outcome unknown, so the call is dead-lettered (the policy
// does not say the upstream deduplicates) rather than sent twice. The
// run's ledger equals the workers' own results.
func TestExactlyOnceThroughTheLedger(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := context.Background()
	if _, err := d.admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "grants", Tenant: "acme", RetryPool: 1000,
		CutoffTime: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	// The upstream's refusals are per document, not an outage: its breaker
	// is not what this test is about.
	many := uint32(1000)
	if _, err := d.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "grants-portal",
		Policy: &pb.Policy{Breaker: &pb.BreakerSettings{ConsecutiveFailures: &many}}}); err != nil {
		t.Fatal(err)
	}
	up := &writeUpstream{applied: map[string]int{}, tricked: map[string]bool{}}
	srv := httptest.NewServer(up)
	defer srv.Close()

	const docs, clients, workers = 60, 3, 8
	type job struct {
		doc    string
		worker string
	}
	jobs := make(chan job)
	go func() {
		for i := range docs {
			for copy := range 2 {
				jobs <- job{doc: fmt.Sprintf("doc-%02d", i), worker: fmt.Sprint(copy)}
			}
		}
		close(jobs)
	}()
	var (
		mu      sync.Mutex
		results []policyclient.Result
		wg      sync.WaitGroup
	)
	cs := make([]*policyclient.Client, clients)
	for i := range cs {
		c, err := policyclient.New(d.conn, policyclient.Config{Tenant: "acme", NoWatch: true, DecisionTimeout: 5 * time.Second,
			Sleep:  func(ctx context.Context, _ time.Duration) error { runtime.Gosched(); return ctx.Err() },
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		cs[i] = c
		for w := range workers {
			wg.Go(func() {
				for j := range jobs {
					res, err := c.Do(ctx, policyclient.Call{Target: "grants-portal", SubmissionID: j.doc, Payload: []byte(j.doc),
						RunID: "grants", CallID: fmt.Sprintf("%s/c%d.w%d/%s", j.doc, i, w, j.worker)},
						func(ctx context.Context, a policyclient.Attempt) error {
							req, _ := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL+"/docs/"+j.doc, nil)
							req.Header.Set("Idempotency-Key", a.IdempotencyKey)
							resp, err := srv.Client().Do(req)
							if err != nil {
								return err
							}
							defer resp.Body.Close()
							body, _ := io.ReadAll(resp.Body)
							if resp.StatusCode != http.StatusOK {
								return policyclient.HTTPError(resp.StatusCode, resp.Header)
							}
							a.SetResultRef(string(body))
							return nil
						})
					if err != nil {
						t.Error(err)
					}
					mu.Lock()
					results = append(results, res)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	var ok, dedup, dead int
	for _, c := range cs {
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range results {
		switch {
		case r.OK() && r.Deduplicated:
			dedup++
			ok++
		case r.OK():
			ok++
		case r.Disposition == policyclient.DeadLetter:
			dead++
		default:
			t.Errorf("%s: %v %v (%s), want succeeded or dead-lettered", r.CallID, r.Disposition, r.StopReason, r.Reason)
		}
		if r.OK() && r.ResultRef != "rec-"+strings.Split(r.CallID, "/")[0] {
			t.Errorf("%s: result ref %q, want the upstream's record", r.CallID, r.ResultRef)
		}
	}
	for i := range docs {
		doc := fmt.Sprintf("doc-%02d", i)
		if n := up.applied[doc]; n != 1 {
			t.Errorf("%s applied %d times, want exactly once", doc, n)
		}
	}
	run, err := d.admin.GetRun(ctx, &pb.GetRunRequest{RunId: "grants"})
	if err != nil {
		t.Fatal(err)
	}
	l := run.GetRun().GetLedger()
	if l.GetSucceeded() != uint64(ok) || l.GetDeduplicated() != uint64(dedup) ||
		l.GetDeadLetterNotIdempotent()+l.GetDeadLetterExhausted() != uint64(dead) {
		t.Errorf("ledger %v, want the workers' %d succeeded (%d deduplicated) and %d dead letters", l, ok, dedup, dead)
	}
	if dedup == 0 {
		t.Errorf("no call was answered by the ledger; want the second submissions deduplicated")
	}
	t.Logf("%d submissions of %d documents: %d succeeded (%d deduplicated: upstream calls saved), %d dead-lettered (outcome lost); "+
		"upstream calls %d, each document applied once; ledger %v", len(results), docs, ok, dedup, dead, up.calls, l)
}

// TestNoUnclaimedAttemptAfterALostOutcomeOrAHeldKey: a non-idempotent
// call with a key is not sent without a claim once the idempotency
// ledger has a reason to refuse it: an attempt's outcome was lost (a 504:
// the upstream may have applied it), or another worker holds the key.
// While policyd cannot be reached the client decides locally, but then a
// second write could reach the upstream: the call is dead-lettered
// instead (NOT_IDEMPOTENT, idempotency:unknown or idempotency:in_flight),
// whether policyd was away for the attempt itself or only from the next
// claim on.
func TestNoUnclaimedAttemptAfterALostOutcomeOrAHeldKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		// held: another worker holds the key's lease before the call.
		held bool
		// stopAt is when policyd stops: before the call, or during the
		// client's first wait (after policyd recorded the lost outcome and
		// said RETRY, or said another worker holds the key).
		stopAt     string
		wantCalls  int32
		wantReason string
	}{
		{name: "lost outcome, policyd away for the attempt", stopAt: "before", wantCalls: 1, wantReason: "idempotency:unknown"},
		{name: "lost outcome, policyd gone before the next claim", stopAt: "wait", wantCalls: 1, wantReason: "idempotency:unknown"},
		{name: "key held by another worker, policyd gone before the next claim", held: true, stopAt: "wait", wantCalls: 0,
			wantReason: "idempotency:in_flight"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDaemon(t, nil)
			stop := sync.OnceFunc(d.gs.Stop)
			sl := newSleeps()
			c, err := policyclient.New(d.conn, policyclient.Config{Tenant: "acme", NoWatch: true, DecisionTimeout: time.Second,
				Now: sl.Now, LocalBudget: 100, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Sleep: func(ctx context.Context, d time.Duration) error {
					if tc.stopAt == "wait" {
						stop()
					}
					return sl.Sleep(ctx, d)
				}})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { // policyd is gone: the outcomes cannot be flushed, do not wait for them
				cctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				_ = c.Close(cctx)
			}()
			if tc.held {
				claim, err := pb.NewRetryPolicyServiceClient(d.conn).ClaimKey(context.Background(), &pb.ClaimKeyRequest{
					Call: &pb.CallRef{Tenant: "acme", Target: "grants-portal", CallId: "other-worker", IdempotencyKey: "doc-1"}, Attempt: 1})
				if err != nil || claim.GetState() != pb.KeyState_KEY_STATE_NEW {
					t.Fatalf("the other worker's claim: %v %v, want NEW", claim, err)
				}
			}
			if tc.stopAt == "before" {
				stop()
			}
			fn, calls := script(policyclient.HTTPError(504, nil)) // applied, the answer lost; a second attempt succeeds
			res, err := c.Do(context.Background(), policyclient.Call{Target: "grants-portal", IdempotencyKey: "doc-1",
				CallID: "doc-1"}, fn)
			if err != nil {
				t.Fatal(err)
			}
			if n := calls.Load(); n != tc.wantCalls {
				t.Errorf("upstream called %d times, want %d: a write was sent without a claim", n, tc.wantCalls)
			}
			if res.Disposition != policyclient.DeadLetter || res.StopReason != policyclient.StopNotIdempotent || res.Reason != tc.wantReason {
				t.Errorf("got %v (%v, %s), want dead_letter (NOT_IDEMPOTENT, %s)", res.Disposition, res.StopReason, res.Reason, tc.wantReason)
			}
		})
	}
}

// TestRequireClaim: with Config.RequireClaim a call that uses the
// idempotency ledger makes no attempt without a claim: policyd away, the
// call is dead-lettered (NOT_IDEMPOTENT, idempotency:unavailable) without
// calling the upstream, where by default it goes on without the ledger.
func TestRequireClaim(t *testing.T) {
	for _, require := range []bool{false, true} {
		t.Run(fmt.Sprint("RequireClaim=", require), func(t *testing.T) {
			d := startDaemon(t, nil)
			sl := newSleeps()
			c, err := policyclient.New(d.conn, policyclient.Config{Tenant: "acme", NoWatch: true, DecisionTimeout: time.Second,
				Now: sl.Now, Sleep: sl.Sleep, RequireClaim: require, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				cctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				_ = c.Close(cctx)
			}()
			d.gs.Stop()
			fn, calls := script()
			res, err := c.Do(context.Background(), policyclient.Call{Target: "grants-portal", IdempotencyKey: "doc-1", CallID: "doc-1"}, fn)
			if err != nil {
				t.Fatal(err)
			}
			if require {
				if n := calls.Load(); n != 0 || res.Disposition != policyclient.DeadLetter || res.StopReason != policyclient.StopNotIdempotent ||
					res.Reason != "idempotency:unavailable" {
					t.Errorf("got %d upstream calls, %v (%v, %s); want none, dead_letter (NOT_IDEMPOTENT, idempotency:unavailable)",
						n, res.Disposition, res.StopReason, res.Reason)
				}
				return
			}
			if n := calls.Load(); n != 1 || !res.OK() {
				t.Errorf("got %d upstream calls, %v; want the write made without the ledger, succeeded", n, res.Disposition)
			}
		})
	}
}
