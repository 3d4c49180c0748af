package breakerstore_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// appendN appends n DECISION records of tenant and callID, attempts 1..n,
// moving the clock a second after each.
func appendN(e *env, s *breakerstore.Store, tenant, callID string, n int) {
	for i := range n {
		s.AppendAudit(policy.AuditRecord{
			Event: policy.AuditDecision, Tenant: tenant, Target: "geo", CallID: callID,
			Attempt: uint32(i + 1), Classification: "transient:503", Verdict: policy.VerdictRetry,
			Delay: time.Duration(i+1) * time.Second, Detail: fmt.Sprint("attempt ", i+1),
		})
		e.clock.Advance(time.Second)
	}
}

// query runs q and fails the test on an error.
func query(t *testing.T, s *breakerstore.Store, q policy.AuditQuery) ([]policy.AuditRecord, policy.AuditCursor) {
	t.Helper()
	recs, next, err := s.QueryAudit(q)
	if err != nil {
		t.Fatalf("QueryAudit(%+v) = %v, want nil", q, err)
	}
	return recs, next
}

// attempts returns the attempt numbers of recs.
func attempts(recs []policy.AuditRecord) []uint32 {
	out := make([]uint32, len(recs))
	for i, r := range recs {
		out[i] = r.Attempt
	}
	return out
}

// onDisk returns the audit records on disk, decoded from the segments.
func onDisk(t *testing.T, s *breakerstore.Store) []policy.AuditRecord {
	t.Helper()
	recs, _, err := s.AuditOnDisk()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func TestAuditByCallIDInOrder(t *testing.T) {
	for _, sync := range []breakerstore.SyncMode{breakerstore.SyncGroup, breakerstore.SyncAlways} {
		t.Run(sync.String(), func(t *testing.T) {
			e := newEnv(t, func(o *breakerstore.Options) { o.Sync = sync })
			s := e.open()
			appendN(e, s, "acme", "call-1", 2)
			appendN(e, s, "acme", "call-2", 1)
			appendN(e, s, "other", "call-1", 1) // the same call id in another tenant
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			appendN(e, s, "acme", "call-1", 1) // still buffered in group mode

			tests := []struct {
				name string
				q    policy.AuditQuery
				want string
			}{
				{"call id", policy.AuditQuery{CallID: "call-1"}, "[1 2 1 1]"},
				{"call id and tenant", policy.AuditQuery{CallID: "call-1", Tenant: "acme"}, "[1 2 1]"},
				{"other call", policy.AuditQuery{CallID: "call-2"}, "[1]"},
				{"unknown call", policy.AuditQuery{CallID: "nope"}, "[]"},
				{"call-1 prefix does not match call-10", policy.AuditQuery{CallID: "call"}, "[]"},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					recs, next := query(t, s, tt.q)
					if got := fmt.Sprint(attempts(recs)); got != tt.want {
						t.Errorf("attempts: got %s, want %s", got, tt.want)
					}
					if !next.IsZero() {
						t.Errorf("next cursor: got %+v, want zero", next)
					}
					for i := 1; i < len(recs); i++ {
						if !recs[i-1].Time.Before(recs[i].Time) || recs[i-1].Seq >= recs[i].Seq {
							t.Errorf("records %d and %d out of order: %v/%d then %v/%d", i-1, i,
								recs[i-1].Time, recs[i-1].Seq, recs[i].Time, recs[i].Seq)
						}
					}
				})
			}
		})
	}
}

