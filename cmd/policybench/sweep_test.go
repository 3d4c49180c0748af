package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/server"
)

// TestMain lets the test binary stand in for policybench when the sweep
// re-executes itself as the echo server.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "echo-server" {
		if err := runEchoServer(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSweepSmoke runs every phase once, at one caller for 200ms, against
// an in-process policyd on loopback, and checks the output is well formed.
// It asserts nothing about speed.
func TestSweepSmoke(t *testing.T) {
	dir := t.TempDir()
	// A group commit every 10ms: a report waits for one (100ms by
	// default), and at one caller for 200ms on a busy machine the report
	// phase could end before one had.
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(dir, "policyd.db"), FlushInterval: 10 * time.Millisecond})
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
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("anything\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := sweepConfig{Addr: lis.Addr().String(), TokenFile: tokenFile, Concurrency: []int{1},
		Duration: 200 * time.Millisecond, Phases: allPhases, Seed: 1, ReportBatch: defaultReportBatch}

	var js bytes.Buffer
	cfg.JSON = true
	if err := runSweep(context.Background(), cfg, &js, io.Discard); err != nil {
		t.Fatal(err)
	}
	var rep sweepReport
	if err := json.Unmarshal(js.Bytes(), &rep); err != nil {
		t.Fatalf("JSON output does not parse: %v\n%s", err, js.String())
	}
	seen := map[string]bool{}
	for _, r := range rep.Rows {
		seen[r.Phase+"/"+r.RPC] = true
		if r.Requests == 0 || r.Errors != 0 {
			t.Errorf("phase %s rpc %s: got %d requests and %d errors (%s), want some and none", r.Phase, r.RPC, r.Requests, r.Errors, r.FirstError)
		}
		if !strings.HasPrefix(r.Phase, "echo") && r.VsEcho == nil {
			t.Errorf("phase %s rpc %s: no ratio to the echo", r.Phase, r.RPC)
		}
	}
	for _, want := range []string{"echo-unary/echo-unary", "echo-stream/echo-stream", "admit/Admit", "nextdelay/NextDelay",
		"report/ReportOutcome", "mix/Admit", "mix/NextDelay",
		"admit-ceiling/Admit", "admit-ceiling/ReleaseLease", "admit-ceiling-report/Admit", "admit-ceiling-report/ReportOutcome",
		"admit-ceiling-batch/Admit", "admit-ceiling-batch/ReportOutcome"} {
		if !seen[want] {
			t.Errorf("no row %s; got %v", want, seen)
		}
	}
	if len(rep.Durability) != 1 || rep.Durability[0].OutcomesAcceptedPerSec == 0 {
		t.Errorf("durability: got %+v, want one level with outcomes accepted", rep.Durability)
	}

	var table bytes.Buffer
	cfg.JSON, cfg.Phases = false, []string{"echo-unary", "admit"}
	if err := runSweep(context.Background(), cfg, &table, io.Discard); err != nil {
		t.Fatal(err)
	}
	var header []string
	rows := 0
	for _, line := range strings.Split(table.String(), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && f[0] == "callers":
			header = f
		case header != nil && len(f) == 13 && f[0] == "1":
			rows++
		}
	}
	if header == nil || rows != 2 {
		t.Errorf("table: got header %v and %d rows of 13 columns, want 2:\n%s", header, rows, table.String())
	}
}
