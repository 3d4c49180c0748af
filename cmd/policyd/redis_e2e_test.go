package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
)

// TestTwoReplicasOnOneRedis runs two daemons with --store redis:// over one
// Redis the test starts: a breaker forced OPEN through one replica's admin
// API refuses on the other; then policyd check --store finds the keys
// they wrote in order. A replica serves the shared store's series.
func TestTwoReplicasOnOneRedis(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	url := "redis://" + srv.Addr
	metrics := freeAddr(t)
	a := startDaemon(t, filepath.Join(dir, "a.db"), "--store", url, "--metrics-listen", metrics)
	b := startDaemon(t, filepath.Join(dir, "b.db"), "--store", url)
	ca, cb := a.conn(t), b.conn(t)
	ctx := context.Background()
	call := &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "c1", Idempotent: true}
	if r, err := pb.NewRetryPolicyServiceClient(cb).Admit(ctx, &pb.AdmitRequest{Call: call, Attempt: 1}); err != nil || !r.GetAdmitted() {
		t.Fatalf("Admit on replica b: %v, %v; want admitted", r, err)
	}
	if _, err := pb.NewAdminServiceClient(ca).ForceBreaker(ctx, &pb.ForceBreakerRequest{
		Key: &pb.BreakerKey{Tenant: "acme", Target: "geo"}, State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
		t.Fatalf("ForceBreaker on replica a: %v; it said: %s", err, a.stderr)
	}
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		r, err := pb.NewRetryPolicyServiceClient(cb).Admit(ctx, &pb.AdmitRequest{Call: call, Attempt: 1})
		if err == nil && !r.GetAdmitted() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica b still admits 5s after the breaker was forced OPEN on a: %v, %v", r, err)
		}
	}
	if !strings.Contains(a.stderr.String(), `"store":"redis://`+srv.Addr) {
		t.Errorf("replica a does not log its store: %s", a.stderr)
	}
	if out, err := runCLI(t, dir, "check", "--store", url); err != nil || !strings.Contains(string(out), url+": ok") {
		t.Errorf("policyd check --store %s = %v: %s; want ok", url, err, out)
	}
	body := scrape(t, a, metrics)
	for _, want := range []string{"policyd_store_up 1", "policyd_store_queued_batches 0", "policyd_store_dropped_batches_total 0",
		"policyd_store_degraded_attempts 0", "policyd_store_degraded_attempts_not_kept_total 0",
		`policyd_store_round_trips_total{call="`, "policyd_audit_buffered ", "policyd_audit_dropped_total 0", "policyd_store_down_total 0"} {
		if !strings.Contains(body, want) {
			t.Errorf("replica a's metrics lack %s", want)
		}
	}
	// ForceBreaker made at least one round trip on a, timed.
	if n := sampleValue(t, body, "policyd_store_round_trip_seconds_count"); n < 1 {
		t.Errorf("replica a's policyd_store_round_trip_seconds_count = %v; want at least 1 round trip timed", n)
	}
	// The series of the alert rules that come with the Redis engine are
	// served (TestMetricsShowBreakersReloadsAndGRPC checks the others on
	// bbolt).
	for name := range redisOnlySeries {
		if !regexp.MustCompile(`(?m)^` + name + `[{ ]`).MatchString(body) {
			t.Errorf("deploy/prometheus/alerts.yaml uses %s, which replica a does not serve", name)
		}
	}
}

func TestStoreURLs(t *testing.T) {
	tests := []struct {
		in, kind, shown, err string
	}{
		{in: "", kind: "bbolt", shown: "bbolt:policyd.db"},
		{in: "bbolt:/var/lib/x.db", kind: "bbolt", shown: "bbolt:/var/lib/x.db"},
		{in: "redis://u:secret@127.0.0.1:6379/2", kind: "*redis.Client", shown: "redis://u:xxxxx@127.0.0.1:6379/2"},
		{in: "rediss://127.0.0.1:6380", kind: "*redis.Client", shown: "rediss://127.0.0.1:6380"},
		{in: "redis+sentinel://mymaster@127.0.0.1:26379,127.0.0.1:26380", kind: "*redis.Client"},
		{in: "redis+sentinel://u:secret@mymaster@127.0.0.1:26379/1", kind: "*redis.Client", shown: "redis+sentinel://u:xxxxx@mymaster@127.0.0.1:26379/1"},
		{in: "redis+cluster://127.0.0.1:7000,127.0.0.1:7001", kind: "*redis.ClusterClient"},
		{in: "bbolt:", err: "--store: bbolt:PATH needs a path"},
		{in: "mysql://x", err: "--store: must be bbolt:PATH, redis://"},
		{in: "redis+sentinel://127.0.0.1:26379", err: "needs the master's name"},
		{in: "redis+cluster://127.0.0.1", err: "every address must be host:port"},
		{in: "redis+cluster://127.0.0.1:7000/3", err: "takes no database"},
		{in: "redis+sentinel://m@127.0.0.1:26379/x", err: "the database must be a number"},
		{in: "redis://127.0.0.1:6379/notadb", err: "--store: redis: invalid database number"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			u, err := parseStore(tt.in, "policyd.db")
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("parseStore(%q) = %v, want an error containing %q", tt.in, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseStore(%q) = %v", tt.in, err)
			}
			kind := "bbolt"
			if u.redis != nil {
				defer u.redis.Close()
				switch u.redis.(type) {
				case *redis.Client:
					kind = "*redis.Client"
				case *redis.ClusterClient:
					kind = "*redis.ClusterClient"
				}
			}
			if kind != tt.kind || (tt.shown != "" && u.shown != tt.shown) {
				t.Errorf("parseStore(%q) = %s shown %q, want %s %q", tt.in, kind, u.shown, tt.kind, tt.shown)
			}
		})
	}
}

