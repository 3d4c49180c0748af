package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/policyd/policyd/auditsink"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// sinkLines reads a sink's files as the lines of each.
func sinkLines(t *testing.T, files []string) [][][]byte {
	t.Helper()
	out := make([][][]byte, len(files))
	for i, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = slices.Collect(bytes.Lines(data))
	}
	return out
}

// callAttempts renders records as call#attempt:event, to compare a sink
// with an export.
func callAttempts(t *testing.T, lines [][]byte) []string {
	t.Helper()
	var out []string
	for _, l := range lines {
		rec, _, err := auditsink.ParseLine(bytes.TrimSuffix(l, []byte("\n")))
		if err != nil {
			t.Fatalf("%v in %q", err, l)
		}
		out = append(out, fmt.Sprintf("%s#%d:%s", rec.CallID, rec.Attempt, rec.Event))
	}
	return out
}

func TestAuditSinkVerifyAndExport(t *testing.T) {
	dir := t.TempDir()
	sinkPath := filepath.Join(dir, "sink", "audit.jsonl")
	if err := os.Mkdir(filepath.Dir(sinkPath), 0o700); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, filepath.Join(dir, "policyd.db"), "--audit-sink", "file:"+sinkPath, "--audit-sink-max-bytes", "4096")
	workers := pb.NewRetryPolicyServiceClient(d.conn(t))
	ctx := context.Background()
	for i := range 20 {
		for attempt := uint32(1); attempt <= 2; attempt++ {
			_, err := workers.NextDelay(ctx, &pb.NextDelayRequest{
				// A target per call: two failures each keep its breaker closed.
				Call: &pb.CallRef{Tenant: []string{"acme", "beta"}[i%2], Target: fmt.Sprintf("geo-%d", i),
					CallId: fmt.Sprintf("doc-%d", i), Idempotent: true},
				Attempt: attempt, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}},
			})
			if err != nil {
				t.Fatalf("NextDelay: %v", err)
			}
		}
	}
	export := filepath.Join(dir, "export.jsonl")
	if out, err := runCLI(t, dir, "audit", "export", "--since", "1h", "--output", export, "--addr", d.addr); err != nil {
		t.Fatalf("audit export: %v\n%s", err, out)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("daemon exit: %v\n%s", err, d.stderr)
	}

	files, err := auditsink.Files(sinkPath)
	if err != nil || len(files) < 3 || filepath.Base(files[0]) != "audit-000001.jsonl" {
		t.Fatalf("sink files: got %v, %v; want at least 3 from audit-000001.jsonl (4096 bytes each)", files, err)
	}
	lines := sinkLines(t, files)
	all := slices.Concat(lines...)
	if len(all) != 40 {
		t.Fatalf("sink has %d lines, want 40 (one per decision)", len(all))
	}
	exported := sinkLines(t, []string{export})[0]
	if got, want := callAttempts(t, exported), callAttempts(t, all); !slices.Equal(got, want) {
		t.Errorf("export has %v, want the sink's %v", got, want)
	}

	for _, args := range [][]string{{sinkPath}, files, {export}} {
		out, err := exec.Command(binary, append([]string{"audit", "verify"}, args...)...).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "ok: ") {
			t.Errorf("audit verify %v: got %v\n%s, want ok", args, err, out)
		}
	}

	// Tampered copies: each reports the first break by file and line, exit 1.
	swap := func(ls [][]byte, i, j int) [][]byte {
		ls = slices.Clone(ls)
		ls[i], ls[j] = ls[j], ls[i]
		return ls
	}
	tests := []struct {
		name   string
		file   int                     // the file changed
		change func([][]byte) [][]byte // its lines
		line   int                     // the break reported in it
	}{
		{"one line edited", 0, func(ls [][]byte) [][]byte {
			ls = slices.Clone(ls)
			ls[2] = bytes.Replace(ls[2], []byte(`"attempt":1`), []byte(`"attempt":2`), 1)
			return ls
		}, 4},
		{"one line removed", 1, func(ls [][]byte) [][]byte { return slices.Delete(slices.Clone(ls), 1, 2) }, 2},
		{"two lines swapped", 0, func(ls [][]byte) [][]byte { return swap(ls, 1, 2) }, 2},
		{"first line of a later file removed", 2, func(ls [][]byte) [][]byte { return ls[1:] }, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			copyDir := t.TempDir()
			var changed string
			for i, f := range files {
				ls := lines[i]
				name := filepath.Join(copyDir, filepath.Base(f))
				if i == tt.file {
					ls, changed = tt.change(ls), name
				}
				if err := os.WriteFile(name, bytes.Join(ls, nil), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(binary, "audit", "verify", filepath.Join(copyDir, "audit.jsonl"))
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
				t.Fatalf("audit verify of a copy with %s: got %v, want exit 1", tt.name, err)
			}
			if want := fmt.Sprintf("%s:%d: ", changed, tt.line); !strings.Contains(stderr.String(), want) {
				t.Errorf("audit verify: got %q, want it to name %s", stderr.String(), want)
			}
		})
	}
}

func TestAuditSinkFlagsAreChecked(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--audit-sink", "s3://bucket/audit"}, "--audit-sink: must be file:PATH"},
		{[]string{"--audit-sink", "file:" + filepath.Join(dir, "audit"), "--audit-sink-max-bytes", "0"}, "--audit-sink-max-bytes: must be > 0"},
		{[]string{"--audit-sink", "file:" + filepath.Join(dir, "missing", "audit")}, "--audit-sink: auditsink:"},
	} {
		out, err := exec.Command(binary, append([]string{"serve", "--listen", "127.0.0.1:0", "--db", filepath.Join(dir, "policyd.db")}, tt.args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tt.want) {
			t.Errorf("serve %v: got %v\n%s, want a refusal naming %q", tt.args, err, out, tt.want)
		}
	}
}
