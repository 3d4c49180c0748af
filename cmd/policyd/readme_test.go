package main

import (
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// TestREADMECommandsRunAsWritten runs every `policyd ...` line of the
// README's shell blocks, in order, the way a reader pastes them after the
// quick start: in the directory of a daemon started with the default
// database name. Only --addr is added (the daemon is on a free port, not
// 50051); offline commands that need the daemon stopped run after it
// stops.
func TestREADMECommandsRunAsWritten(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		for _, l := range strings.Split(block[1], "\n") {
			l, _, _ = strings.Cut(l, "#")
			if l = strings.TrimSpace(l); strings.HasPrefix(l, "policyd ") {
				lines = append(lines, l)
			}
		}
	}
	if len(lines) < 10 {
		t.Fatalf("found %d policyd commands in the README, want the admin block and more", len(lines))
	}

	t.Logf("%d commands", len(lines))
	dir := t.TempDir()
	d := startDaemon(t, dir+"/policyd.db")
	d.conn(t)
	offline := map[string]bool{"plan": true, "check": true, "config": true, "version": true}
	var afterStop []string
	for _, l := range lines {
		args := strings.Fields(l)[1:]
		switch {
		case args[0] == "check":
			afterStop = append(afterStop, l)
			continue
		case !offline[args[0]]:
			args = append(args, "--addr", d.addr)
		}
		if out, err := runCLI(t, dir, args...); err != nil {
			t.Errorf("%s: %v\n%s", l, err, out)
		}
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}
	for _, l := range afterStop {
		if out, err := runCLI(t, dir, strings.Fields(l)[1:]...); err != nil {
			t.Errorf("%s: %v\n%s", l, err, out)
		}
	}
}
