package statuspage_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/statuspage"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// openStore opens a real bbolt store in a temporary directory; clock nil
// means the wall clock.
func openStore(t testing.TB, clock breakerstore.Clock) *breakerstore.Store {
	t.Helper()
	opts := breakerstore.Options{Path: filepath.Join(t.TempDir(), "policyd.db"), FlushInterval: time.Hour}
	if clock != nil {
		opts.Clock = clock
	}
	store, err := breakerstore.Open(opts)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

// health is the page's StoreHealth read from store, as policyd serve
// reports it.
func health(store *breakerstore.Store) func() statuspage.StoreHealth {
	return func() statuspage.StoreHealth {
		st := store.Stats()
		return statuspage.StoreHealth{Engine: "bbolt", File: "policyd.db", Breakers: st.Breakers, Tenants: st.Tenants, Runs: st.Runs,
			Commits: st.Commits, FlushErrors: st.FlushErrors}
	}
}

// serve starts page on a loopback HTTP server and returns its base URL.
func serve(t testing.TB, cfg statuspage.Config) (*statuspage.Page, string) {
	t.Helper()
	page := statuspage.New(cfg)
	mux := http.NewServeMux()
	page.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		page.Close()
		srv.Close()
	})
	return page, srv.URL
}

var (
	consecutive = policy.BreakerConfig{Mode: policy.BreakerConsecutive, ConsecutiveFailures: 5, Cooldown: time.Minute}
	failureRate = policy.BreakerConfig{Mode: policy.BreakerFailureRate, FailureRate: 0.5, MinCalls: 100, Window: time.Minute}
)

// fail records n transient failures on the breaker under k.
func fail(t testing.TB, store *breakerstore.Store, k policy.BreakerKey, cfg policy.BreakerConfig, n int) {
	t.Helper()
	for range n {
		if _, err := store.Record(k, cfg, policy.ResultTransientFailure, ""); err != nil {
			t.Fatalf("record %v: %v", k, err)
		}
	}
}

func getJSON(t *testing.T, url string) statuspage.Status {
	t.Helper()
	resp, err := http.Get(url + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /status.json: got %s %s, want 200", resp.Status, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type: got %q, want application/json", ct)
	}
	var st statuspage.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("decode /status.json: %v", err)
	}
	return st
}

func findBreaker(st statuspage.Status, tenant, target string) (statuspage.Breaker, bool) {
	for _, b := range st.Breakers {
		if b.Tenant == tenant && b.Target == target {
			return b, true
		}
	}
	return statuspage.Breaker{}, false
}

