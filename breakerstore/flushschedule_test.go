package breakerstore

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/policyd/policyd/policy"
)

// TestFlushEveryKeepsItsSchedule runs the flusher's loop under
// testing/synctest's clock with flushes of given lengths: a flush is due interval after the previous one
// started, a flush that runs past the interval is followed at once, and no
// flush starts after stop. Under the ticker it replaced the schedule was
// the same for short commits; the test pins it, since the loss bound of
// SyncGroup (interval plus one commit) rests on it.
func TestFlushEveryKeepsItsSchedule(t *testing.T) {
	const interval = 100 * time.Millisecond
	tests := []struct {
		name  string
		takes []time.Duration // how long each flush takes
		want  []time.Duration // when each flush starts, from the loop's start
	}{
		{"instant commits", []time.Duration{0, 0, 0}, []time.Duration{100, 200, 300}},
		{"commits shorter than the interval do not drift", []time.Duration{30, 70, 99}, []time.Duration{100, 200, 300}},
		{"a long commit is followed at once", []time.Duration{250, 10, 0}, []time.Duration{100, 350, 450}},
		{"exactly the interval", []time.Duration{100, 100, 0}, []time.Duration{100, 200, 300}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				stop, done := make(chan struct{}), make(chan struct{})
				begin := time.Now()
				var starts []time.Duration
				go func() {
					defer close(done)
					flushEvery(stop, nil, interval, func() {
						starts = append(starts, time.Since(begin))
						if n := len(starts); n <= len(tt.takes) {
							time.Sleep(tt.takes[n-1] * time.Millisecond)
						}
						if len(starts) == len(tt.want) {
							close(stop)
						}
					})
				}()
				<-done
				if len(starts) != len(tt.want) {
					t.Fatalf("flushes started at %v, want %d flushes", starts, len(tt.want))
				}
				for i := range tt.want {
					if want := tt.want[i] * time.Millisecond; starts[i] != want {
						t.Errorf("flush %d started at %v, want %v (all: %v)", i, starts[i], want, starts)
					}
				}
			})
		})
	}
}

// TestFlushEveryStopsWhileWaiting: closing stop ends the loop without
// another flush.
func TestFlushEveryStopsWhileWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stop, done := make(chan struct{}), make(chan struct{})
		flushes := 0
		go func() { defer close(done); flushEvery(stop, nil, time.Second, func() { flushes++ }) }()
		time.Sleep(1500 * time.Millisecond)
		close(stop)
		<-done
		if flushes != 1 {
			t.Errorf("flushes before stop at 1.5s: got %d, want 1", flushes)
		}
	})
}

// TestGroupCommitWithinOneInterval opens a real store under synctest's
// clock (commits take no time there): a retry spent at any moment is on
// disk, and survives a crash, one FlushInterval later and not before the
// flush that is due.
func TestGroupCommitWithinOneInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := t.TempDir() + "/policyd.db"
		opts := Options{Path: path, FlushInterval: 100 * time.Millisecond}
		s, err := Open(opts)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(130 * time.Millisecond) // a flush ran at 100ms, with nothing to write
		if _, err := s.SpendRetry(policy.SpendRequest{Tenant: "acme"}); err != nil {
			t.Fatal(err)
		}
		before := s.Stats().GroupCommits
		time.Sleep(69 * time.Millisecond) // 199ms: the next flush is due at 200ms
		synctest.Wait()
		if got := s.Stats().GroupCommits; got != before {
			t.Fatalf("group commits at 199ms: got %d, want %d (none due yet)", got, before)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := s.Stats().GroupCommits; got != before+1 {
			t.Fatalf("group commits at 200ms: got %d, want %d", got, before+1)
		}
		if err := s.Crash(); err != nil {
			t.Fatal(err)
		}
		s, err = Open(opts)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if b, err := s.Budget("acme"); err != nil || b.Granted != 1 {
			t.Errorf("after the crash: got %+v, %v; want the retry granted before it", b, err)
		}
	})
}

// TestAuditHalfFullFlushesAtOnce: audit records filling half the buffer
// start a group commit at once rather than at the next interval, so a
// load that appends a buffer's worth in less than an interval is written,
// not dropped: under policybench's report phase (600,000 records/s, a
// 65,536-record buffer, commits of 80 ms) the daemon dropped 5% to 37% of
// its records before this.
func TestAuditHalfFullFlushesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := Open(Options{Path: t.TempDir() + "/policyd.db", FlushInterval: time.Second, AuditBuffer: 200})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		recs := make([]policy.AuditRecord, 600)
		for i := range recs {
			recs[i] = policy.AuditRecord{Event: policy.AuditOutcome, Tenant: "acme", Target: "geo", CallID: "doc-" + string(rune('a'+i%26)), Attempt: 1}
		}
		time.Sleep(10 * time.Millisecond)
		s.AppendAudit(recs[:99]...)
		synctest.Wait()
		if st := s.Stats(); st.GroupCommits != 0 || st.AuditBuffered != 99 {
			t.Fatalf("99 of 200 buffered: %d group commits, %d buffered; want none yet, 99", st.GroupCommits, st.AuditBuffered)
		}
		for round := range 5 { // 501 records in 10 ms, 2.5 buffers' worth
			s.AppendAudit(recs[99+round*100 : 99+(round+1)*100]...)
			synctest.Wait()
		}
		s.AppendAudit(recs[599:]...)
		st := s.Stats()
		if st.AuditDropped != 0 || st.GroupCommits < 5 || st.AuditRecords+st.AuditBuffered != len(recs) {
			t.Errorf("at 10 ms: %d group commits, %d records written, %d buffered, %d dropped; want 5 or more, all %d kept",
				st.GroupCommits, st.AuditRecords, st.AuditBuffered, st.AuditDropped, len(recs))
		}
	})
}

// TestFlushEveryWakes: a signal on wake starts a flush at once, and the
// next is due an interval after it; a signal during a flush starts
// another as soon as it ends.
func TestFlushEveryWakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stop, wake, done := make(chan struct{}), make(chan struct{}, 1), make(chan struct{})
		begin := time.Now()
		var starts []time.Duration
		go func() {
			defer close(done)
			flushEvery(stop, wake, 100*time.Millisecond, func() {
				starts = append(starts, time.Since(begin))
				if len(starts) == 1 {
					wake <- struct{}{} // during the flush
					time.Sleep(20 * time.Millisecond)
				}
				if len(starts) == 4 {
					close(stop)
				}
			})
		}()
		time.Sleep(30 * time.Millisecond)
		wake <- struct{}{}
		<-done
		want := []time.Duration{30, 50, 150, 250}
		for i := range want {
			if i >= len(starts) || starts[i] != want[i]*time.Millisecond {
				t.Fatalf("flushes started at %v, want %v ms", starts, want)
			}
		}
	})
}
