package breakerstore_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/internal/damage"
)

// goodFile writes a populated state file and returns its bytes.
func goodFile(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "good.db")
	if err := damage.Populate(path, newFakeClock().Now()); err != nil {
		t.Fatal(err)
	}
	if err := breakerstore.Check(path, time.Second); err != nil {
		t.Fatalf("Check of the sound file: got %v, want nil", err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return good
}

// TestDamagedFilesAreRefused opens and checks every kind of damage
// internal/damage makes to a real state file. Open and Check both refuse
// with ErrCorrupt, on one line that names the file and says what is wrong,
// and leave the file as it was. Before the checks of filecheck.go, the
// truncated files faulted inside bbolt (SIGBUS, the test binary died), the
// flipped policy value panicked in loadPolicies and the empty file was
// initialised and served.
func TestDamagedFilesAreRefused(t *testing.T) {
	good := goodFile(t)
	want := map[string]string{
		"truncated to 20000 bytes":           "truncated: meta says",
		"truncated to three pages":           "truncated: meta says",
		"truncated to half":                  "truncated: meta says",
		"truncated by one page":              "truncated: meta says",
		"truncated by one byte":              "truncated: meta says",
		"zero-filled tail":                   "is zeroed",
		"flipped bytes in meta page 0":       "meta page 0: checksum",
		"flipped bytes in meta page 1":       "meta page 1: checksum",
		"flipped bytes in a branch page":     "page",
		"flipped bytes in a leaf page":       "page",
		"flipped bytes in the freelist page": "freelist",
		"flipped bytes in a policy value":    "bucket policies",
		"foreign file":                       "not a bbolt database",
		"empty file":                         "empty file (0 bytes)",
	}
	for _, c := range damage.Cases() {
		t.Run(c.Name, func(t *testing.T) {
			bad, err := c.Make(good)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "policyd.db")
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := breakerstore.Open(breakerstore.Options{Path: path, LockTimeout: 100 * time.Millisecond})
			if err == nil {
				s.Close()
				t.Fatal("Open: got nil error, want a refusal")
			}
			assertRefusal(t, "Open", err, path, want[c.Name])
			cerr := breakerstore.Check(path, 100*time.Millisecond)
			assertRefusal(t, "Check", cerr, path, want[c.Name])
			t.Logf("Open: %v", err)
			t.Logf("Check: %v", cerr)
			if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, bad) {
				t.Errorf("the damaged file changed (%d bytes, was %d; err %v), want it left as it was", len(after), len(bad), err)
			}
		})
	}
}

func assertRefusal(t *testing.T, op string, err error, path, says string) {
	t.Helper()
	switch {
	case !errors.Is(err, breakerstore.ErrCorrupt):
		t.Errorf("%s: got %v, want breakerstore.ErrCorrupt", op, err)
	case !strings.Contains(err.Error(), path+": "):
		t.Errorf("%s: got %q, want it to name %s", op, err, path)
	case strings.Contains(err.Error(), "\n"):
		t.Errorf("%s: got %q, want one line", op, err)
	case !strings.Contains(err.Error(), says):
		t.Errorf("%s: got %q, want it to say %q", op, err, says)
	}
}

// TestCheckReportsEveryProblem damages a file in two places: Check names
// both, where Open may stop at the first.
func TestCheckReportsEveryProblem(t *testing.T) {
	good := goodFile(t)
	var bad []byte
	for _, c := range damage.Cases() {
		if c.Name == "flipped bytes in meta page 1" || c.Name == "flipped bytes in a leaf page" && bad != nil {
			src := good
			if bad != nil {
				src = bad
			}
			var err error
			if bad, err = c.Make(src); err != nil {
				t.Fatal(err)
			}
		}
	}
	path := filepath.Join(t.TempDir(), "policyd.db")
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	err := breakerstore.Check(path, time.Second)
	if err == nil || !strings.Contains(err.Error(), "meta page 1: checksum") || strings.Count(err.Error(), "; ") < 1 {
		t.Fatalf("Check: got %v, want the bad meta page 1 and the leaf page's problem", err)
	}
}

// TestOpenCreatesOnlyAMissingFile: a missing path is created and checks
// sound; Open does not fall back to defaults for an existing file.
func TestOpenCreatesOnlyAMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policyd.db")
	s, err := breakerstore.Open(breakerstore.Options{Path: path})
	if err != nil {
		t.Fatalf("Open of a missing path: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := breakerstore.Check(path, time.Second); err != nil {
		t.Errorf("Check of the new file: got %v, want nil", err)
	}
	missing := filepath.Join(t.TempDir(), "absent.db")
	if err := breakerstore.Check(missing, time.Second); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Check of a missing path: got %v, want an error naming it", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Check created %s (stat: %v), want it left absent", missing, err)
	}
}

// TestCheckReportsABadRecordInEveryBucket puts an undecodable record in two
// buckets: Check names both, where Open stops at the first.
func TestCheckReportsABadRecordInEveryBucket(t *testing.T) {
	e := newEnv(t)
	if err := e.open().Close(); err != nil {
		t.Fatal(err)
	}
	writeBolt(t, e.opts.Path, func(tx *bbolt.Tx) error {
		if err := tx.Bucket([]byte("breakers")).Put([]byte("t\x00x"), []byte{1, 2, 3}); err != nil {
			return err
		}
		return tx.Bucket([]byte("policies")).Put([]byte("t\x00x"), []byte("{not json"))
	})
	err := breakerstore.Check(e.opts.Path, time.Second)
	if !errors.Is(err, breakerstore.ErrCorrupt) || !strings.Contains(err.Error(), "bucket breakers") ||
		!strings.Contains(err.Error(), "bucket policies") || strings.Count(err.Error(), e.opts.Path) != 1 {
		t.Errorf("Check: got %v, want ErrCorrupt naming the file once and both bucket breakers and bucket policies", err)
	}
	t.Logf("Check: %v", err)
}

// TestCheckAcceptsABboltFileWithoutBuckets: a bbolt file with no bucket yet
// (a first start cut short) is one Open initialises, and Check passes it.
func TestCheckAcceptsABboltFileWithoutBuckets(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policyd.db")
	writeBolt(t, path, func(*bbolt.Tx) error { return nil })
	if err := breakerstore.Check(path, time.Second); err != nil {
		t.Errorf("Check: got %v, want nil", err)
	}
	s, err := breakerstore.Open(breakerstore.Options{Path: path})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := breakerstore.Check(path, time.Second); err != nil {
		t.Errorf("Check after Open: got %v, want nil", err)
	}
}