// TestReplicaWaitsForRedis: a replica started before its Redis retries
// instead of exiting, and serves once Redis is up.
func TestReplicaWaitsForRedis(t *testing.T) {
	port := redistest.FreePort(t)
	d := startDaemon(t, filepath.Join(t.TempDir(), "a.db"), "--store", "redis://127.0.0.1:"+strconv.Itoa(port))
	d.stderr.waitFor(t, "Redis not ready; retrying", 2)
	redistest.StandaloneOn(t, port)
	conn := d.conn(t)
	call := &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "c1", Idempotent: true}
	if r, err := pb.NewRetryPolicyServiceClient(conn).Admit(context.Background(), &pb.AdmitRequest{Call: call, Attempt: 1}); err != nil || !r.GetAdmitted() {
		t.Fatalf("Admit once Redis is up: %v, %v; want admitted", r, err)
	}
}

// TestBreakersWhileRedisStopped: with Redis stopped (SIGSTOP) a replica
// in degraded mode shows an operator the breakers it decides from, its
// last-known states, and says so: `policyd breakers` lists the breaker
// forced OPEN before the stop and a note, the status page's JSON flags
// each breaker degraded and its page says whose states these are.
func TestBreakersWhileRedisStopped(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	metrics := freeAddr(t)
	d := startDaemon(t, filepath.Join(dir, "policyd.db"), "--store", "redis://"+srv.Addr, "--store-timeout", "50ms",
		"--metrics-listen", metrics)
	workers := pb.NewRetryPolicyServiceClient(d.conn(t))
	if out, err := runCLI(t, dir, "breaker", "force", "geo", "open", "--tenant", "acme", "--addr", d.addr); err != nil {
		t.Fatalf("policyd breaker force: %v\n%s", err, out)
	}
	srv.Pause(t)
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; ; n++ {
		// Failures reach the engine; those it does not answer bring it down.
		r, err := workers.NextDelay(context.Background(), &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "mail",
			CallId: "c" + strconv.Itoa(n), Idempotent: true}, Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}})
		if err == nil && r.GetDegraded() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no degraded answer 10s after Redis stopped: %v, %v", r, err)
		}
	}
	out, err := runCLI(t, dir, "breakers", "--addr", d.addr)
	if err != nil {
		t.Fatalf("policyd breakers with Redis stopped: %v\n%s", err, out)
	}
	if !regexp.MustCompile(`(?m)^acme +geo +OPEN \(forced\)`).Match(out) || !strings.Contains(string(out), "degraded: the replica's store did not answer") {
		t.Errorf("policyd breakers with Redis stopped does not list acme/geo forced OPEN as last known:\n%s", out)
	}
	resp, err := http.Get("http://" + metrics + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Breakers []struct {
			Tenant, Target, State string
			Degraded              bool
		}
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var geo bool
	for _, b := range st.Breakers {
		geo = geo || b.Tenant == "acme" && b.Target == "geo" && b.State == "OPEN"
		if !b.Degraded {
			t.Errorf("status.json with Redis stopped: %s/%s not flagged degraded", b.Tenant, b.Target)
		}
	}
	if !geo {
		t.Errorf("status.json with Redis stopped lacks acme/geo OPEN: %+v", st.Breakers)
	}
	page, err := http.Get("http://" + metrics + "/status")
	if err != nil {
		t.Fatal(err)
	}
	html, _ := io.ReadAll(page.Body)
	page.Body.Close()
	if !strings.Contains(string(html), "the breakers as this replica last knew them") {
		t.Errorf("the status page with Redis stopped does not say its breakers are the replica's last known:\n%s", html)
	}
}