func TestAuditRecordRoundTrip(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	want := policy.AuditRecord{
		Event: policy.AuditDecision, Tenant: "acme", Target: "geo", CallID: "c", RunID: "r",
		Attempt: 3, Classification: "transient:429", Verdict: policy.VerdictStop,
		Stop: policy.StopAttemptsExhausted, Disposition: policy.DispositionDeadLetter,
		Delay: 1500 * time.Millisecond, Detail: "max attempts (3) reached",
	}
	s.AppendAudit(want)
	s = e.reopen(s)
	recs, _ := query(t, s, policy.AuditQuery{CallID: "c"})
	if len(recs) != 1 {
		t.Fatalf("records after reopen: got %d, want 1", len(recs))
	}
	got := recs[0]
	want.Time, want.Seq = e.clock.Now(), got.Seq
	if !got.Time.Equal(want.Time) || got.Seq == 0 {
		t.Errorf("stamp: got %v seq %d, want %v and a sequence number", got.Time, got.Seq, want.Time)
	}
	got.Time = want.Time
	if got != want {
		t.Errorf("record:\n got %+v\nwant %+v", got, want)
	}
}

func TestAuditByTenantAndTimeRangePages(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	start := e.clock.Now()
	appendN(e, s, "acme", "a", 10) // seconds 0..9
	appendN(e, s, "beta", "b", 3)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	appendN(e, s, "acme", "c", 2) // buffered, seconds 13..14

	tests := []struct {
		name  string
		q     policy.AuditQuery
		pages []string
	}{
		{"all of acme, pages of 4", policy.AuditQuery{Tenant: "acme", Limit: 4},
			[]string{"[a1 a2 a3 a4]", "[a5 a6 a7 a8]", "[a9 a10 c1 c2]"}},
		{"seconds 2 to 7", policy.AuditQuery{Tenant: "acme", Start: start.Add(2 * time.Second), End: start.Add(7 * time.Second), Limit: 3},
			[]string{"[a3 a4 a5]", "[a6 a7]"}},
		{"from second 8, buffered included", policy.AuditQuery{Tenant: "acme", Start: start.Add(8 * time.Second)},
			[]string{"[a9 a10 c1 c2]"}},
		{"beta", policy.AuditQuery{Tenant: "beta"}, []string{"[b1 b2 b3]"}},
		{"every tenant by time", policy.AuditQuery{Start: start.Add(9 * time.Second), Limit: 5},
			[]string{"[a10 b1 b2 b3 c1]", "[c2]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := tt.q
			var got []string
			for range 10 {
				recs, next := query(t, s, q)
				var page []string
				for _, r := range recs {
					page = append(page, fmt.Sprint(r.CallID, r.Attempt))
				}
				got = append(got, fmt.Sprintf("%v", page))
				if next.IsZero() {
					break
				}
				q.After = next
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.pages) {
				t.Errorf("pages: got %v, want %v", got, tt.pages)
			}
		})
	}
}

func TestAuditQuerySeesAppendAtOnce(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	s.AppendAudit(policy.AuditRecord{Event: policy.AuditFinal, Tenant: "acme", CallID: "c", Disposition: policy.DispositionSucceeded})
	recs, _ := query(t, s, policy.AuditQuery{CallID: "c"})
	if len(recs) != 1 || recs[0].Disposition != policy.DispositionSucceeded {
		t.Fatalf("right after append: got %+v, want the FINAL record", recs)
	}
	if st := s.Stats(); st.AuditBuffered != 1 || st.AuditRecords != 0 {
		t.Errorf("stats before a flush: got buffered %d, on disk %d; want 1, 0", st.AuditBuffered, st.AuditRecords)
	}
}

func TestAuditRetentionByAge(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.AuditRetention = time.Hour })
	s := e.open()
	appendN(e, s, "acme", "old", 3)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour)
	appendN(e, s, "acme", "new", 2)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	recs, _ := query(t, s, policy.AuditQuery{Tenant: "acme"})
	var got []string
	for _, r := range recs {
		got = append(got, fmt.Sprint(r.CallID, r.Attempt))
	}
	if fmt.Sprint(got) != "[new1 new2]" {
		t.Errorf("after the sweep: got %v, want [new1 new2]", got)
	}
	if n := len(onDisk(t, s)); n != 2 {
		t.Errorf("records on disk: got %d, want 2", n)
	}
	if st := s.Stats(); st.AuditDeleted != 3 || st.AuditRecords != 2 {
		t.Errorf("stats: got deleted %d, on disk %d; want 3, 2", st.AuditDeleted, st.AuditRecords)
	}
}

