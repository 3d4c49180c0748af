package breakerstore_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/policyd/policyd/auditsink"
	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// flakySink is a real file sink that refuses records while failing is set,
// as a full or gone disk would.
type flakySink struct {
	*auditsink.Sink
	failing atomic.Bool
}

func (f *flakySink) Append(recs []policy.AuditRecord) error {
	if f.failing.Load() {
		return errors.New("disk gone")
	}
	return f.Sink.Append(recs)
}

func newFlakySink(t *testing.T) (*flakySink, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "audit")
	s, err := auditsink.Open(path, auditsink.Options{MaxBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &flakySink{Sink: s}, path
}

// sunk returns the records in the sink at path, checking its chain.
func sunk(t *testing.T, path string) []policy.AuditRecord {
	t.Helper()
	files, err := auditsink.Files(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auditsink.Verify(files); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	var out []policy.AuditRecord
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for l := range bytes.Lines(data) {
			rec, _, err := auditsink.ParseLine(bytes.TrimSuffix(l, []byte("\n")))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, rec)
		}
	}
	return out
}

func seqs(recs []policy.AuditRecord) []uint64 {
	out := make([]uint64, len(recs))
	for i, r := range recs {
		out[i] = r.Seq
	}
	return out
}

func TestAuditSinkGetsEveryCommittedRecord(t *testing.T) {
	for _, mode := range []breakerstore.SyncMode{breakerstore.SyncGroup, breakerstore.SyncAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			sink, path := newFlakySink(t)
			e := newEnv(t, func(o *breakerstore.Options) { o.Sync, o.AuditSink = mode, sink })
			s := e.open()
			appendN(e, s, "acme", "c", 30)
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			appendN(e, s, "beta", "d", 30)
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			disk := onDisk(t, s)
			got := sunk(t, path)
			if len(disk) != 60 || !slices.Equal(seqs(got), seqs(disk)) {
				t.Fatalf("sink has seqs %v, want those on disk %v", seqs(got), seqs(disk))
			}
			for i := range got {
				if !got[i].Time.Equal(disk[i].Time) || got[i].CallID != disk[i].CallID || got[i].Detail != disk[i].Detail || got[i].Delay != disk[i].Delay {
					t.Fatalf("sink record %d = %+v, want %+v", i, got[i], disk[i])
				}
			}
			if files, _ := auditsink.Files(path); len(files) < 2 {
				t.Errorf("sink files: got %v, want a rotation at 4096 bytes", files)
			}
		})
	}
}

func TestAuditSinkFailureRefusesTheCommit(t *testing.T) {
	for _, mode := range []breakerstore.SyncMode{breakerstore.SyncGroup, breakerstore.SyncAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			sink, path := newFlakySink(t)
			e := newEnv(t, func(o *breakerstore.Options) { o.Sync, o.AuditSink = mode, sink })
			s := e.open()
			appendN(e, s, "acme", "c", 2)
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			sink.failing.Store(true)
			appendN(e, s, "acme", "c", 5)
			err := s.Flush()
			if !errors.Is(err, breakerstore.ErrAuditSink) {
				t.Fatalf("Flush with the sink failing: got %v, want ErrAuditSink", err)
			}
			st := s.Stats()
			if st.AuditSinkErrors == 0 || st.AuditBuffered != 5 || st.AuditRecords != 2 {
				t.Errorf("stats with the sink failing: got sink errors %d, buffered %d, on disk %d; want > 0, 5, 2",
					st.AuditSinkErrors, st.AuditBuffered, st.AuditRecords)
			}
			if got := len(sunk(t, path)); got != 2 {
				t.Errorf("sink has %d records while failing, want 2", got)
			}
			sink.failing.Store(false)
			if err := s.Flush(); err != nil {
				t.Fatalf("Flush once the sink is back: %v", err)
			}
			got, disk := sunk(t, path), onDisk(t, s)
			if len(disk) != 7 || !slices.Equal(seqs(got), seqs(disk)) {
				t.Errorf("after recovery the sink has seqs %v, want those on disk %v", seqs(got), seqs(disk))
			}
		})
	}
}
