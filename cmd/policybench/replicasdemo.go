package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// discardLogger is the logger of the load's Go clients: their fallback
// warnings are counted, not printed.
var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// demoResult is what the demo scenario reads of policyd-demo --json.
type demoResult struct {
	Policyd         string            `json:"policyd"`
	DurationSeconds float64           `json:"duration_seconds"`
	Ledger          map[string]uint64 `json:"ledger"`
	ClientLedger    map[string]uint64 `json:"client_ledger"`
	LedgerMatches   bool              `json:"ledger_matches_client"`
}

// runDemoBinary runs policyd-demo against addr (one address or several,
// comma-separated) with the admin token, and reads its JSON summary.
func runDemoBinary(ctx context.Context, bin, addr, token string) (*demoResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--addr", addr, "--json")
	cmd.Env = append(os.Environ(), "POLICYD_TOKEN="+token)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	raw, err := cmd.Output()
	var res demoResult
	if jerr := json.Unmarshal(raw, &res); jerr != nil {
		return nil, fmt.Errorf("policyd-demo --addr %s: %v %v\n%s", addr, err, jerr, tail(stderr.String(), 20))
	}
	return &res, nil // a non-zero exit with a summary is a ledger mismatch, judged by the caller
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(len(lines)-n, 0):], "\n")
}

// scenarioDemo runs the demo's batch through the three replicas and then
// through one bbolt daemon, and compares the reconciliations.
func scenarioDemo(ctx context.Context, cfg replicasConfig, fl *replicaFleet, dir string, out io.Writer) error {
	bin := cfg.Demo
	if bin == "" {
		bin = filepath.Join(dir, "policyd-demo")
		if o, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/policyd/policyd/cmd/policyd-demo").CombinedOutput(); err != nil {
			return fmt.Errorf("go build policyd-demo: %v\n%s", err, o)
		}
	}
	fmt.Fprintf(out, "policyd-demo (300 documents, 32 workers) through the three replicas %s\n", fl.addrs())
	three, err := runDemoBinary(ctx, bin, fl.addrs(), fl.token)
	if err != nil {
		return err
	}
	single, err := startDaemon(fl.bin, filepath.Join(dir, "single.db"))
	if err != nil {
		return err
	}
	defer single.stop()
	tok, err := single.token()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "policyd-demo through one bbolt daemon %s\n", single.addr)
	one, err := runDemoBinary(ctx, bin, single.addr, tok)
	if err != nil {
		return err
	}
	keys := []string{"succeeded", "failed_terminal", "dead_letter_exhausted", "dead_letter_budget", "dead_letter_not_idempotent",
		"dead_letter_pushback", "circuit_open", "deadline_cut", "retries_spent"}
	fmt.Fprintf(out, "  %-28s %18s %18s\n", "ledger (GetRun / workers)", "3 replicas", "1 bbolt daemon")
	for _, k := range keys {
		fmt.Fprintf(out, "  %-28s %8d / %-8d %8d / %-8d\n", k, three.Ledger[k], three.ClientLedger[k], one.Ledger[k], one.ClientLedger[k])
	}
	fmt.Fprintf(out, "  ledger matches the workers:  %18v %18v  (%.0fs, %.0fs)\n", three.LedgerMatches, one.LedgerMatches,
		three.DurationSeconds, one.DurationSeconds)
	if !three.LedgerMatches || !one.LedgerMatches {
		return fmt.Errorf("a ledger does not reconcile: 3 replicas %v, one daemon %v", three.LedgerMatches, one.LedgerMatches)
	}
	fmt.Fprintln(out, "verdict: PASS: the batch reconciles exactly through three replicas, as through one daemon")
	return nil
}
