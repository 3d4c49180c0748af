package statuspage_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/statuspage"
)

// setPolicy stores p (the default policy changed by edit) for tenant and
// target.
func setPolicy(t testing.TB, store *breakerstore.Store, tenant, target string, edit func(p *policy.Policy)) policy.Policy {
	t.Helper()
	p := policy.Default()
	edit(&p)
	if _, err := store.SetPolicy(tenant, target, p); err != nil {
		t.Fatalf("set policy %s/%s: %v", tenant, target, err)
	}
	return p
}

// admit takes n leases under tenant and target's effective policy, as
// Admit does.
func admit(t testing.TB, store *breakerstore.Store, tenant, target string, n int) {
	t.Helper()
	p, _ := store.Resolve(tenant, target)
	for range n {
		a, err := store.AdmitFlow(policy.KeyFor(p.Breaker, tenant, target), p.Breaker, p.FlowLimits())
		if err != nil || !a.Admitted || a.LeaseID == "" {
			t.Fatalf("admit %s/%s: %+v, %v; want a lease", tenant, target, a, err)
		}
	}
}

func getPage(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: got %s %s, want 200", url, resp.Status, body)
	}
	return string(body)
}

func TestStatusShowsCeilings(t *testing.T) {
	store := openStore(t, nil)
	setPolicy(t, store, "acme", "geo", func(p *policy.Policy) {
		p.Flow = policy.FlowConfig{MaxInFlight: 4, MaxRate: 20, Burst: 5}
	})
	setPolicy(t, store, "", "maps", func(p *policy.Policy) {
		p.Breaker.Scope = policy.ScopeTarget
		p.Flow = policy.FlowConfig{MaxInFlight: 8, Adaptive: policy.Adaptive{Enabled: true, Min: 2}}
	})
	admit(t, store, "acme", "geo", 3)
	admit(t, store, "globex", "maps", 1)
	fail(t, store, policy.BreakerKey{Tenant: "acme", Target: "mail"}, consecutive, 1) // no ceiling

	_, url := serve(t, statuspage.Config{Source: store, Open: true})
	st := getJSON(t, url)
	for _, tc := range []struct {
		tenant, target string
		want           *statuspage.Ceiling
	}{
		{"acme", "geo", &statuspage.Ceiling{InFlight: 3, Limit: 4, MaxInFlight: 4, MaxRate: 20, Burst: 5}},
		// Not started: the adaptive ceiling stands at its maximum.
		{"", "maps", &statuspage.Ceiling{InFlight: 1, Limit: 8, MaxInFlight: 8, Adaptive: true, AdaptiveMin: 2}},
		{"acme", "mail", nil},
	} {
		b, ok := findBreaker(st, tc.tenant, tc.target)
		if !ok {
			t.Fatalf("%s/%s: no breaker in %+v", tc.tenant, tc.target, st.Breakers)
		}
		if got, want := fmt.Sprintf("%+v", b.Ceiling), fmt.Sprintf("%+v", tc.want); (b.Ceiling == nil) != (tc.want == nil) ||
			(b.Ceiling != nil && *b.Ceiling != *tc.want) {
			t.Errorf("%s/%s ceiling: got %s, want %s", tc.tenant, tc.target, got, want)
		}
	}

	html := getPage(t, url+"/status")
	ceilings := html[strings.Index(html, `<section id="ceilings">`):]
	ceilings = ceilings[:strings.Index(ceilings, "</section>")]
	for _, want := range []string{`data-target="geo"`, "3 / 4", "20/s, burst 5", `data-target="maps"`, "1 / 8", "in [2, 8]"} {
		if !strings.Contains(ceilings, want) {
			t.Errorf("the ceilings section lacks %q:\n%s", want, ceilings)
		}
	}
	if strings.Contains(ceilings, `data-target="mail"`) {
		t.Errorf("the ceilings section lists mail, which has no ceiling:\n%s", ceilings)
	}
}

