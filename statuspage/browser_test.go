package statuspage_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
// sparkline rose, one under a cool-down, tenants that spent retries, and a
// run with a ledger.
func seedFleet(t *testing.T, store *breakerstore.Store, page *statuspage.Page) {
	t.Helper()
	now := time.Now()
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
		d    policy.Disposition
		stop policy.StopReason
		n    int
	}{
		{policy.DispositionSucceeded, policy.StopNone, 120},
		{policy.DispositionFailedTerminal, policy.StopTerminal, 9},
		{policy.DispositionDeadLetter, policy.StopAttemptsExhausted, 14},
		{policy.DispositionDeadLetter, policy.StopBudgetExhausted, 3},
		{policy.DispositionCircuitOpen, policy.StopCircuitOpen, 7},
	} {
		for range f.n {
			call++
			if err := store.RecordFinal(run.ID, fmt.Sprintf("doc-%d", call), f.d, f.stop); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestBrowserSeesABreakerOpen loads the page in a real headless Chromium,
// forces a breaker OPEN in the store and waits, for at most a second after
// the transition, until the page shows it OPEN; then it saves a screenshot.
func TestBrowserSeesABreakerOpen(t *testing.T) {
	exe := chromium(t)
	store := openStore(t, nil)
	page, url := serve(t, statuspage.Config{Source: store, Health: health(store), Open: true, Refresh: time.Hour})
	seedFleet(t, store, page)
	checkout := policy.BreakerKey{Tenant: "acme", Target: "checkout"}
	fail(t, store, checkout, consecutive, 3)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1200, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()

	state := `document.querySelector('tr.breaker[data-target="checkout"] td.state')?.textContent.trim().split(" ")[0]`
	poll := func(expr string) chromedp.Action[chromedp.Void] {
		return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(10*time.Millisecond))
	}
	loadCtx, cancelLoad := context.WithTimeout(ctx, 60*time.Second) // Chromium's start included
	defer cancelLoad()
	// Live: the event stream has delivered its first rendering.
	if err := chromedp.Do(loadCtx, chromedp.Navigate(url+"/status"), poll(`document.getElementById("live").textContent === "live"`)); err != nil {
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
}
