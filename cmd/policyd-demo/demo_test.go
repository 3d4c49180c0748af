package main

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/clients/go/policyclient"
)

// testLog writes to the test's log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Helper()
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// smallDemo is the demo shrunk to a few seconds: 40 documents over 5s, an
// outage from 1s to 3s (503, then connection refused), a breaker that opens
// after 3 failures and probes after 700ms.
func smallDemo(t *testing.T) demoConfig {
	cfg := defaultDemoConfig()
	cfg.Docs, cfg.Workers, cfg.Seed = 40, 8, 7
	cfg.Cutoff = time.Minute
	cfg.Feed, cfg.Progress = 5*time.Second, time.Second
	cfg.Log = testLog{t}
	u := &cfg.Upstream
	u.P429, u.P503, u.PHang = 0.03, 0.05, 0.05
	u.RetryAfter, u.Hang = time.Second, 700*time.Millisecond
	u.LatencyMin, u.LatencyMax = 2*time.Millisecond, 10*time.Millisecond
	u.OutageAt, u.Outage503, u.OutageRefused = time.Second, time.Second, time.Second
	cfg.Policy = demoPolicy{MaxAttempts: 3, Base: 50 * time.Millisecond, Cap: 400 * time.Millisecond,
		AttemptTimeout: 300 * time.Millisecond, Threshold: 3, Probes: 1,
		Cooldown: 700 * time.Millisecond, ProbeTimeout: time.Second}
	return cfg
}