func TestAuditRetentionBySize(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.AuditMaxRecords = 5 })
	s := e.open()
	appendN(e, s, "acme", "c", 8)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	recs, _ := query(t, s, policy.AuditQuery{CallID: "c"})
	if got := fmt.Sprint(attempts(recs)); got != "[4 5 6 7 8]" {
		t.Errorf("after the sweep: got %s, want [4 5 6 7 8]", got)
	}
	// The count survives a restart, so the cap keeps holding.
	s = e.reopen(s)
	appendN(e, s, "acme", "c", 2)
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	recs, _ = query(t, s, policy.AuditQuery{Tenant: "acme"})
	if got := fmt.Sprint(attempts(recs)); got != "[6 7 8 1 2]" {
		t.Errorf("after a restart: got %s, want [6 7 8 1 2]", got)
	}
	if n := len(onDisk(t, s)); n != 5 {
		t.Errorf("records on disk: got %d, want 5", n)
	}
}

func TestAuditSurvivesReopenAndKeepsOrder(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	appendN(e, s, "acme", "c", 2)
	s = e.reopen(s) // Close flushes the buffer
	// The clock stands still across the restart: new records still sort
	// after the old ones and never overwrite them.
	s.AppendAudit(policy.AuditRecord{Event: policy.AuditFinal, Tenant: "acme", CallID: "c", Attempt: 3})
	s = e.reopen(s)
	recs, _ := query(t, s, policy.AuditQuery{CallID: "c"})
	if got := fmt.Sprint(attempts(recs)); got != "[1 2 3]" {
		t.Errorf("after two restarts: got %s, want [1 2 3]", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := breakerstore.Check(e.opts.Path, time.Second); err != nil {
		t.Errorf("Check: got %v, want nil", err)
	}
}

func TestAuditCrashLosesOnlyUnflushed(t *testing.T) {
	tests := []struct {
		name string
		sync breakerstore.SyncMode
		want string
	}{
		{"group commit loses the buffer", breakerstore.SyncGroup, "[1]"},
		{"sync always loses nothing", breakerstore.SyncAlways, "[1 2 3]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, func(o *breakerstore.Options) { o.Sync = tt.sync })
			s := e.open()
			appendN(e, s, "acme", "c", 1)
			if err := s.Flush(); err != nil {
				t.Fatal(err)
			}
			s.AppendAudit(policy.AuditRecord{Tenant: "acme", CallID: "c", Attempt: 2},
				policy.AuditRecord{Tenant: "acme", CallID: "c", Attempt: 3})
			s = e.crashAndReopen(s)
			recs, _ := query(t, s, policy.AuditQuery{CallID: "c"})
			if got := fmt.Sprint(attempts(recs)); got != tt.want {
				t.Errorf("after a crash: got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestAuditFullBufferDropsWithoutBlocking(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.AuditBuffer = 3 })
	s := e.open()
	appendN(e, s, "acme", "c", 5)
	s.AppendAudit(policy.AuditRecord{Tenant: "bad\x00tenant", CallID: "c"})
	if st := s.Stats(); st.AuditDropped != 3 || st.AuditBuffered != 3 {
		t.Errorf("stats: got dropped %d, buffered %d; want 3, 3", st.AuditDropped, st.AuditBuffered)
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	recs, _ := query(t, s, policy.AuditQuery{CallID: "c"})
	if got := fmt.Sprint(attempts(recs)); got != "[1 2 3]" {
		t.Errorf("kept: got %s, want [1 2 3]", got)
	}
}

func TestAuditQueryRejectsBadNames(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	tests := []struct {
		name string
		q    policy.AuditQuery
	}{
		{"NUL in call id", policy.AuditQuery{CallID: "a\x00b"}},
		{"NUL in tenant", policy.AuditQuery{Tenant: "a\x00b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := s.QueryAudit(tt.q)
			wantErr(t, "QueryAudit", err, breakerstore.ErrInvalid)
		})
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, _, err := s.QueryAudit(policy.AuditQuery{CallID: "c"})
	wantErr(t, "QueryAudit after Close", err, breakerstore.ErrClosed)
}

// flush flushes s and fails the test on an error.
func flush(t *testing.T, s *breakerstore.Store) {
	t.Helper()
	if err := s.Flush(); err != nil {
		t.Fatalf("Flush() = %v, want nil", err)
	}
}

// queryAll pages through every record q selects, pages of limit.
func queryAll(t *testing.T, s *breakerstore.Store, q policy.AuditQuery) []policy.AuditRecord {
	t.Helper()
	var out []policy.AuditRecord
	for range 1000 {
		recs, next := query(t, s, q)
		out = append(out, recs...)
		if next.IsZero() {
			return out
		}
		q.After = next
	}
	t.Fatalf("QueryAudit(%+v): more than 1000 pages", q)
	return nil
}

// span returns the attempts from..to.
func span(from, to int) []uint32 {
	var out []uint32
	for a := from; a <= to; a++ {
		out = append(out, uint32(a))
	}
	return out
}

// check closes s and runs Check on its file, which must pass.
func check(t *testing.T, e *env, s *breakerstore.Store) {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := breakerstore.Check(e.opts.Path, time.Second); err != nil {
		t.Errorf("Check: got %v, want nil", err)
	}
}

func TestAuditSegmentsSplitAtSegMax(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	n := 3*breakerstore.SegMax + 7
	appendN(e, s, "acme", "c", n)
	flush(t, s)
	want := fmt.Sprint(span(1, n))
	start := e.clock.Now().Add(-time.Duration(n) * time.Second)
	verify := func(s *breakerstore.Store, when string) {
		t.Helper()
		window := policy.AuditQuery{Start: start.Add(500 * time.Second), End: start.Add(530 * time.Second), Limit: 7}
		if got, want := fmt.Sprint(attempts(queryAll(t, s, window))), fmt.Sprint(span(501, 530)); got != want {
			t.Errorf("%s, seconds 500 to 530 in pages of 7: got %s, want %s", when, got, want)
		}
		recs, next := query(t, s, policy.AuditQuery{CallID: "c", Limit: breakerstore.MaxAuditPage})
		if got := fmt.Sprint(attempts(recs)); got != want || !next.IsZero() {
			t.Errorf("%s: got %d records (next %+v), want attempts 1..%d in order", when, len(recs), next, n)
		}
		if got := fmt.Sprint(attempts(queryAll(t, s, policy.AuditQuery{Tenant: "acme", Limit: 100}))); got != want {
			t.Errorf("%s, pages of 100: got %s, want attempts 1..%d in order", when, got, n)
		}
		disk, segments, err := s.AuditOnDisk()
		if err != nil || len(disk) != n || segments != 4 {
			t.Errorf("%s: on disk %d records in %d segments (%v), want %d in 4", when, len(disk), segments, err, n)
		}
		if st := s.Stats(); st.AuditRecords != n {
			t.Errorf("%s: Stats.AuditRecords = %d, want %d", when, st.AuditRecords, n)
		}
	}
	verify(s, "after the flush")
	s = e.reopen(s)
	verify(s, "after a restart")
	check(t, e, s)
}

func TestAuditRetentionByAgeIsExactInsideASegment(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.AuditRetention = time.Hour })
	s := e.open()
	n := breakerstore.SegMax + 20
	appendN(e, s, "acme", "c", n) // attempt a at second a-1
	flush(t, s)
	// The clock is at second n: put the cutoff at second SegMax+5, so the
	// first segment goes whole and the second loses its first 5 records.
	e.clock.Advance(time.Hour - 15*time.Second)
	flush(t, s)
	recs := queryAll(t, s, policy.AuditQuery{CallID: "c"})
	if got, want := fmt.Sprint(attempts(recs)), fmt.Sprint(span(breakerstore.SegMax+6, n)); got != want {
		t.Errorf("after the sweep: got %s, want %s", got, want)
	}
	if st := s.Stats(); st.AuditDeleted != uint64(breakerstore.SegMax+5) || st.AuditRecords != 15 {
		t.Errorf("stats: got deleted %d, on disk %d; want %d, 15", st.AuditDeleted, st.AuditRecords, breakerstore.SegMax+5)
	}
	s = e.reopen(s)
	if st := s.Stats(); st.AuditRecords != 15 {
		t.Errorf("after a restart: Stats.AuditRecords = %d, want 15", st.AuditRecords)
	}
	e.clock.Advance(time.Second) // one more record expires
	flush(t, s)
	recs = queryAll(t, s, policy.AuditQuery{Tenant: "acme"})
	if got, want := fmt.Sprint(attempts(recs)), fmt.Sprint(span(breakerstore.SegMax+7, n)); got != want {
		t.Errorf("a second later: got %s, want %s", got, want)
	}
	if disk := onDisk(t, s); len(disk) != 14 {
		t.Errorf("records on disk: got %d, want 14", len(disk))
	}
	check(t, e, s)
}

func TestAuditRetentionBySizeIsExactInsideASegment(t *testing.T) {
	keep := breakerstore.SegMax + 3
	e := newEnv(t, func(o *breakerstore.Options) { o.AuditMaxRecords = keep })
	s := e.open()
	appendN(e, s, "acme", "c", 2*breakerstore.SegMax)
	flush(t, s)
	first := 2*breakerstore.SegMax - keep + 1
	recs := queryAll(t, s, policy.AuditQuery{CallID: "c"})
	if got, want := fmt.Sprint(attempts(recs)), fmt.Sprint(span(first, 2*breakerstore.SegMax)); got != want {
		t.Errorf("after the sweep: got %s, want %s", got, want)
	}
	if st := s.Stats(); st.AuditRecords != keep || st.AuditDeleted != uint64(first-1) {
		t.Errorf("stats: got on disk %d, deleted %d; want %d, %d", st.AuditRecords, st.AuditDeleted, keep, first-1)
	}
	s = e.reopen(s)
	appendN(e, s, "acme", "d", 2)
	flush(t, s)
	recs = queryAll(t, s, policy.AuditQuery{Tenant: "acme", Limit: 50})
	if len(recs) != keep || recs[0].CallID != "c" || recs[0].Attempt != uint32(first+2) ||
		recs[keep-1].CallID != "d" || recs[keep-1].Attempt != 2 {
		t.Errorf("after a restart and 2 more: got %d records, from %s%d to %s%d; want %d, from c%d to d2",
			len(recs), recs[0].CallID, recs[0].Attempt, recs[len(recs)-1].CallID, recs[len(recs)-1].Attempt, keep, first+2)
	}
	if disk := onDisk(t, s); len(disk) != keep {
		t.Errorf("records on disk: got %d, want %d", len(disk), keep)
	}
	check(t, e, s)
}

func TestAuditRetentionSweepsAtMostABatchPerFlush(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.AuditMaxRecords, o.AuditBuffer = 1, 4*breakerstore.AuditSweepBatch }) // not half full: one flush, the test's
	s := e.open()
	// A batch and a half, all over the cap; the batch ends inside a segment.
	n := breakerstore.AuditSweepBatch + breakerstore.AuditSweepBatch/2
	for i := range n {
		s.AppendAudit(policy.AuditRecord{Tenant: "acme", CallID: "c", Attempt: uint32(i + 1)})
	}
	flush(t, s)
	if st := s.Stats(); st.AuditDeleted != uint64(breakerstore.AuditSweepBatch) || st.AuditRecords != n-breakerstore.AuditSweepBatch {
		t.Errorf("first flush: deleted %d, on disk %d; want %d, %d",
			st.AuditDeleted, st.AuditRecords, breakerstore.AuditSweepBatch, n-breakerstore.AuditSweepBatch)
	}
	recs, _ := query(t, s, policy.AuditQuery{CallID: "c", Limit: 1})
	if len(recs) != 1 || recs[0].Attempt != uint32(breakerstore.AuditSweepBatch+1) {
		t.Errorf("oldest left: got %v, want attempt %d", attempts(recs), breakerstore.AuditSweepBatch+1)
	}
	flush(t, s)
	recs, _ = query(t, s, policy.AuditQuery{CallID: "c"})
	if got := fmt.Sprint(attempts(recs)); got != fmt.Sprint([]uint32{uint32(n)}) || len(onDisk(t, s)) != 1 {
		t.Errorf("second flush: got %s, want [%d]", got, n)
	}
	check(t, e, s)
}

func TestAuditBloomFilterFindsEveryRecordOfACall(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	total := 5 * breakerstore.SegMax
	var needles []uint32
	for i := range total {
		rec := policy.AuditRecord{Event: policy.AuditOutcome, Tenant: "acme", Target: "geo",
			CallID: fmt.Sprint("call-", i), Attempt: uint32(i + 1)}
		if i%97 == 0 {
			rec.Tenant, rec.CallID = "beta", "needle"
			needles = append(needles, rec.Attempt)
		}
		s.AppendAudit(rec)
		e.clock.Advance(time.Millisecond)
	}
	flush(t, s)
	if _, segments, _ := s.AuditOnDisk(); segments != 5 {
		t.Fatalf("segments: got %d, want 5", segments)
	}
	tests := []struct {
		name string
		q    policy.AuditQuery
		want string
	}{
		{"a call in every segment", policy.AuditQuery{CallID: "needle"}, fmt.Sprint(needles)},
		{"its tenant", policy.AuditQuery{Tenant: "beta"}, fmt.Sprint(needles)},
		{"the call in another tenant", policy.AuditQuery{CallID: "needle", Tenant: "acme"}, "[]"},
		{"an absent call", policy.AuditQuery{CallID: "absent"}, "[]"},
		{"an absent tenant", policy.AuditQuery{Tenant: "absent"}, "[]"},
		{"one call of many", policy.AuditQuery{CallID: "call-1234"}, "[1235]"},
		{"one call in its tenant", policy.AuditQuery{CallID: "call-2000", Tenant: "acme"}, "[2001]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := fmt.Sprint(attempts(queryAll(t, s, tt.q))); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestAuditRecordsWithEarlierTimesKeepTheTrailOrder(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	start := e.clock.Now()
	appendN(e, s, "acme", "c", 2*breakerstore.SegMax) // two segments: seconds 0..511 and 512..1023
	flush(t, s)
	at := func(d time.Duration, attempt uint32) policy.AuditRecord {
		return policy.AuditRecord{Time: start.Add(d), Event: policy.AuditFinal, Tenant: "acme", CallID: "x", Attempt: attempt}
	}
	s.AppendAudit(
		at(10*time.Second+time.Millisecond, 1), // inside the first segment
		at(-time.Hour, 2),                      // before every segment
		at(time.Duration(breakerstore.SegMax)*time.Second-time.Millisecond, 3), // between the two
	)
	flush(t, s)
	if got := fmt.Sprint(attempts(queryAll(t, s, policy.AuditQuery{CallID: "x"}))); got != "[2 1 3]" {
		t.Errorf("call x: got %s, want [2 1 3]", got)
	}
	recs := queryAll(t, s, policy.AuditQuery{Tenant: "acme", Limit: 300})
	if len(recs) != 2*breakerstore.SegMax+3 {
		t.Fatalf("records: got %d, want %d", len(recs), 2*breakerstore.SegMax+3)
	}
	for i := 1; i < len(recs); i++ {
		if c := recs[i-1].Time.Compare(recs[i].Time); c > 0 || c == 0 && recs[i-1].Seq >= recs[i].Seq {
			t.Fatalf("records %d and %d out of order: %v/%d then %v/%d", i-1, i,
				recs[i-1].Time, recs[i-1].Seq, recs[i].Time, recs[i].Seq)
		}
	}
	for i, want := range map[int]string{0: "x2", 12: "x1", breakerstore.SegMax + 2: "x3"} {
		if got := fmt.Sprint(recs[i].CallID, recs[i].Attempt); got != want {
			t.Errorf("record %d: got %s, want %s", i, got, want)
		}
	}
	check(t, e, s)
}

func TestAuditSyncAlwaysFillsSmallSegments(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) {
		o.Sync, o.MaxBatchDelay = breakerstore.SyncAlways, time.Microsecond // one caller: no one to wait for
	})
	s := e.open()
	const n = 200
	for i := range n {
		s.AppendAudit(policy.AuditRecord{Event: policy.AuditOutcome, Tenant: "acme", CallID: "c", Attempt: uint32(i + 1)})
		e.clock.Advance(time.Millisecond)
	}
	if got, want := fmt.Sprint(attempts(queryAll(t, s, policy.AuditQuery{CallID: "c"}))), fmt.Sprint(span(1, n)); got != want {
		t.Errorf("records: got %s, want %s", got, want)
	}
	// Each commit appends to the last segment until it holds SegMin.
	disk, segments, err := s.AuditOnDisk()
	if want := (n + breakerstore.SegMin - 1) / breakerstore.SegMin; err != nil || len(disk) != n || segments != want {
		t.Errorf("on disk: %d records in %d segments (%v), want %d in %d", len(disk), segments, err, n, want)
	}
	check(t, e, s)
}

func TestCheckFindsCorruptAuditSegments(t *testing.T) {
	tests := []struct {
		name   string
		mangle func(v []byte) []byte
	}{
		{"count one too high", func(v []byte) []byte { v[1]++; return v }},
		{"count one too low", func(v []byte) []byte { v[1]--; return v }},
		{"records missing from the Bloom filter", func(v []byte) []byte {
			if err := breakerstore.ClearAuditBloom(v); err != nil {
				t.Fatal(err)
			}
			return v
		}},
		{"truncated", func(v []byte) []byte { return v[:len(v)-1] }},
		{"bytes after the last record", func(v []byte) []byte { return append(v, 0) }},
		{"a record body of another version", func(v []byte) []byte {
			if err := breakerstore.MangleFirstAuditRecord(v); err != nil {
				t.Fatal(err)
			}
			return v
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			s := e.open()
			appendN(e, s, "acme", "c", 10)
			check(t, e, s)
			db, err := bbolt.Open(e.opts.Path, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = db.Update(func(tx *bbolt.Tx) error {
				b := tx.Bucket([]byte("auditseg"))
				k, v := b.Cursor().First()
				return b.Put(bytes.Clone(k), tt.mangle(bytes.Clone(v)))
			})
			if cerr := db.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				t.Fatal(err)
			}
			err = breakerstore.Check(e.opts.Path, time.Second)
			if !errors.Is(err, breakerstore.ErrCorrupt) || !strings.Contains(err.Error(), "auditseg") {
				t.Errorf("Check: got %v, want breakerstore.ErrCorrupt in bucket auditseg", err)
			}
		})
	}
}

// TestAuditMovesThePreviousLayoutIntoSegments opens a schema version 1 file
// of the layout before segments, a key per record and two index buckets,
// built by hand with raw bbolt writes: Open migrates it to version 2 and
// records the version. Before schema version 2 the file kept version 1,
// so a build of the old layout would open it and miss the trail.
func TestAuditMovesThePreviousLayoutIntoSegments(t *testing.T) {
	var logs bytes.Buffer
	e := newEnv(t, func(o *breakerstore.Options) { o.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	n := breakerstore.SegMax + 50
	start := e.clock.Now().Add(-time.Hour)
	old := func(i int) policy.AuditRecord {
		tenant := "acme"
		if i%5 == 0 {
			tenant = "beta"
		}
		return policy.AuditRecord{Time: start.Add(time.Duration(i) * time.Second), Seq: uint64(i + 1),
			Event: policy.AuditDecision, Tenant: tenant, Target: "geo", CallID: fmt.Sprint("call-", i%7),
			Attempt: uint32(i + 1), Verdict: policy.VerdictRetry, Delay: time.Second, Detail: fmt.Sprint("old ", i)}
	}
	db, err := bbolt.Open(e.opts.Path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		meta, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		if err := meta.Put([]byte("schema"), binary.BigEndian.AppendUint32(nil, 1)); err != nil {
			return err
		}
		if err := meta.Put([]byte("auditseq"), binary.BigEndian.AppendUint64(nil, uint64(n))); err != nil {
			return err
		}
		for _, name := range []string{"breakers", "budgets", "tokens", "policies", "runs", "runstate", "runcalls"} {
			if _, err := tx.CreateBucket([]byte(name)); err != nil {
				return err
			}
		}
		var buckets [3]*bbolt.Bucket
		for i, name := range []string{"audit", "auditcall", "audittenant"} {
			if buckets[i], err = tx.CreateBucket([]byte(name)); err != nil {
				return err
			}
		}
		for i := range n {
			rec := old(i)
			k := binary.BigEndian.AppendUint64(nil, uint64(rec.Time.UnixNano()))
			k = binary.BigEndian.AppendUint64(k, rec.Seq)
			if err := buckets[0].Put(k, breakerstore.EncodeAudit(rec)); err != nil {
				return err
			}
			for j, name := range []string{rec.CallID, rec.Tenant} {
				if err := buckets[j+1].Put(append(append([]byte(name), 0), k...), []byte{}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := breakerstore.Check(e.opts.Path, time.Second); err != nil {
		t.Errorf("Check before the move: got %v, want nil", err)
	}

	s := e.open()
	var want []policy.AuditRecord
	for i := range n {
		if i%7 == 3 {
			want = append(want, old(i))
		}
	}
	got := queryAll(t, s, policy.AuditQuery{CallID: "call-3"})
	if len(got) != len(want) {
		t.Fatalf("call-3: got %d records, want %d", len(got), len(want))
	}
	for i := range want {
		if !got[i].Time.Equal(want[i].Time) || !equalButTime(got[i], want[i]) {
			t.Errorf("call-3 record %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
	beta := queryAll(t, s, policy.AuditQuery{Tenant: "beta", CallID: "call-0"})
	if len(beta) != (n+34)/35 || beta[0].Detail != "old 0" {
		t.Errorf("tenant beta, call-0: got %d records, first %+v; want %d, first old 0", len(beta), beta[0], (n+34)/35)
	}
	if st := s.Stats(); st.AuditRecords != n {
		t.Errorf("Stats.AuditRecords = %d, want %d", st.AuditRecords, n)
	}
	// New records continue the sequence after the moved ones.
	s.AppendAudit(policy.AuditRecord{Tenant: "acme", CallID: "new"})
	if recs, _ := query(t, s, policy.AuditQuery{CallID: "new"}); len(recs) != 1 || recs[0].Seq != uint64(n+1) {
		t.Errorf("a new record: got %+v, want sequence number %d", recs, n+1)
	}
	err = s.View(func(tx *bbolt.Tx) error {
		for _, name := range []string{"audit", "auditcall", "audittenant"} {
			if tx.Bucket([]byte(name)) != nil {
				t.Errorf("bucket %s is still there", name)
			}
		}
		if v := tx.Bucket([]byte("meta")).Get([]byte("schema")); len(v) != 4 || binary.BigEndian.Uint32(v) != 3 {
			t.Errorf("meta/schema after the migration: got %x, want version 3 (the steps from 1 to 2 and 2 to 3)", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	check(t, e, s)
	if got := strings.Count(logs.String(), "audit trail moved into segments"); got != 1 ||
		!strings.Contains(logs.String(), fmt.Sprint("records=", n)) ||
		!strings.Contains(logs.String(), "schema migrated") || !strings.Contains(logs.String(), "from=1 to=3") {
		t.Errorf("log: got %q, want one line about %d records moved", logs.String(), n)
	}
}

// equalButTime reports whether a and b are equal but for their times,
// which compare with Time.Equal.
func equalButTime(a, b policy.AuditRecord) bool {
	a.Time, b.Time = time.Time{}, time.Time{}
	return a == b
}