func TestStatusShowsEscalationWithEachTargetsBreaker(t *testing.T) {
	store := openStore(t, nil)
	setPolicy(t, store, "acme", "primary", func(p *policy.Policy) {
		p.Fallback = policy.Fallback{Targets: []string{"geocoder-b", "geocoder-c"}, AfterAttempts: 2, OnCircuitOpen: true}
	})
	if _, err := store.ForceBreaker(policy.BreakerKey{Tenant: "acme", Target: "primary"}, policy.BreakerOpen); err != nil {
		t.Fatal(err)
	}
	fail(t, store, policy.BreakerKey{Tenant: "acme", Target: "geocoder-b"}, consecutive, 1)
	// A policy of every tenant: its fallback's breakers are per tenant,
	// one of them OPEN.
	setPolicy(t, store, "", "search", func(p *policy.Policy) { p.Fallback = policy.Fallback{Targets: []string{"search-b"}, AfterAttempts: 1} })
	fail(t, store, policy.BreakerKey{Tenant: "acme", Target: "search-b"}, consecutive, 1)
	fail(t, store, policy.BreakerKey{Tenant: "globex", Target: "search-b"}, consecutive, 5)
	setPolicy(t, store, "acme", "plain", func(p *policy.Policy) {}) // no fallback: not listed

	_, url := serve(t, statuspage.Config{Source: store, Open: true})
	st := getJSON(t, url)
	var got []string
	for _, e := range st.Escalations {
		var chain []string
		for _, l := range e.Chain {
			chain = append(chain, fmt.Sprintf("%s %s/%d", l.Target, l.State, l.Breakers))
		}
		got = append(got, fmt.Sprintf("%s/%s after %d open %v: %s", e.Tenant, e.Target, e.AfterAttempts, e.OnCircuitOpen, strings.Join(chain, " -> ")))
	}
	want := []string{
		"/search after 1 open false: search /0 -> search-b OPEN/2",
		"acme/primary after 2 open true: primary OPEN/1 -> geocoder-b CLOSED/1 -> geocoder-c /0",
	}
	if g, w := strings.Join(got, "\n"), strings.Join(want, "\n"); g != w {
		t.Errorf("escalations:\ngot  %s\nwant %s", g, w)
	}
	// With the breakers listed cut at one (the OPEN ones first), the
	// chain's other breakers are read from the store.
	_, cut := serve(t, statuspage.Config{Source: store, Open: true, MaxBreakers: 1})
	for _, e := range getJSON(t, cut).Escalations {
		if e.Target != "primary" {
			continue
		}
		if got, want := fmt.Sprint(e.Chain), "[{primary OPEN 1} {geocoder-b CLOSED 1} {geocoder-c  0}]"; got != want {
			t.Errorf("acme/primary's chain with one breaker listed: got %s, want %s", got, want)
		}
	}

	html := getPage(t, url+"/status")
	sec := html[strings.Index(html, `<section id="escalations">`):]
	sec = sec[:strings.Index(sec, "</section>")]
	row := sec[strings.Index(sec, `data-target="primary"`):]
	row = row[:strings.Index(row, "</tr>")]
	text := strings.Join(strings.Fields(stripTags(row)), " ")
	if want := "primary OPEN → geocoder-b CLOSED → geocoder-c CLOSED"; !strings.Contains(text, want) {
		t.Errorf("the primary's chain reads %q, want it to contain %q", text, want)
	}
}

