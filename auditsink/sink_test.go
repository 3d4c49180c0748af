package auditsink_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/auditsink"
	"github.com/policyd/policyd/policy"
)

// records returns n audit records of every kind, with sequence numbers
// from first on.
func records(first uint64, n int) []policy.AuditRecord {
	t0 := time.Date(2026, 11, 28, 10, 0, 0, 123456789, time.UTC)
	out := make([]policy.AuditRecord, n)
	for i := range out {
		seq := first + uint64(i)
		r := policy.AuditRecord{Time: t0.Add(time.Duration(seq) * time.Millisecond), Seq: seq, Tenant: "acme", Target: "portal",
			CallID: fmt.Sprintf("doc-%d", seq), Attempt: uint32(1 + seq%3)}
		switch seq % 4 {
		case 0:
			r.Event, r.Classification, r.Verdict, r.Delay = policy.AuditDecision, "transient:503", policy.VerdictRetry, 1500*time.Millisecond
		case 1:
			r.Event, r.Classification, r.Verdict, r.Stop, r.Disposition = policy.AuditDecision, "terminal:422", policy.VerdictStop, policy.StopTerminal, policy.DispositionFailedTerminal
		case 2:
			r.Event, r.Delay, r.Detail = policy.AuditOutcome, 80*time.Millisecond, "ok"
		case 3:
			r.Event, r.RunID, r.Disposition, r.Detail = policy.AuditFinal, "night-1", policy.DispositionDeadLetter, `"quoted" <b>&`
		}
		out[i] = r
	}
	return out
}

// readBack parses every line of files, in order.
func readBack(t *testing.T, files []string) []policy.AuditRecord {
	t.Helper()
	var out []policy.AuditRecord
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for l := range bytes.Lines(data) {
			rec, _, err := auditsink.ParseLine(bytes.TrimSuffix(l, []byte("\n")))
			if err != nil {
				t.Fatalf("%s: %v in %q", f, err, l)
			}
			out = append(out, rec)
		}
	}
	return out
}

func equalRecords(a, b []policy.AuditRecord) bool {
	return slices.EqualFunc(a, b, func(x, y policy.AuditRecord) bool {
		if !x.Time.Equal(y.Time) {
			return false
		}
		x.Time = y.Time
		return x == y
	})
}

func TestSinkRoundTripAndRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := auditsink.Open(path, auditsink.Options{MaxBytes: 2000})
	if err != nil {
		t.Fatal(err)
	}
	want := records(1, 40)
	for i := 0; i < len(want); i += 7 {
		if err := s.Append(want[i:min(i+7, len(want))]); err != nil {
			t.Fatalf("Append: %v", err)
		}
	}
	// A retried commit hands records again: they are not written twice.
	if err := s.Append(want[30:]); err != nil {
		t.Fatalf("Append again: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	files, err := auditsink.Files(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 || files[0] != filepath.Join(filepath.Dir(path), "audit-000001.jsonl") {
		t.Fatalf("files: got %v, want at least 3 from audit-000001.jsonl", files)
	}
	for _, f := range files[:len(files)-1] {
		if st, _ := os.Stat(f); st.Size() > 2000 {
			t.Errorf("%s: %d bytes, want at most 2000", f, st.Size())
		}
	}
	if got := readBack(t, files); !equalRecords(got, want) {
		t.Errorf("read back %d records:\n%v\nwant %d:\n%v", len(got), got, len(want), want)
	}
	v, err := auditsink.Verify(files)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	if v.Lines != len(want) || v.Files != len(files) {
		t.Errorf("Verify: got %+v, want %d lines in %d files", v, len(want), len(files))
	}

	// Opened again, the sink continues the chain of its last file.
	s, err = auditsink.Open(path, auditsink.Options{MaxBytes: 2000})
	if err != nil {
		t.Fatal(err)
	}
	more := records(41, 20)
	if err := s.Append(more); err != nil {
		t.Fatal(err)
	}
	s.Close()
	files, _ = auditsink.Files(path)
	v2, err := auditsink.Verify(files)
	if err != nil || v2.Lines != len(want)+len(more) {
		t.Errorf("Verify after reopening: got %+v, %v; want %d lines", v2, err, len(want)+len(more))
	}
	if got := readBack(t, files); !equalRecords(got, append(want, more...)) {
		t.Errorf("read back after reopening: got %d records, want %d", len(got), len(want)+len(more))
	}
}

func TestSinkCutsATornLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit")
	s, err := auditsink.Open(path, auditsink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Append(records(1, 3)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	name := auditsink.FileName(path, 1)
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"prev":"00`) // a crash in the middle of a write
	f.Close()
	if _, err := auditsink.Verify([]string{name}); err == nil || !strings.Contains(err.Error(), name+":4:") {
		t.Errorf("Verify with a torn line: got %v, want a break at %s:4", err, name)
	}
	s, err = auditsink.Open(path, auditsink.Options{})
	if err != nil {
		t.Fatalf("Open with a torn last line: %v", err)
	}
	if err := s.Append(records(4, 2)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if v, err := auditsink.Verify([]string{name}); err != nil || v.Lines != 5 {
		t.Errorf("Verify after the cut: got %+v, %v; want 5 lines", v, err)
	}
}

func TestSinkRefusesADamagedLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit")
	if err := os.WriteFile(auditsink.FileName(path, 1), []byte("not json\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := auditsink.Open(path, auditsink.Options{})
	if err == nil || !strings.Contains(err.Error(), auditsink.FileName(path, 1)) {
		t.Errorf("Open: got %v, want a refusal naming the file", err)
	}
}

func TestVerifyFindsTheFirstBreak(t *testing.T) {
	var c auditsink.Chain
	var lines [][]byte
	for _, r := range records(1, 6) {
		lines = append(lines, c.Line(r))
	}
	edited := bytes.Replace(lines[2], []byte("acme"), []byte("acmf"), 1)
	tests := []struct {
		name  string
		lines [][]byte
		line  int
	}{
		{"edited", [][]byte{lines[0], lines[1], edited, lines[3], lines[4], lines[5]}, 4},
		{"removed", [][]byte{lines[0], lines[1], lines[3], lines[4], lines[5]}, 3},
		{"swapped", [][]byte{lines[0], lines[2], lines[1], lines[3], lines[4], lines[5]}, 2},
		{"first removed", lines[1:], 1},
		{"garbage", [][]byte{lines[0], []byte("{}\n")}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := filepath.Join(t.TempDir(), "copy-000001.jsonl")
			if err := os.WriteFile(name, bytes.Join(tt.lines, nil), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := auditsink.Verify([]string{name})
			var b *auditsink.Break
			if !errors.As(err, &b) || b.File != name || b.Line != tt.line {
				t.Errorf("Verify: got %v, want a break at %s:%d", err, name, tt.line)
			}
		})
	}
	// The same lines split over two files chain across them.
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, bytes.Join(lines[:3], nil), 0o600)
	os.WriteFile(b, bytes.Join(lines[3:], nil), 0o600)
	if v, err := auditsink.Verify([]string{a, b}); err != nil || v.Lines != 6 || v.Head != c.Head() {
		t.Errorf("Verify over two files: got %+v, %v; want 6 lines, head %s", v, err, c.Head())
	}
	if _, err := auditsink.Verify([]string{b, a}); err == nil || !strings.Contains(err.Error(), b+":1:") {
		t.Errorf("Verify of files out of order: got %v, want a break at %s:1", err, b)
	}
}

func TestSinkContinuesAfterLongLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit")
	s, err := auditsink.Open(path, auditsink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	recs := records(1, 4)
	recs[2].Detail = strings.Repeat("x", 200<<10) // longer than the tail Open reads first
	recs[3].Detail = strings.Repeat("y", 150<<10)
	if err := s.Append(recs); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = auditsink.Open(path, auditsink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Append(records(5, 1)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if v, err := auditsink.Verify([]string{auditsink.FileName(path, 1)}); err != nil || v.Lines != 5 {
		t.Errorf("Verify: got %+v, %v; want 5 lines", v, err)
	}
}

func TestSinkHeldByAnotherWriterIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	s, err := auditsink.Open(path, auditsink.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auditsink.Open(path, auditsink.Options{}); err == nil || !strings.Contains(err.Error(), "held by another process") {
		t.Errorf("second Open: got %v, want a refusal", err)
	}
	s.Close()
	s, err = auditsink.Open(path, auditsink.Options{})
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	s.Close()
}
