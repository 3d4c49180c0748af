package e2e_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// setFallback stores acme's policy of target geo-a: attempts and the
// fallback chain.
func setFallback(t *testing.T, d *daemon, attempts uint32, fb *pb.FallbackSettings) {
	t.Helper()
	if _, err := d.admin.SetPolicy(context.Background(), &pb.SetPolicyRequest{Tenant: "acme", Target: "geo-a",
		Policy: &pb.Policy{MaxAttempts: &attempts, Fallback: fb}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
}

func hostOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// TestTransportEscalatesToTheFallback: a primary failing 503 and a
// healthy fallback, after_attempts 1: the first attempt goes to the
// primary, the second to the fallback's host (Transport.Hosts), whose
// response is returned; OnEvent tells the fallback taken and the attempts'
// targets.
func TestTransportEscalatesToTheFallback(t *testing.T) {
	d := startDaemon(t, nil)
	setFallback(t, d, 3, &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1})
	var ev events
	var all []policyclient.Event
	c, _ := newClient(t, d, func(cfg *policyclient.Config) {
		cfg.OnEvent = func(e policyclient.Event) {
			ev.on(e)
			if e.Kind == policyclient.EventAttemptStarted || e.Kind == policyclient.EventFallbackTaken {
				ev.mu.Lock()
				all = append(all, e)
				ev.mu.Unlock()
			}
		}
	})
	primary := startFlakyHTTP(t, reply{status: 503, body: "down"})
	fallback := startFlakyHTTP(t, reply{status: 200, body: "geocoded by b"})
	hc := &http.Client{Transport: &policyclient.Transport{Client: c,
		Call: func(*http.Request) policyclient.Call {
			return policyclient.Call{Target: "geo-a", SubmissionID: "doc-1"}
		},
		Hosts: map[string]string{"geo-b": hostOf(t, fallback.srv.URL)}}}
	resp, err := hc.Get(primary.srv.URL + "/geocode?q=x")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if got := readAll(t, resp); resp.StatusCode != 200 || got != "geocoded by b" {
		t.Fatalf("final response: %d %q, want 200 from the fallback", resp.StatusCode, got)
	}
	if p, f := len(primary.requests()), len(fallback.requests()); p != 1 || f != 1 {
		t.Fatalf("upstream calls: primary %d, fallback %d; want 1 and 1", p, f)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var got []string
	for _, e := range all {
		s := e.Kind.String() + "/" + string(rune('0'+e.Attempt)) + "/" + e.Target
		if e.From != "" {
			s += "<-" + e.From
		}
		got = append(got, s)
	}
	want := "[attempt_started/1/geo-a fallback_taken/2/geo-b<-geo-a attempt_started/2/geo-b]"
	if strings.Join(got, " ") != strings.Trim(want, "[]") {
		t.Fatalf("events:\n got %v\nwant %s", got, want)
	}
}

// TestTransportRefusesAFallbackWithoutAHost: a fallback target that
// Transport.Hosts does not map is a terminal error naming it, never a
// request sent to the primary again.
func TestTransportRefusesAFallbackWithoutAHost(t *testing.T) {
	d := startDaemon(t, nil)
	setFallback(t, d, 3, &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1})
	c, _ := newClient(t, d, nil)
	primary := startFlakyHTTP(t, reply{status: 503, body: "down"})
	hc := &http.Client{Transport: &policyclient.Transport{Client: c,
		Call: func(*http.Request) policyclient.Call {
			return policyclient.Call{Target: "geo-a", SubmissionID: "doc-1"}
		}}}
	_, err := hc.Get(primary.srv.URL)
	var ce *policyclient.CallError
	if !errors.As(err, &ce) || ce.Result.Disposition != policyclient.FailedTerminal || !strings.Contains(err.Error(), `no host for fallback target "geo-b"`) {
		t.Fatalf("Get: %v, want a terminal CallError naming the fallback target without a host", err)
	}
	if n := len(primary.requests()); n != 1 {
		t.Fatalf("primary saw %d requests, want 1: the fallback's attempt must not go to it", n)
	}
}

// TestDoEscalatesOnAnOpenCircuit: with on_circuit_open, the failure that
// opens the primary's breaker is retried on the fallback (NextDelay names
// it), and a later call to the open primary goes to the fallback from its
// first attempt (Admit names it, the client having seen the policy
// escalate), Attempt.Target saying so; the outcomes are recorded against
// the fallback, with the primary as primary_target.
func TestDoEscalatesOnAnOpenCircuit(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := context.Background()
	one, attempts := uint32(1), uint32(3)
	if _, err := d.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "geo-a", Policy: &pb.Policy{
		MaxAttempts: &attempts, Breaker: &pb.BreakerSettings{ConsecutiveFailures: &one},
		Fallback: &pb.FallbackSettings{Targets: []string{"geo-b"}, OnCircuitOpen: true}}}); err != nil {
		t.Fatal(err)
	}
	// The client has seen geo-a open once its WatchBreakers stream says so
	// (its cache, which lets a call on a CLOSED breaker skip Admit, is
	// updated before the event).
	opened := make(chan struct{})
	var once sync.Once
	c, _ := newClient(t, d, func(cfg *policyclient.Config) {
		cfg.OnEvent = func(e policyclient.Event) {
			if e.Kind == policyclient.EventBreakerChanged && e.Target == "geo-a" && e.Breaker == pb.BreakerState_BREAKER_STATE_OPEN {
				once.Do(func() { close(opened) })
			}
		}
	})
	do := func(id string) []string {
		t.Helper()
		var targets []string
		res, err := c.Do(ctx, policyclient.Call{Target: "geo-a", SubmissionID: id, Idempotent: true},
			func(_ context.Context, a policyclient.Attempt) error {
				targets = append(targets, a.Target)
				if a.Target == "geo-a" {
					return policyclient.HTTPError(503, nil)
				}
				return nil
			})
		if err != nil || !res.OK() {
			t.Fatalf("Do(%s): %+v, %v; want success on the fallback", id, res, err)
		}
		return targets
	}
	if got := strings.Join(do("doc-1"), " "); got != "geo-a geo-b" {
		t.Fatalf("doc-1: Attempt.Target of each attempt: %s, want geo-a geo-b (the 503 opened geo-a)", got)
	}
	select {
	case <-opened:
	case <-time.After(10 * time.Second):
		t.Fatal("the client's WatchBreakers did not report geo-a OPEN within 10s")
	}
	if got := strings.Join(do("doc-2"), " "); got != "geo-b" {
		t.Fatalf("doc-2: Attempt.Target of each attempt: %s, want geo-b (Admit past the open geo-a)", got)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"doc-1", "doc-2"} {
		audit, err := d.admin.QueryAudit(ctx, &pb.QueryAuditRequest{CallId: id, Tenant: "acme"})
		if err != nil {
			t.Fatal(err)
		}
		recs := audit.GetRecords()
		if len(recs) == 0 || recs[len(recs)-1].GetTarget() != "geo-b" || recs[len(recs)-1].GetPrimaryTarget() != "geo-a" {
			t.Fatalf("audit of %s: %v, want the success recorded on geo-b with primary geo-a", id, recs)
		}
	}
}