func TestStatusJSONShowsTheFleet(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	store := openStore(t, clk)
	start := clk.Now()

	// A breaker tripped by five failures, one forced OPEN by an operator,
	// one counting failures in a FAILURE_RATE window, one under a
	// fleet-wide cool-down.
	tripped := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	fail(t, store, tripped, consecutive, 5)
	forced := policy.BreakerKey{Tenant: "globex", Target: "search"}
	if _, err := store.ForceBreaker(forced, policy.BreakerOpen); err != nil {
		t.Fatal(err)
	}
	windowed := policy.BreakerKey{Target: "geo"}
	fail(t, store, windowed, failureRate, 3)
	if _, err := store.Record(windowed, failureRate, policy.ResultSuccess, ""); err != nil {
		t.Fatal(err)
	}
	cooled := policy.BreakerKey{Tenant: "acme", Target: "mail"}
	if _, err := store.ExtendCooldown(cooled, consecutive, start.Add(30*time.Second)); err != nil {
		t.Fatal(err)
	}

	// A tenant whose budget paid for two retries; a run with a ledger; a
	// run past its cut-off, which is not active.
	if _, err := store.SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: 10, MinPerSecond: 0.01}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if sp, err := store.SpendRetry(policy.SpendRequest{Tenant: "acme"}); err != nil || !sp.Granted {
			t.Fatalf("spend: %+v, %v", sp, err)
		}
	}
	run, err := store.OpenRun(policy.Run{ID: "nightly", Tenant: "acme", Pool: 30, Cutoff: start.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	finals := []struct {
		d    policy.Disposition
		stop policy.StopReason
		n    int
	}{
		{policy.DispositionSucceeded, policy.StopNone, 4},
		{policy.DispositionDeadLetter, policy.StopAttemptsExhausted, 2},
		{policy.DispositionDeadLetter, policy.StopBudgetExhausted, 1},
		{policy.DispositionCircuitOpen, policy.StopCircuitOpen, 1},
	}
	call := 0
	for _, f := range finals {
		for range f.n {
			call++
			if err := store.RecordFinal(run.ID, fmt.Sprintf("c%d", call), f.d, f.stop); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := store.OpenRun(policy.Run{ID: "over", Tenant: "acme", Pool: 3, Cutoff: start.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}

	page, url := serve(t, statuspage.Config{Source: store, Health: health(store), Open: true, Clock: clk, HistoryLen: 4})
	// Sparkline samples: the windowed breaker's failures as they rise.
	page.SampleNow()
	fail(t, store, windowed, failureRate, 2)
	page.SampleNow()
	clk.Advance(2 * time.Second)

	st := getJSON(t, url)
	if !st.Time.Equal(clk.Now()) {
		t.Errorf("time: got %s, want %s", st.Time, clk.Now())
	}
	if st.Store == nil || st.Store.Engine != "bbolt" || st.Store.Breakers != 4 || st.Store.Runs != 2 || st.Store.State != "OK" {
		t.Errorf("store: got %+v, want bbolt with 4 breakers, 2 runs, state OK", st.Store)
	}

	// Severity order: OPEN first, then CLOSED.
	var order []string
	for _, b := range st.Breakers {
		order = append(order, b.State+" "+b.Tenant+"/"+b.Target)
	}
	if got, want := strings.Join(order, ", "), "OPEN acme/payments, OPEN globex/search, CLOSED /geo, CLOSED acme/mail"; got != want {
		t.Errorf("breakers: got %s, want %s", got, want)
	}
	b, _ := findBreaker(st, "acme", "payments")
	if b.Forced || b.OpenUntil == nil || !b.OpenUntil.Equal(start.Add(time.Minute)) || !b.Since.Equal(start) {
		t.Errorf("tripped breaker: got %+v, want not forced, open until %s, since %s", b, start.Add(time.Minute), start)
	}
	b, _ = findBreaker(st, "globex", "search")
	if !b.Forced || b.OpenUntil != nil {
		t.Errorf("forced breaker: got %+v, want forced with no open_until (pinned until reset)", b)
	}
	b, _ = findBreaker(st, "", "geo")
	if b.Mode != "FAILURE_RATE" || b.Failures != 5 || b.WindowCalls != 6 {
		t.Errorf("windowed breaker: got %+v, want FAILURE_RATE with 5 failures of 6 calls", b)
	}
	if got, want := fmt.Sprint(b.Recent), "[3 5 5]"; got != want {
		t.Errorf("windowed breaker's recent failures: got %s, want %s (two samples and now)", got, want)
	}

	if len(st.Cooldowns) != 1 || st.Cooldowns[0].Target != "mail" || !st.Cooldowns[0].Until.Equal(start.Add(30*time.Second)) {
		t.Errorf("cooldowns: got %+v, want acme/mail until %s", st.Cooldowns, start.Add(30*time.Second))
	}

	if len(st.Tenants) != 1 || st.Tenants[0].Tenant != "acme" || st.Tenants[0].Capacity != 10 || st.Tenants[0].Granted != 2 ||
		st.Tenants[0].Tokens > 8.1 {
		t.Errorf("tenants: got %+v, want acme with capacity 10, 2 granted, about 8 tokens", st.Tenants)
	}

	if len(st.Runs) != 1 {
		t.Fatalf("runs: got %+v, want only the run before its cut-off", st.Runs)
	}
	want := statuspage.Ledger{Succeeded: 4, CircuitOpen: 1, DeadLetter: statuspage.DeadLetters{Exhausted: 2, Budget: 1}}
	if r := st.Runs[0]; r.ID != "nightly" || r.Pool != 30 || r.Ledger != want {
		t.Errorf("run: got %+v, want nightly, pool 30, ledger %+v", r, want)
	}
}

func TestStatusCapsTheBreakersListedMostSevereFirst(t *testing.T) {
	store := openStore(t, nil)
	for i := range 5 {
		fail(t, store, policy.BreakerKey{Tenant: "acme", Target: fmt.Sprintf("t%d", i)}, consecutive, 1)
	}
	if _, err := store.ForceBreaker(policy.BreakerKey{Tenant: "acme", Target: "t4"}, policy.BreakerOpen); err != nil {
		t.Fatal(err)
	}
	_, url := serve(t, statuspage.Config{Source: store, Health: health(store), Open: true, MaxBreakers: 2})
	st := getJSON(t, url)
	if len(st.Breakers) != 2 || st.Breakers[0].Target != "t4" || st.Breakers[0].State != "OPEN" || st.BreakersOmitted != 3 {
		t.Errorf("got %+v, %d omitted; want t4 OPEN first, 2 listed, 3 omitted", st.Breakers, st.BreakersOmitted)
	}
}

func TestCredentials(t *testing.T) {
	store := openStore(t, nil)
	const token = "s3cret-admin-token"
	admin := func(tok string) bool { return tok == token }
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	_, guarded := serve(t, statuspage.Config{Source: store, Admin: admin})
	_, open := serve(t, statuspage.Config{Source: store, Admin: admin, Open: true})
	for _, tc := range []struct {
		name, base, path, auth string
		want                   int
	}{
		{"open: no credential", open, "/status.json", "", 200},
		{"open: page", open, "/status", "", 200},
		{"guarded: no credential", guarded, "/status.json", "", 401},
		{"guarded: page without credential", guarded, "/status", "", 401},
		{"guarded: events without credential", guarded, "/status/events", "", 401},
		{"guarded: assets without credential", guarded, "/status/assets/status.js", "", 401},
		{"guarded: wrong bearer", guarded, "/status.json", "Bearer nope", 401},
		{"guarded: empty bearer", guarded, "/status.json", "Bearer ", 401},
		{"guarded: token without scheme", guarded, "/status.json", token, 401},
		{"guarded: bearer", guarded, "/status.json", "Bearer " + token, 200},
		{"guarded: basic, token as password", guarded, "/status", basic("ops", token), 200},
		{"guarded: basic, any user name", guarded, "/status.json", basic("", token), 200},
		{"guarded: basic, token as user name", guarded, "/status.json", basic(token, ""), 401},
		{"guarded: basic, wrong password", guarded, "/status.json", basic("ops", "nope"), 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", tc.base+tc.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("got %s, want %d", resp.Status, tc.want)
			}
			if tc.want != 401 {
				return
			}
			if got := resp.Header.Values("WWW-Authenticate"); len(got) == 0 || !strings.HasPrefix(got[0], "Basic ") {
				t.Errorf("WWW-Authenticate: got %q, want a Basic challenge (the browser's prompt)", got)
			}
			if strings.Contains(string(body), token) || !strings.Contains(string(body), "admin token") {
				t.Errorf("body: got %q, want it to say an admin token is needed, without any token", body)
			}
		})
	}
}

func TestPageIsSelfContained(t *testing.T) {
	store := openStore(t, nil)
	fail(t, store, policy.BreakerKey{Tenant: "acme", Target: `<script>alert(1)</script>`}, consecutive, 1)
	_, url := serve(t, statuspage.Config{Source: store, Open: true})
	resp, err := http.Get(url + "/status")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("Content-Security-Policy: got %q, want only the page's own origin", csp)
	}
	page := string(body)
	if strings.Contains(page, "<script>alert") || !strings.Contains(page, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("a target's name is not escaped in the page")
	}
	if strings.Contains(page, "http://") || strings.Contains(page, "https://") || strings.Contains(page, "//cdn") {
		t.Errorf("the page names another origin:\n%s", page)
	}
	for _, asset := range []string{"/status/assets/status.js", "/status/assets/status.css"} {
		resp, err := http.Get(url + asset)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: got %s, want 200", asset, resp.Status)
		}
	}
}

