package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/server"
	"github.com/policyd/policyd/statuspage"
)

func TestStatusPageOpenOnlyOnLoopback(t *testing.T) {
	closed := server.NewAuth(server.AuthConfig{AdminTokens: []string{"t"}})
	open := server.NewAuth(server.AuthConfig{OpenAdmin: true})
	for _, tc := range []struct {
		listen string
		auth   *server.Auth
		want   bool
	}{
		{"127.0.0.1:9464", closed, true},
		{"127.0.0.2:9464", closed, true},
		{"[::1]:9464", closed, true},
		{"localhost:9464", closed, true},
		{":9464", closed, false},
		{"0.0.0.0:9464", closed, false},
		{"192.0.2.7:9464", closed, false},
		{"status.example:9464", closed, false},
		{":9464", open, true}, // --open-admin opens the page as it opens admin calls
	} {
		if got := statusOpen(tc.listen, tc.auth); got != tc.want {
			t.Errorf("statusOpen(%q, open admin %v): got %v, want %v", tc.listen, tc.auth.OpenAdmin(), got, tc.want)
		}
	}
	if !closed.AdminToken("t") || closed.AdminToken("u") || closed.AdminToken("") {
		t.Errorf("AdminToken: want true for the admin token only")
	}
}

// TestDaemonServesTheStatusPage reads a real daemon's status page on its
// loopback metrics listener, and stops the daemon with an event stream
// open: the stream ends and the metrics endpoint stops cleanly.
func TestDaemonServesTheStatusPage(t *testing.T) {
	metrics := freeAddr(t)
	d := startDaemon(t, filepath.Join(t.TempDir(), "policyd.db"), "--metrics-listen", metrics)
	conn := d.conn(t)
	if _, err := pb.NewAdminServiceClient(conn).ForceBreaker(context.Background(), &pb.ForceBreakerRequest{
		Key: &pb.BreakerKey{Tenant: "acme", Target: "geo"}, State: pb.BreakerState_BREAKER_STATE_OPEN,
	}); err != nil {
		t.Fatal(err)
	}

	resp, err := http.Get("http://" + metrics + "/status.json")
	if err != nil {
		t.Fatalf("GET /status.json: %v; daemon said: %s", err, d.stderr)
	}
	var st statuspage.Status
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /status.json: %s, %v", resp.Status, err)
	}
	if len(st.Breakers) != 1 || st.Breakers[0].Target != "geo" || st.Breakers[0].State != "OPEN" || !st.Breakers[0].Forced {
		t.Errorf("breakers: got %+v, want acme/geo forced OPEN", st.Breakers)
	}
	if st.Store == nil || st.Store.Engine != "bbolt" || st.Store.State != "OK" || !st.Store.Up || st.Store.File != "policyd.db" {
		t.Errorf("store: got %+v, want bbolt on policyd.db, up, OK", st.Store)
	}
	if len(st.Replicas) != 1 || st.Replicas[0].ID != "policyd.db" || !st.Replicas[0].Self {
		t.Errorf("replicas: got %+v, want this daemon alone, named after its file", st.Replicas)
	}

	stream, err := http.Get("http://" + metrics + "/status/events")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	lines := bufio.NewScanner(stream.Body)
	lines.Buffer(nil, 1<<20)
	for lines.Scan() && lines.Text() != "event: status" {
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for lines.Scan() {
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v; daemon said: %s", err, d.stderr)
	}
	if log := d.stderr.String(); strings.Contains(log, "did not stop cleanly") || !strings.Contains(log, "policyd stopped") {
		t.Errorf("the metrics endpoint did not stop cleanly with an event stream open: %s", log)
	}
}

// TestDaemonStatusPageListsTheRedisReplicas runs two daemons on one Redis
// the test starts, and reads the replica set on one's status page: both
// replicas, this one marked, the store up.
func TestDaemonStatusPageListsTheRedisReplicas(t *testing.T) {
	srv := redistest.Standalone(t)
	dir := t.TempDir()
	url := "redis://" + srv.Addr
	metrics := freeAddr(t)
	a := startDaemon(t, filepath.Join(dir, "a.db"), "--store", url, "--metrics-listen", metrics)
	b := startDaemon(t, filepath.Join(dir, "b.db"), "--store", url)
	a.conn(t) // both serving
	b.conn(t)

	var st statuspage.Status
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for ; ; <-tick.C {
		resp, err := http.Get("http://" + metrics + "/status.json")
		if err != nil {
			t.Fatalf("GET /status.json: %v; daemon said: %s", err, a.stderr)
		}
		st = statuspage.Status{}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Replicas) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replicas: got %+v 10s after both started, want two", st.Replicas)
		}
	}
	if st.Store == nil || st.Store.Engine != "redis" || !st.Store.Up || st.Store.State != "OK" || st.Store.Replica == "" {
		t.Fatalf("store: got %+v, want redis, up, OK, with this replica's id", st.Store)
	}
	selves := 0
	for _, r := range st.Replicas {
		if r.Self {
			selves++
			if r.ID != st.Store.Replica {
				t.Errorf("the replica marked self is %q, the store says this replica is %q", r.ID, st.Store.Replica)
			}
		}
		if r.LastSeen.IsZero() {
			t.Errorf("replica %s: no last heartbeat", r.ID)
		}
	}
	if selves != 1 {
		t.Errorf("replicas: got %+v, want exactly one marked as this one", st.Replicas)
	}
}