// forceOpen forces acme's breaker of target OPEN.
func forceOpen(t *testing.T, d *daemon, target string) {
	t.Helper()
	if _, err := d.admin.ForceBreaker(context.Background(), &pb.ForceBreakerRequest{
		Key: &pb.BreakerKey{Tenant: "acme", Target: target}, State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
		t.Fatalf("ForceBreaker(%s): %v", target, err)
	}
}

// TestFreshClientEscalatesPastAKnownOpenPrimary: a client that starts
// while the primary's breaker is OPEN, and has never seen policyd move a
// call, knows from the watch snapshot that the primary's chain escalates
// on an open circuit: its first attempt goes to the fallback (one Admit
// RPC, which names it), while a call to an open target without such a
// chain still fails fast without an RPC. (Before the snapshot told the
// chains, the first call failed CIRCUIT_OPEN without asking policyd.)
func TestFreshClientEscalatesPastAKnownOpenPrimary(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := context.Background()
	setFallback(t, d, 3, &pb.FallbackSettings{Targets: []string{"geo-b"}, OnCircuitOpen: true})
	forceOpen(t, d, "geo-a")
	forceOpen(t, d, "geo-x")
	var ev events
	c, _ := newClient(t, d, func(cfg *policyclient.Config) { cfg.OnEvent = ev.on })
	var targets []string
	res, err := c.Do(ctx, policyclient.Call{Target: "geo-a", SubmissionID: "doc-1", Idempotent: true},
		func(_ context.Context, a policyclient.Attempt) error {
			targets = append(targets, a.Target)
			return nil
		})
	if err != nil || !res.OK() || strings.Join(targets, " ") != "geo-b" {
		t.Fatalf("Do(geo-a): %v after attempts on %v (err %v), want success on geo-b from the first attempt", res.Disposition, targets, err)
	}
	if got := c.Stats().AdmitRPCs; got != 1 {
		t.Fatalf("Admit RPCs: %d, want 1 (the open primary's escalation)", got)
	}
	fn, calls := script()
	res, _ = c.Do(ctx, policyclient.Call{Target: "geo-x", Idempotent: true}, fn)
	if res.Disposition != policyclient.CircuitOpen || calls.Load() != 0 {
		t.Fatalf("Do(geo-x): %v with fn called %d times, want circuit_open without calling fn", res.Disposition, calls.Load())
	}
	if got := c.Stats().AdmitRPCs; got != 1 {
		t.Fatalf("Admit RPCs after the call to geo-x: %d, want still 1 (an open target without a chain costs none)", got)
	}
}

// fallbackChainVector is one fallback_chains case of the shared vectors.
type fallbackChainVector struct {
	Name     string `json:"name"`
	Primary  string `json:"primary"`
	Fallback struct {
		Targets       []string `json:"targets"`
		AfterAttempts uint32   `json:"after_attempts"`
		OnCircuitOpen bool     `json:"on_circuit_open"`
	} `json:"fallback"`
	Open        []string `json:"open"`
	Targets     []string `json:"targets"`
	Disposition string   `json:"disposition"`
	StopReason  string   `json:"stop_reason"`
}

// TestFallbackChainVectors runs each fallback_chains vector through Do
// against a real daemon, with the breakers it names forced open and every
// attempt failing 503: once with policyd answering (its Admit and
// NextDelay route the call), once with policyd stopped after the client
// learnt the chain and the breakers from the watch snapshot (the local
// policy routes it). Both must give the vector's targets and end.
func TestFallbackChainVectors(t *testing.T) {
	for _, v := range loadVectors(t).FallbackChains {
		for _, stopped := range []bool{false, true} {
			name := v.Name
			if stopped {
				name += " (policyd stopped)"
			}
			t.Run(name, func(t *testing.T) {
				d := startDaemon(t, nil)
				if v.Primary != "geo-a" {
					t.Fatalf("primary %q: setFallback stores geo-a's policy", v.Primary)
				}
				setFallback(t, d, 3, &pb.FallbackSettings{Targets: v.Fallback.Targets,
					AfterAttempts: v.Fallback.AfterAttempts, OnCircuitOpen: v.Fallback.OnCircuitOpen})
				for _, o := range v.Open {
					forceOpen(t, d, o)
				}
				c, _ := newClient(t, d, func(cfg *policyclient.Config) { cfg.DecisionTimeout = 500 * time.Millisecond })
				if stopped {
					d.gs.Stop()
				}
				targets := []string{}
				res, err := c.Do(context.Background(), policyclient.Call{Target: v.Primary, SubmissionID: "doc-1", Idempotent: true},
					func(_ context.Context, a policyclient.Attempt) error {
						targets = append(targets, a.Target)
						return policyclient.HTTPError(503, nil)
					})
				if err != nil {
					t.Fatal(err)
				}
				got := strings.Join(targets, " ") + " " + res.Disposition.String() + "/" + res.StopReason.String()
				if want := strings.Join(v.Targets, " ") + " " + v.Disposition + "/" + v.StopReason; got != want {
					t.Errorf("targets and end: %s, want %s", got, want)
				}
				if stopped && len(targets) > 0 && !res.Local {
					t.Errorf("policyd stopped: Result.Local false, want the decisions local")
				}
				cctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				c.Close(cctx) // with policyd stopped its outcomes cannot be sent: bounded
			})
		}
	}
}

// TestChainSetLaterIsLearntFromAReport: a chain stored after the client's
// watch snapshot reaches it with the next outcome report of a call to the
// primary, so once the primary's breaker opens the client asks Admit and
// goes to the fallback instead of failing fast. (Before reports told the
// chains, the call ended circuit_open without an attempt.)
func TestChainSetLaterIsLearntFromAReport(t *testing.T) {
	d := startDaemon(t, nil)
	ctx := context.Background()
	opened := make(chan struct{})
	c, _ := newClient(t, d, func(cfg *policyclient.Config) {
		cfg.OnEvent = func(e policyclient.Event) {
			if e.Kind == policyclient.EventBreakerChanged && e.Target == "geo-a" && e.Breaker == pb.BreakerState_BREAKER_STATE_OPEN {
				close(opened)
			}
		}
	})
	setFallback(t, d, 3, &pb.FallbackSettings{Targets: []string{"geo-b"}, OnCircuitOpen: true})
	ok, _ := script()
	if res, _ := c.Do(ctx, policyclient.Call{Target: "geo-a", Idempotent: true}, ok); !res.OK() {
		t.Fatalf("Do(geo-a): %v, want success", res.Disposition)
	}
	// A failure elsewhere: its NextDelay first sends the queued outcomes,
	// geo-a's success among them, and the report's answer names the chain.
	fn, _ := script(policyclient.HTTPError(503, nil))
	if res, _ := c.Do(ctx, policyclient.Call{Target: "elsewhere", Idempotent: true}, fn); !res.OK() {
		t.Fatalf("Do(elsewhere): %v, want success on attempt 2", res.Disposition)
	}
	forceOpen(t, d, "geo-a")
	waitFor(t, opened, "the client seeing geo-a OPEN")
	admits := c.Stats().AdmitRPCs
	var targets []string
	res, _ := c.Do(ctx, policyclient.Call{Target: "geo-a", Idempotent: true}, func(_ context.Context, a policyclient.Attempt) error {
		targets = append(targets, a.Target)
		return nil
	})
	if !res.OK() || strings.Join(targets, " ") != "geo-b" {
		t.Fatalf("Do(geo-a) with geo-a open: %v after attempts on %v, want success on geo-b", res.Disposition, targets)
	}
	if n := c.Stats().AdmitRPCs - admits; n != 1 {
		t.Fatalf("Admit RPCs for the call: %d, want 1", n)
	}
}