func TestDemoAccountsForEveryDocumentAndOpensTheBreaker(t *testing.T) {
	_, statErr := os.Stat("policyd.db")
	cfg := smallDemo(t)
	sum, err := runDemo(context.Background(), cfg, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	sum.print(&text)
	t.Log("\n" + text.String())

	// Every document is accounted for exactly once.
	if len(sum.docs) != cfg.Docs {
		t.Fatalf("outcomes: got %d, want %d", len(sum.docs), cfg.Docs)
	}
	seen := map[string]bool{}
	successes := 0
	for i, o := range sum.docs {
		if o.ID == "" || seen[o.ID] {
			t.Errorf("document %d: id %q missing or repeated", i, o.ID)
		}
		seen[o.ID] = true
		if o.Result.Disposition.String() == "" {
			t.Errorf("%s: no disposition (result %+v)", o.ID, o.Result)
		}
		if o.Result.OK() {
			successes++
		}
		if o.Result.Attempts > cfg.Policy.MaxAttempts || len(o.Trace.Attempts) > cfg.Policy.MaxAttempts {
			t.Errorf("%s: got %d attempts (%d upstream calls), want at most %d", o.ID, o.Result.Attempts,
				len(o.Trace.Attempts), cfg.Policy.MaxAttempts)
		}
	}
	rows := 0
	for _, r := range sum.Dispositions {
		rows += r.Docs
	}
	if rows != cfg.Docs {
		t.Errorf("disposition table: got %d documents, want %d", rows, cfg.Docs)
	}
	if got := sum.Ledger.total(); got != uint64(cfg.Docs) {
		t.Errorf("ledger total: got %d, want %d (%+v)", got, cfg.Docs, sum.Ledger)
	}

	// The run's ledger agrees with the workers.
	if sum.Ledger.Succeeded != uint64(successes) {
		t.Errorf("ledger succeeded: got %d, want the client's %d", sum.Ledger.Succeeded, successes)
	}
	if !sum.LedgerMatches {
		t.Errorf("ledger: got %+v, want the client's %+v", sum.Ledger.counts(), sum.ClientLedger)
	}
	if sum.Client.OutcomesDropped != 0 {
		t.Errorf("outcomes dropped: got %d, want 0", sum.Client.OutcomesDropped)
	}

	// The pool is never overspent.
	if sum.Ledger.RetryPool != 3*uint64(cfg.Docs) || sum.Ledger.RetriesSpent > sum.Ledger.RetryPool {
		t.Errorf("retries: got %d spent of a pool of %d, want at most a pool of %d",
			sum.Ledger.RetriesSpent, sum.Ledger.RetryPool, 3*cfg.Docs)
	}

	// The breaker opened during the outage and closed once it was over.
	u := sum.Upstream
	openedInOutage := false
	for _, tr := range sum.Breaker.Transitions {
		if tr.To == "OPEN" && tr.At >= u.OutageStart && tr.At <= u.OutageEnd {
			openedInOutage = true
		}
	}
	if !openedInOutage {
		t.Errorf("breaker: got transitions %+v, want one to OPEN within the outage %.2fs-%.2fs",
			sum.Breaker.Transitions, u.OutageStart, u.OutageEnd)
	}
	if n := len(sum.Breaker.Transitions); n == 0 || sum.Breaker.Transitions[n-1].To != "CLOSED" {
		t.Errorf("breaker: got transitions %+v, want it CLOSED at the end", sum.Breaker.Transitions)
	}
	sv := sum.Saved
	if sv.CircuitOpenDocs == 0 || sv.FastFails+uint64(sv.AdmitRefusals) == 0 {
		t.Errorf("circuit open: got %d documents, %d fast fails, %d Admit refusals; want the breaker to refuse some",
			sv.CircuitOpenDocs, sv.FastFails, sv.AdmitRefusals)
	}
	if sv.DocsInOutage == 0 || sv.ActualCalls >= sv.NaiveCalls {
		t.Errorf("outage: %d documents sent %d calls, want fewer than a naive loop's %d",
			sv.DocsInOutage, sv.ActualCalls, sv.NaiveCalls)
	}
	if sv.CircuitOpenNotMade != cfg.Policy.MaxAttempts*sv.CircuitOpenDocs-sv.CircuitOpenCalls {
		t.Errorf("calls not made: got %d, want %d x %d - %d", sv.CircuitOpenNotMade,
			cfg.Policy.MaxAttempts, sv.CircuitOpenDocs, sv.CircuitOpenCalls)
	}

	// The idempotency key kept every write single.
	c := u.Counts
	if c.DuplicateWrites != 0 || c.WritesApplied < successes {
		t.Errorf("writes: got %d applied (%d twice), want at least the %d successes, none twice",
			c.WritesApplied, c.DuplicateWrites, successes)
	}
	if got := c.OK + c.Replays + c.Throttled + c.Outage503 + c.Flaky503 + c.BadRequest + c.Hung; got != c.Requests {
		t.Errorf("upstream: answers add up to %d, want its %d requests (%+v)", got, c.Requests, c)
	}

	// The demo never touches ./policyd.db.
	if errors.Is(statErr, fs.ErrNotExist) {
		if _, err := os.Stat("policyd.db"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("./policyd.db: got %v, want it left absent", err)
		}
	}
}

func TestDemoScriptIsDeterministic(t *testing.T) {
	s := defaultDemoConfig().Upstream
	s.Seed = 42
	other := s
	other.Seed = 43
	ids, bodies := makeDocs(42, 2000, 0.03)
	ids2, bodies2 := makeDocs(42, 2000, 0.03)
	bad, differs := 0, 0
	faults := map[verdict]int{}
	for i, id := range ids {
		if ids2[i] != id || !bytes.Equal(bodies[i], bodies2[i]) {
			t.Fatalf("makeDocs(42) differs at %d: %s %s vs %s %s", i, id, bodies[i], ids2[i], bodies2[i])
		}
		if !validDoc(bodies[i]) {
			bad++
		}
		key := policyclient.IdempotencyKey(id, bodies[i])
		for n := 1; n <= 3; n++ {
			v, lat := s.verdict(key, n)
			v2, lat2 := s.verdict(key, n)
			if v != v2 || lat != lat2 {
				t.Fatalf("verdict(%s, %d): got %v/%s then %v/%s, want the same", id, n, v, lat, v2, lat2)
			}
			if v == verdictOK && (lat < s.LatencyMin || lat > s.LatencyMax) {
				t.Errorf("verdict(%s, %d): latency %s outside [%s, %s]", id, n, lat, s.LatencyMin, s.LatencyMax)
			}
			if ov, _ := other.verdict(key, n); ov != v {
				differs++
			}
			faults[v]++
		}
	}
	if bad < 20 || bad > 100 {
		t.Errorf("malformed documents: got %d of 2000, want about 3%%", bad)
	}
	if differs == 0 {
		t.Error("seeds 42 and 43 gave the same faults")
	}
	calls := 3 * len(ids)
	for _, c := range []struct {
		v    verdict
		want float64
	}{{verdict429, s.P429}, {verdict503, s.P503}} {
		if got := float64(faults[c.v]) / float64(calls); got < c.want/2 || got > c.want*2 {
			t.Errorf("verdict %d: got a share of %.3f, want about %.3f", c.v, got, c.want)
		}
	}
	if got := float64(faults[verdictHang]+faults[verdictHangApplied]) / float64(calls); got < s.PHang/2 || got > s.PHang*2 {
		t.Errorf("hangs: got a share of %.3f, want about %.3f", got, s.PHang)
	}
}

func TestNaiveCalls(t *testing.T) {
	p := demoPolicy{MaxAttempts: 3, Base: 200 * time.Millisecond, Cap: 2 * time.Second}
	for _, tc := range []struct {
		name       string
		start, end time.Duration
		want       int
	}{
		{"all three fit", 10 * time.Second, 20 * time.Second, 3},
		{"the third lands after the end", 19500 * time.Millisecond, 20 * time.Second, 2},
		{"only the first", 19900 * time.Millisecond, 20 * time.Second, 1},
		{"started at the end", 20 * time.Second, 20 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := naiveCalls(tc.start, tc.end, p); got != tc.want {
				t.Errorf("naiveCalls(%s, %s): got %d, want %d", tc.start, tc.end, got, tc.want)
			}
		})
	}
	if got, want := naiveSchedule(p), "t, t+200ms, t+600ms"; got != want {
		t.Errorf("naiveSchedule: got %q, want %q", got, want)
	}
}
