package breakerstore_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// TestCallTableSurvivesRestartAndFilters: a run's call table is
// persisted by the group commit, read back at open, filtered and paged; a
// damaged record refuses the file naming the bucket.
func TestCallTableSurvivesRestartAndFilters(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	r := must(s.OpenRun(policy.Run{ID: "nightly", Tenant: "t", Pool: 5, Cutoff: e.clock.Now().Add(time.Hour)})).get(t)
	now := e.clock.Now()
	for _, n := range []struct {
		call string
		note policy.CallNote
	}{
		{"a", policy.CallNote{Target: "x", TriageRef: "doc-a", Attempt: 1, Classification: "transient:503", Time: now}},
		{"a", policy.CallNote{Attempt: 1, Disposition: policy.DispositionDeadLetter, Stop: policy.StopDeadline, Detail: "cut", Time: now}},
		{"b", policy.CallNote{Target: "x", Attempt: 1, Disposition: policy.DispositionSucceeded, Time: now}},
		{"c", policy.CallNote{Target: "y", Attempt: 2, Disposition: policy.DispositionDeadlineCut, Stop: policy.StopDeadline, Time: now}},
	} {
		if err := s.NoteCall(r.ID, n.call, n.note); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.NoteCall("nope", "a", policy.CallNote{Attempt: 1}); !errors.Is(err, breakerstore.ErrNotFound) {
		t.Errorf("NoteCall of an unknown run: %v, want ErrNotFound", err)
	}
	s = e.reopen(s)
	ids := func(f policy.RunCallFilter, after string, limit int) []string {
		t.Helper()
		calls, _, err := s.RunCalls(r.ID, f, after, limit)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range calls {
			out = append(out, c.CallID)
		}
		return out
	}
	cut := policy.RunCallFilter{Dispositions: []policy.Disposition{policy.DispositionDeadLetter, policy.DispositionDeadlineCut}}
	for _, tt := range []struct {
		name  string
		f     policy.RunCallFilter
		after string
		limit int
		want  string
	}{
		{"all", policy.RunCallFilter{}, "", 0, "[a b c]"},
		{"dead letters and cuts", cut, "", 0, "[a c]"},
		{"a page after a", cut, "a", 1, "[c]"},
		{"by stop reason", policy.RunCallFilter{Stops: []policy.StopReason{policy.StopDeadline}}, "", 0, "[a c]"},
	} {
		if got := fmt.Sprint(ids(tt.f, tt.after, tt.limit)); got != tt.want {
			t.Errorf("%s: got %s, want %s", tt.name, got, tt.want)
		}
	}
	calls, _, _ := s.RunCalls(r.ID, policy.RunCallFilter{}, "", 1)
	if a := calls[0]; a.TriageRef != "doc-a" || a.Target != "x" || a.Classification != "transient:503" || a.Detail != "cut" ||
		a.Stop != policy.StopDeadline || !a.First.Equal(now) {
		t.Errorf("a after restart: %+v", a)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	db, err := bbolt.Open(e.opts.Path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("calltable")).Put([]byte("nightly\x00a"), []byte{1, 3})
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := breakerstore.Open(e.opts); !errors.Is(err, breakerstore.ErrCorrupt) || !strings.Contains(fmt.Sprint(err), "bucket calltable") {
		t.Errorf("Open with a damaged call record: %v, want ErrCorrupt naming calltable", err)
	}
}

// TestCallTablePrimaryTarget: a call that ended on a fallback keeps its
// primary target across a restart, and a record of version 1 (written
// before primary targets) still reads, as a call that never left its
// primary.
func TestCallTablePrimaryTarget(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	r := must(s.OpenRun(policy.Run{ID: "nightly", Tenant: "t", Pool: 5, Cutoff: e.clock.Now().Add(time.Hour)})).get(t)
	if err := s.NoteCall(r.ID, "moved", policy.CallNote{Target: "geo-b", PrimaryTarget: "geo-a", Attempt: 2,
		Disposition: policy.DispositionSucceeded, Time: e.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(e.opts.Path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Version 1: disposition SUCCEEDED, no stop, 1 attempt, no times, then
	// target "geo-a", and empty classification, detail and triage reference.
	v1 := append([]byte{1, byte(policy.DispositionSucceeded), 0, 0, 0, 0, 1}, make([]byte, 16)...)
	v1 = append(v1, 5, 'g', 'e', 'o', '-', 'a', 0, 0, 0)
	err = db.Update(func(tx *bbolt.Tx) error { return tx.Bucket([]byte("calltable")).Put([]byte("nightly\x00old"), v1) })
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s = e.open()
	calls, _, err := s.RunCalls(r.ID, policy.RunCallFilter{}, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range calls {
		got = append(got, fmt.Sprintf("%s %s/%s %d", c.CallID, c.Target, c.PrimaryTarget, c.Attempts))
	}
	if want := "[moved geo-b/geo-a 2 old geo-a/ 1]"; fmt.Sprint(got) != want {
		t.Fatalf("calls after restart: got %v, want %s", got, want)
	}
}
