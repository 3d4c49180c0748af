package breakerstore_test

import (
	"fmt"
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

// indexEntries counts the entries of an audit bucket.
func indexEntries(t *testing.T, s *breakerstore.Store, bucket string) int {
	t.Helper()
	n := 0
	if err := s.View(func(tx *bbolt.Tx) error {
		n = tx.Bucket([]byte(bucket)).Stats().KeyN
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
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
	for _, b := range []string{"audit", "auditcall", "audittenant"} {
		if n := indexEntries(t, s, b); n != 2 {
			t.Errorf("bucket %s: got %d entries, want 2", b, n)
		}
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
	if n := indexEntries(t, s, "auditcall"); n != 5 {
		t.Errorf("by-call index: got %d entries, want 5", n)
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
