package statuspage_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/chromedp"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/statuspage"
)

// chromium returns the path of Debian's chromium. Without it the test
// fails in CI (CI set), where scripts/test installs it, and is skipped
// elsewhere.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed, and CI is set: scripts/test installs it (apt-get install chromium chromium-driver)")
	}
	t.Skip("chromium is not installed (apt-get install chromium chromium-driver; scripts/test does it): the browser test is skipped outside CI")
	return ""
}

// artifactDir is where the test leaves its screenshot: $POLICYD_ARTIFACTS
// when set, else a temporary directory.
func artifactDir(t *testing.T) string {
	if dir := os.Getenv("POLICYD_ARTIFACTS"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	return t.TempDir()
}

// seedFleet gives the page something to show: a tripped breaker whose
// sparkline rose and whose policy escalates to a fallback, one under a
// cool-down, one under a ceiling with leases out, tenants that spent
// retries, and a run with a ledger and dead letters in its call table. It
// returns the run's id.
func seedFleet(t *testing.T, store *breakerstore.Store, page *statuspage.Page) string {
	t.Helper()
	now := time.Now()
	setPolicy(t, store, "acme", "payments", func(p *policy.Policy) {
		p.Breaker = consecutive
		p.Fallback = policy.Fallback{Targets: []string{"payments-b"}, AfterAttempts: 2, OnCircuitOpen: true}
	})
	fail(t, store, policy.BreakerKey{Tenant: "acme", Target: "payments-b"}, consecutive, 1)
	setPolicy(t, store, "acme", "geo", func(p *policy.Policy) {
		p.Breaker = consecutive
		p.Flow = policy.FlowConfig{MaxInFlight: 10, MaxRate: 50, Burst: 10}
		// Leases that outlive the test: they live the attempt timeout,
		// and Chromium's start on a busy machine can take longer than
		// the default's.
		p.AttemptTimeout = time.Hour
	})
	admit(t, store, "acme", "geo", 6)
	rising := policy.BreakerKey{Tenant: "acme", Target: "payments"}
	windowed := policy.BreakerKey{Tenant: "globex", Target: "search"}
	for i := range 8 {
		page.SampleNow()
		if i < 5 {
			fail(t, store, rising, consecutive, 1)
		}
		fail(t, store, windowed, failureRate, i%3)
		if _, err := store.Record(windowed, failureRate, policy.ResultSuccess, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.ExtendCooldown(policy.BreakerKey{Tenant: "acme", Target: "mail"}, consecutive, now.Add(45*time.Second)); err != nil {
		t.Fatal(err)
	}
	fail(t, store, policy.BreakerKey{Tenant: "acme", Target: "geo"}, consecutive, 2)
	run, err := store.OpenRun(policy.Run{Tenant: "initech", Description: "nightly invoices", Pool: 300, Cutoff: now.Add(2 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	// initech's retries come out of the run's pool too.
	for _, b := range []struct {
		tenant, run string
		spend       int
	}{{"acme", "", 31}, {"globex", "", 6}, {"initech", run.ID, 47}} {
		if _, err := store.SetBudget(policy.TenantBudget{Tenant: b.tenant, Capacity: 50, MinPerSecond: 0.01}); err != nil {
			t.Fatal(err)
		}
		for range b.spend {
			if _, err := store.SpendRetry(policy.SpendRequest{Tenant: b.tenant, RunID: b.run}); err != nil {
				t.Fatal(err)
			}
		}
	}
	call := 0
	for _, f := range []struct {
		d        policy.Disposition
		stop     policy.StopReason
		n        int
		attempts uint32
		cls      string
	}{
		{policy.DispositionSucceeded, policy.StopNone, 120, 1, ""},
		{policy.DispositionFailedTerminal, policy.StopTerminal, 9, 1, "terminal:422"},
		{policy.DispositionDeadLetter, policy.StopAttemptsExhausted, 14, 3, "transient:503"},
		{policy.DispositionDeadLetter, policy.StopBudgetExhausted, 3, 2, "transport:timeout"},
		{policy.DispositionCircuitOpen, policy.StopCircuitOpen, 7, 2, "transient:502"},
	} {
		for range f.n {
			call++
			n := policy.CallNote{Target: "invoices-api", Attempt: f.attempts, Classification: f.cls, Time: now}
			if f.d != policy.DispositionSucceeded {
				n.TriageRef = fmt.Sprintf("inbox/doc-%d.pdf", call)
			}
			noteFinal(t, store, run.ID, fmt.Sprintf("doc-%d", call), f.d, f.stop, n)
		}
	}
	return run.ID
}

// browser starts a headless Chromium at exe, ended with the test, and
// returns its tab's context.
func browser(t *testing.T, exe string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1200, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	return ctx
}

// poll waits until the JavaScript expression expr is true.
func poll(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(10*time.Millisecond))
}

// live is true once the page's event stream has delivered a rendering.
const live = `document.getElementById("live").textContent === "live"`

// TestBrowserSeesABreakerOpen loads the page in a real headless Chromium,
// forces a breaker OPEN in the store and waits, for at most a second after
// the transition, until the page shows it OPEN, and its escalation chain
// with it; then it saves a screenshot, checks a ceiling is shown, and
// follows the run's dead-letter link to the page listing its dead-lettered
// calls.
func TestBrowserSeesABreakerOpen(t *testing.T) {
	exe := chromium(t)
	store := openStore(t, nil)
	page, url := serve(t, statuspage.Config{Source: store, Health: health(store), Replicas: statuspage.Sole("policyd.db"),
		Open: true, Refresh: time.Hour})
	runID := seedFleet(t, store, page)
	checkout := policy.BreakerKey{Tenant: "acme", Target: "checkout"}
	fail(t, store, checkout, consecutive, 3)

	ctx := browser(t, exe)
	state := `document.querySelector('tr.breaker[data-target="checkout"] td.state')?.textContent.trim().split(" ")[0]`
	loadCtx, cancelLoad := context.WithTimeout(ctx, 60*time.Second) // Chromium's start included
	defer cancelLoad()
	if err := chromedp.Do(loadCtx, chromedp.Navigate(url+"/status"), poll(live)); err != nil {
		t.Fatalf("loading the page: %v", err)
	}
	if before, err := chromedp.Run(loadCtx, chromedp.Evaluate[string](state)); err != nil || before != "CLOSED" {
		t.Fatalf("checkout before the force: got %q, %v; want CLOSED", before, err)
	}

	if _, err := store.ForceBreaker(checkout, policy.BreakerOpen); err != nil {
		t.Fatal(err)
	}
	transition := time.Now()
	seeCtx, cancelSee := context.WithDeadline(ctx, transition.Add(time.Second))
	defer cancelSee()
	if err := chromedp.Do(seeCtx, poll(state+` === "OPEN"`)); err != nil {
		now, _ := chromedp.Run(ctx, chromedp.Evaluate[string](state))
		t.Fatalf("the page did not show checkout OPEN within a second of the transition: %v (it shows %q)", err, now)
	}
	t.Logf("the page showed checkout OPEN %s after the transition", time.Since(transition).Round(time.Millisecond))
	chain := `document.querySelector('tr.escalation[data-target="payments"] td.chain')?.textContent.replace(/\s+/g, " ").trim()`
	if got, err := chromedp.Run(ctx, chromedp.Evaluate[string](chain)); err != nil || got != "payments OPEN → payments-b CLOSED" {
		t.Errorf("the escalation chain of acme/payments reads %q, %v; want payments OPEN → payments-b CLOSED", got, err)
	}

	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(artifactDir(t), "status.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(png), "\x89PNG") {
		t.Errorf("screenshot %s is not a PNG", path)
	}
	t.Logf("screenshot: %s", path)

	ceiling := `document.querySelector('tr.ceiling[data-target="geo"] .in-flight')?.textContent`
	if got, err := chromedp.Run(ctx, chromedp.Evaluate[string](ceiling)); err != nil || got != "6 / 10" {
		t.Errorf("the ceiling of acme/geo reads %q, %v; want 6 / 10 leases in flight", got, err)
	}

	// The run's dead-letter link opens its list: the dead-lettered calls,
	// not the succeeded ones.
	runCtx, cancelRun := context.WithTimeout(ctx, 10*time.Second)
	defer cancelRun()
	if err := chromedp.Do(runCtx, chromedp.Click(chromedp.CSS(`tr.run a.dead-letter-list`))); err != nil {
		t.Fatalf("clicking the dead-letter link: %v", err)
	}
	// The new document's row, once it is there (a query survives the
	// navigation; an evaluation in the old document's context does not).
	if err := chromedp.Do(runCtx, chromedp.WaitVisible(chromedp.CSS(`tr.call[data-call="doc-130"]`))); err != nil {
		loc, _ := chromedp.Run(ctx, chromedp.Location())
		t.Fatalf("the dead-letter list shows no doc-130: %v (at %s)", err, loc)
	}
	disp := `document.querySelector('tr.call[data-call="doc-130"] td.disposition')?.textContent`
	if got, err := chromedp.Run(runCtx, chromedp.Evaluate[string](disp)); err != nil || got != "DEAD_LETTER" {
		t.Errorf("doc-130's disposition on the list: got %q, %v; want DEAD_LETTER", got, err)
	}
	loc, err := chromedp.Run(runCtx, chromedp.Location())
	if want := url + "/status/runs/" + runID; err != nil || loc != want {
		t.Errorf("the dead-letter link led to %q, %v; want %s", loc, err, want)
	}
	counts, err := chromedp.Run(runCtx, chromedp.Evaluate[string](
		`document.querySelectorAll('tr.call').length + " calls, " + document.querySelectorAll('tr.call[data-call="doc-1"]').length + " succeeded"`))
	if err != nil || counts != "33 calls, 0 succeeded" {
		t.Errorf("the run's list: got %q, %v; want its 33 dead-lettered, failed-terminal and circuit-open calls, no succeeded one", counts, err)
	}
	png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(filepath.Join(artifactDir(t), "status-run.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBrowserLogsInWithTheAdminToken loads a guarded page as a person
// would: Chromium meets the 401's Basic challenge, the token is given as the
// password of its prompt (through the DevTools protocol, which answers
// prompts), and the page goes live, which needs the event stream, a request
// of the page's script that nobody but the browser gives the credential to.
func TestBrowserLogsInWithTheAdminToken(t *testing.T) {
	exe := chromium(t)
	store := openStore(t, nil)
	const token = "s3cret-admin-token"
	_, url := serve(t, statuspage.Config{Source: store, Admin: func(tok string) bool { return tok == token }, Refresh: time.Hour})
	fail(t, store, policy.BreakerKey{Tenant: "acme", Target: "checkout"}, consecutive, 1)

	ctx := browser(t, exe)
	loadCtx, cancelLoad := context.WithTimeout(ctx, 60*time.Second)
	defer cancelLoad()
	paused := chromedp.Events(loadCtx, fetch.RequestPaused)
	challenged := chromedp.Events(loadCtx, fetch.AuthRequired)
	handleAuth := true
	if _, err := chromedp.Call(loadCtx, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &handleAuth}); err != nil {
		t.Fatal(err)
	}
	var prompts atomic.Int32
	go func() {
		for ev, err := range paused {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(loadCtx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
		}
	}()
	go func() {
		for ev, err := range challenged {
			if err != nil {
				return
			}
			prompts.Add(1)
			_, _ = chromedp.Call(loadCtx, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: ev.RequestID,
				AuthChallengeResponse: &fetch.AuthChallengeResponse{
					Response: fetch.AuthChallengeResponseResponseProvideCredentials, Username: "ops", Password: token}})
		}
	}()
	if err := chromedp.Do(loadCtx, chromedp.Navigate(url+"/status"), poll(live)); err != nil {
		t.Fatalf("the guarded page did not go live after the login: %v", err)
	}
	if n := prompts.Load(); n < 1 {
		t.Errorf("the browser met %d credential prompts, want the page's", n)
	}
	href, err := chromedp.Run(loadCtx, chromedp.Evaluate[string](`location.href`))
	if err != nil || strings.Contains(href, token) {
		t.Errorf("the page's address: got %q, %v; want one without the token", href, err)
	}
}