// stripTags drops the tags of an HTML fragment, leaving its text.
func stripTags(s string) string {
	var b strings.Builder
	in := false
	for _, r := range s {
		switch {
		case r == '<':
			in = true
		case r == '>':
			in = false
			b.WriteByte(' ')
		case !in:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestStatusShowsReplicasAndTheStore(t *testing.T) {
	store := openStore(t, nil)
	var degraded atomic.Bool
	h := func() statuspage.StoreHealth {
		return statuspage.StoreHealth{Engine: "redis", Replica: "r-1", Degraded: degraded.Load()}
	}
	seen := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	replicas := replicaList{{ID: "r-1", LastSeen: seen, Self: true}, {ID: "r-2", LastSeen: seen.Add(-time.Second)}}
	_, url := serve(t, statuspage.Config{Source: store, Health: h, Replicas: replicas, Open: true})
	st := getJSON(t, url)
	if st.Store == nil || !st.Store.Up || st.Store.State != "OK" || st.Store.Replica != "r-1" {
		t.Errorf("store: got %+v, want up, OK, replica r-1", st.Store)
	}
	if got, want := fmt.Sprint(st.Replicas), fmt.Sprint([]statuspage.Replica(replicas)); got != want {
		t.Errorf("replicas: got %s, want %s", got, want)
	}
	degraded.Store(true)
	if st := getJSON(t, url); st.Store == nil || st.Store.Up || st.Store.State != "DEGRADED" {
		t.Errorf("degraded store: got %+v, want not up, DEGRADED", st.Store)
	}
	if html := getPage(t, url+"/status"); !strings.Contains(html, "degraded mode") || !strings.Contains(html, "<code>r-2</code>") {
		t.Errorf("the page does not say the store is degraded, or lacks replica r-2:\n%s", html)
	}

	// A daemon alone on its bbolt file.
	_, url = serve(t, statuspage.Config{Source: store, Health: health(store), Replicas: statuspage.Sole("policyd.db"), Open: true})
	st = getJSON(t, url)
	if len(st.Replicas) != 1 || st.Replicas[0].ID != "policyd.db" || !st.Replicas[0].Self || st.Store == nil || !st.Store.Up {
		t.Errorf("bbolt: got replicas %+v, store %+v; want one, this one, named after the file, the store up", st.Replicas, st.Store)
	}
}

// replicaList is a fixed replica set, as a shared engine would report it.
type replicaList []statuspage.Replica

func (l replicaList) Replicas() ([]statuspage.Replica, error) { return l, nil }

// noteFinal gives call callID of run runID a final disposition, as a
// NextDelay STOP does: the ledger's count and the call table's record.
func noteFinal(t testing.TB, store *breakerstore.Store, runID, callID string, d policy.Disposition, stop policy.StopReason, n policy.CallNote) {
	t.Helper()
	n.Disposition, n.Stop = d, stop
	if err := store.NoteCall(runID, callID, n); err != nil {
		t.Fatal(err)
	}
	if err := store.RecordFinal(runID, callID, d, stop); err != nil {
		t.Fatal(err)
	}
}

func getRun(t *testing.T, url string) statuspage.RunPage {
	t.Helper()
	var rp statuspage.RunPage
	if err := json.Unmarshal([]byte(getPage(t, url)), &rp); err != nil {
		t.Fatalf("decode %s: %v", url, err)
	}
	return rp
}

func TestRunPageListsTheDeadLetters(t *testing.T) {
	store := openStore(t, nil)
	run, err := store.OpenRun(policy.Run{ID: "nightly", Tenant: "acme", Pool: 30, Cutoff: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	noteFinal(t, store, run.ID, "doc-1", policy.DispositionSucceeded, policy.StopNone, policy.CallNote{Target: "geo", Attempt: 1, Time: at})
	noteFinal(t, store, run.ID, "doc-2", policy.DispositionDeadLetter, policy.StopAttemptsExhausted, policy.CallNote{
		Target: "geo", TriageRef: "s3://inbox/doc-2", Attempt: 3, Classification: "transient:503", Detail: "3 of 3 attempts", Time: at})
	noteFinal(t, store, run.ID, "doc-3", policy.DispositionCircuitOpen, policy.StopCircuitOpen, policy.CallNote{Target: "geo", Attempt: 1, Time: at})
	noteFinal(t, store, run.ID, "doc-4", policy.DispositionFailedTerminal, policy.StopTerminal, policy.CallNote{Target: "geo", Attempt: 1, Classification: "terminal:422", Time: at})

	_, url := serve(t, statuspage.Config{Source: store, Open: true})
	if html := getPage(t, url+"/status"); !strings.Contains(html, `href="status/runs/nightly"`) {
		t.Errorf("the run's row does not link to its dead-letter list:\n%s", html)
	}
	rp := getRun(t, url+"/status/runs/nightly.json")
	var ids []string
	for _, c := range rp.Calls {
		ids = append(ids, c.CallID+" "+c.Disposition+" "+c.Stop)
	}
	if got, want := strings.Join(ids, ", "), "doc-2 DEAD_LETTER ATTEMPTS_EXHAUSTED, doc-3 CIRCUIT_OPEN CIRCUIT_OPEN, doc-4 FAILED_TERMINAL TERMINAL"; got != want {
		t.Errorf("calls: got %s, want %s (the succeeded one left out)", got, want)
	}
	want := statuspage.RunCall{CallID: "doc-2", Disposition: "DEAD_LETTER", Stop: "ATTEMPTS_EXHAUSTED", Attempts: 3,
		Classification: "transient:503", Detail: "3 of 3 attempts", Target: "geo", TriageRef: "s3://inbox/doc-2", First: at, Last: at}
	if len(rp.Calls) == 0 || fmt.Sprint(rp.Calls[0]) != fmt.Sprint(want) {
		t.Errorf("doc-2: got %+v, want %+v", rp.Calls, want)
	}
	if rp.Run.ID != "nightly" || rp.Run.Ledger.DeadLetter.Exhausted != 1 || rp.Next != "" {
		t.Errorf("run: got %+v, next %q; want nightly with one exhausted dead letter, no next page", rp.Run, rp.Next)
	}
	html := getPage(t, url+"/status/runs/nightly")
	for _, want := range []string{`data-call="doc-2"`, "transient:503", "s3://inbox/doc-2", `data-call="doc-4"`} {
		if !strings.Contains(html, want) {
			t.Errorf("the run's page lacks %q", want)
		}
	}
	if strings.Contains(html, `data-call="doc-1"`) {
		t.Errorf("the run's page lists doc-1, which succeeded")
	}

	resp, err := http.Get(url + "/status/runs/nope")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), `run "nope" not found`) {
		t.Errorf("unknown run: got %s %q, want 404 naming the run", resp.Status, body)
	}
}

func TestRunPagePagesAHundredAtATime(t *testing.T) {
	store := openStore(t, nil)
	// An id with a slash and a .json ending still has its own page.
	const id = "batch/2026.json"
	if _, err := store.OpenRun(policy.Run{ID: id, Tenant: "acme", Pool: 3, Cutoff: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	for i := range 250 {
		noteFinal(t, store, id, fmt.Sprintf("doc-%03d", i), policy.DispositionDeadLetter, policy.StopBudgetExhausted, policy.CallNote{Attempt: 2})
	}
	_, url := serve(t, statuspage.Config{Source: store, Open: true})
	base := url + "/status/runs/batch%2F2026%2Ejson"
	var got []int
	after := ""
	for page := 0; ; page++ {
		u := base + ".json"
		if after != "" {
			u += "?after=" + after
		}
		rp := getRun(t, u)
		if rp.Run.ID != id {
			t.Fatalf("page %d: got run %q, want %q", page, rp.Run.ID, id)
		}
		got = append(got, len(rp.Calls))
		if rp.Next == "" {
			break
		}
		if last := rp.Calls[len(rp.Calls)-1].CallID; rp.Next != last {
			t.Errorf("page %d: next %q, want the last call listed, %q", page, rp.Next, last)
		}
		after = rp.Next
	}
	if fmt.Sprint(got) != "[100 100 50]" {
		t.Errorf("pages: got %v calls, want [100 100 50]", got)
	}
	html := getPage(t, base)
	if !strings.Contains(html, `class="more" href="./batch%2f2026%2Ejson?after=doc-099"`) &&
		!strings.Contains(html, `class="more" href="./batch%2F2026%2Ejson?after=doc-099"`) {
		i := strings.Index(html, `class="more"`)
		t.Errorf("the first page's more link: got %q, want it after doc-099", html[max(i, 0):min(len(html), max(i, 0)+120)])
	}
	if html := getPage(t, base+"?after=doc-099"); !strings.Contains(html, `data-call="doc-100"`) || strings.Contains(html, `data-call="doc-099"`) {
		t.Errorf("the second page does not start at doc-100")
	}
}

func TestRunPageNeedsTheAdminTokenOffLoopback(t *testing.T) {
	store := openStore(t, nil)
	if _, err := store.OpenRun(policy.Run{ID: "nightly", Tenant: "acme", Pool: 3, Cutoff: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	const token = "s3cret-admin-token"
	_, url := serve(t, statuspage.Config{Source: store, Admin: func(tok string) bool { return tok == token }})
	for _, path := range []string{"/status/runs/nightly", "/status/runs/nightly.json"} {
		for _, auth := range []string{"", "Bearer " + token} {
			req, _ := http.NewRequest("GET", url+path, nil)
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if want := map[bool]int{false: 401, true: 200}[auth != ""]; resp.StatusCode != want {
				t.Errorf("GET %s with credential %v: got %s, want %d", path, auth != "", resp.Status, want)
			}
		}
	}
}

// TestEventsCarryTheChainsOfABreakerChange opens the event stream and
// opens a policy's primary: the rendering sent for the change shows its
// fallback chain with the primary OPEN, and the ceiling beside it.
func TestEventsCarryTheChainsOfABreakerChange(t *testing.T) {
	store := openStore(t, nil)
	setPolicy(t, store, "acme", "primary", func(p *policy.Policy) {
		p.Breaker = consecutive
		p.Fallback = policy.Fallback{Targets: []string{"geocoder-b"}, OnCircuitOpen: true}
		p.Flow = policy.FlowConfig{MaxInFlight: 3}
	})
	admit(t, store, "acme", "primary", 2)
	_, url := serve(t, statuspage.Config{Source: store, Open: true, Refresh: time.Hour})
	events := openStream(t, url)
	chainReads := func(want string) func(string) bool {
		return func(data string) bool {
			i := strings.Index(data, `<tr class="escalation" data-tenant="acme" data-target="primary">`)
			if i < 0 {
				return false
			}
			row := data[i:]
			row = row[:strings.Index(row, "</tr>")]
			return strings.Contains(strings.Join(strings.Fields(stripTags(row)), " "), want)
		}
	}
	first := await(t, events, "the chain with the primary CLOSED", chainReads("primary CLOSED → geocoder-b CLOSED"))
	if !strings.Contains(first, "2 / 3") {
		t.Errorf("the first rendering lacks the primary's ceiling, 2 / 3 leases in flight")
	}
	fail(t, store, policy.BreakerKey{Tenant: "acme", Target: "primary"}, consecutive, 5)
	await(t, events, "the chain with the primary OPEN", chainReads("primary OPEN → geocoder-b CLOSED"))
}
