package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// TestFlowWorkerSmoke runs one flow worker of 6 goroutines for 300ms
// against an in-process policyd on loopback whose policy holds the target
// to 2 requests at once, and the fake upstream: every request the upstream
// saw held a lease, it never held more than 2 at once, and the report is
// well formed. It asserts nothing about speed.
func TestFlowWorkerSmoke(t *testing.T) {
	dir := t.TempDir()
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(dir, "policyd.db")})
	if err != nil {
		t.Fatal(err)
	}
	gs := server.New(store, server.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(func() {
		gs.Stop()
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	})
	cfg := flowConfig{Phases: []string{"concurrency"}, MaxInFlight: 2, BaseDelay: time.Millisecond}
	ph := cfg.phases()[0]
	conn, err := dial(lis.Addr().String(), "anything")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := pb.NewAdminServiceClient(conn).SetPolicy(context.Background(), &pb.SetPolicyRequest{
		Tenant: flowTenant, Target: ph.target, Policy: ph.policy}); err != nil {
		t.Fatal(err)
	}
	up, err := startUpstream(5 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer up.close()
	start, length := time.Now(), 300*time.Millisecond
	up.reset("/concurrency", start, length, 0)

	var out bytes.Buffer
	// A decision timeout no loaded test machine reaches: an Admit the
	// client gave up on would be admitted without a lease.
	wcfg := flowWorkerConfig{Addr: lis.Addr().String(), URL: "http://" + up.addr + "/concurrency", Target: ph.target,
		Workers: 6, Start: start.UnixNano(), Duration: length, DecisionTimeout: 10 * time.Second}
	stdin, parent := io.Pipe() // the worker ends early when its stdin closes
	defer parent.Close()
	if err := runFlowWorker(context.Background(), wcfg, stdin, &out); err != nil {
		t.Fatal(err)
	}
	var rep flowWorkerReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report does not parse: %v\n%s", err, out.String())
	}
	got := up.counts()
	if got.requests == 0 || rep.Calls == 0 || rep.Succeeded != rep.Calls || rep.AdmitErrors != 0 {
		t.Errorf("upstream saw %d requests; worker report %+v; want some calls, all succeeded, no Admit failing", got.requests, rep)
	}
	if got.maxInFlight > 2 {
		t.Errorf("upstream held %d requests at once, want at most the ceiling 2", got.maxInFlight)
	}
	if got.requests+got.stray > rep.Leases {
		t.Errorf("upstream saw %d requests (%d outside the phase) for %d leases, want one lease each", got.requests, got.stray, rep.Leases)
	}
	if len(rep.AdmittedPerSecond) != 1 || rep.AdmittedPerSecond[0] == 0 {
		t.Errorf("admitted per second %v, want one second with some", rep.AdmittedPerSecond)
	}
}