func TestSparklineKeepsTheLastSamples(t *testing.T) {
	store := openStore(t, nil)
	key := policy.BreakerKey{Tenant: "acme", Target: "geo"}
	page, url := serve(t, statuspage.Config{Source: store, Open: true, HistoryLen: 4})
	for range 6 {
		fail(t, store, key, failureRate, 1)
		page.SampleNow()
	}
	fail(t, store, key, failureRate, 1)
	b, _ := findBreaker(getJSON(t, url), "acme", "geo")
	if got, want := fmt.Sprint(b.Recent), "[4 5 6 7]"; got != want {
		t.Errorf("recent failures: got %s, want %s (the last 3 samples and now)", got, want)
	}
}

func TestStoreHealthReadsFlushFailingWhileCommitsFail(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	store := openStore(t, clk)
	var mu sync.Mutex
	flushErrors := uint64(0)
	h := func() statuspage.StoreHealth {
		mu.Lock()
		defer mu.Unlock()
		return statuspage.StoreHealth{Engine: "bbolt", FlushErrors: flushErrors}
	}
	_, url := serve(t, statuspage.Config{Source: store, Health: h, Open: true, Clock: clk})
	for _, step := range []struct {
		name    string
		errors  uint64
		advance time.Duration
		want    string
	}{
		{"no failed commit", 0, 0, "OK"},
		{"two failed commits", 2, 0, "FLUSH_FAILING"},
		{"none since, 59 s on", 2, 59 * time.Second, "FLUSH_FAILING"},
		{"none since, a minute on", 2, time.Second, "OK"},
		{"one more", 3, 0, "FLUSH_FAILING"},
	} {
		mu.Lock()
		flushErrors = step.errors
		mu.Unlock()
		clk.Advance(step.advance)
		if st := getJSON(t, url); st.Store == nil || st.Store.State != step.want {
			t.Errorf("%s: got %+v, want state %s", step.name, st.Store, step.want)
		}
	}
}
