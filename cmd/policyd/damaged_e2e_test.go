package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/internal/damage"
)

// TestDamagedFileRefusedByServeAndCheck runs the real `policyd serve` and
// `policyd check` on every kind of damaged file internal/damage makes. Each
// exits non-zero with one line naming the file (no goroutine dump, no
// SIGSEGV or SIGBUS), serve leaves no admin token file behind, and neither
// changes the file. Before the file checks, serve and check on a truncated
// file died with "fatal error: fault" and a goroutine dump, serve on a
// flipped policy value panicked in loadPolicies, and serve on an empty file
// started with defaults.
func TestDamagedFileRefusedByServeAndCheck(t *testing.T) {
	good := filepath.Join(t.TempDir(), "good.db")
	if err := damage.Populate(good, time.Now()); err != nil {
		t.Fatal(err)
	}
	sound, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range damage.Cases() {
		t.Run(c.Name, func(t *testing.T) {
			bad, err := c.Make(sound)
			if err != nil {
				t.Fatal(err)
			}
			db := filepath.Join(t.TempDir(), "policyd.db")
			if err := os.WriteFile(db, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{
				{"serve", "--db", db, "--listen", freeAddr(t)},
				{"check", "--db", db},
			} {
				code, line, took := runRefused(t, args...)
				t.Logf("%-5s exit %d after %v: %s", args[0], code, took.Round(time.Millisecond), strings.ReplaceAll(line, db, "policyd.db"))
				if _, err := os.Stat(db + ".admin-token"); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left an admin token file (stat: %v), want none", args[0], err)
				}
				if !strings.Contains(line, db+": ") || strings.Count(line, db) != 1 {
					t.Errorf("%s said %q, want it to name %s once", args[0], line, db)
				}
			}
			if after, err := os.ReadFile(db); err != nil || !bytes.Equal(after, bad) {
				t.Errorf("the damaged file changed (err %v), want it left as it was", err)
			}
		})
	}
}

// runRefused runs policyd with args, bounded by a context timeout, and
// checks that it failed with exactly one line and no crash. It returns the
// exit code, the line and the time to exit.
func runRefused(t *testing.T, args ...string) (int, string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("%s did not exit within 20s; it said: %s", args[0], out.String())
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() <= 0 {
		t.Fatalf("%s: got %v, want a non-zero exit; it said: %s", args[0], err, out.String())
	}
	text := strings.TrimSpace(out.String())
	for _, crash := range []string{"goroutine", "SIGSEGV", "SIGBUS", "fatal error", "panic"} {
		if strings.Contains(text, crash) {
			t.Errorf("%s crashed (%q in its output): %s", args[0], crash, text)
		}
	}
	if strings.Count(text, "\n") != 0 {
		t.Errorf("%s said %d lines, want one: %s", args[0], strings.Count(text, "\n")+1, text)
	}
	return exit.ExitCode(), text, took
}

// TestFailedStartLeavesNoAdminToken starts `policyd serve` on a fresh
// database in ways that fail after the state file opened (a --listen address
// already taken, a --config file that does not parse): the daemon exits
// non-zero and the admin token file it would have created is not left
// behind. Before the fix the token file stayed.
func TestFailedStartLeavesNoAdminToken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	badConfig := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(badConfig, []byte("tenants: [{tenant: acme, capacity: -1}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"listen address taken", []string{"--listen", taken.Addr().String()}},
		{"bad config file", []string{"--listen", freeAddr(t), "--config", badConfig}},
	} {
		t.Run(c.name, func(t *testing.T) {
			db := filepath.Join(t.TempDir(), "policyd.db")
			code, line, _ := runRefused(t, append([]string{"serve", "--db", db}, c.args...)...)
			if code == 0 {
				t.Fatalf("serve exited 0 (%q), want a refusal", line)
			}
			if _, err := os.Stat(db + ".admin-token"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("serve left an admin token file (stat: %v), want none", err)
			}
		})
	}
}
