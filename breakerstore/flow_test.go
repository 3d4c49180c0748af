package breakerstore_test

import (
	"encoding/binary"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

var portal = policy.BreakerKey{Tenant: "acme", Target: "portal"}

func TestLeasesKeepTheCeiling(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	var cfg policy.BreakerConfig
	var leases []string
	for i := range 3 {
		a := must(s.AdmitFlow(portal, cfg, policy.FlowLimits{Ceiling: 3, LeaseTTL: 10 * time.Second, FullWait: time.Second})).get(t)
		if !a.Admitted || a.LeaseID == "" || a.Reason != fleet.ReasonClosed {
			t.Fatalf("lease %d: got %+v, want admitted by a CLOSED breaker with a lease", i, a)
		}
		leases = append(leases, a.LeaseID)
	}
	a := must(s.AdmitFlow(portal, cfg, policy.FlowLimits{Ceiling: 3, LeaseTTL: 10 * time.Second, FullWait: time.Second})).get(t)
	if a.Admitted || a.Reason != fleet.ReasonFull || a.RetryAfter != time.Second {
		t.Fatalf("fourth: got %+v, want refused %s after 1s", a, fleet.ReasonFull)
	}
	if st := must(s.Pool(portal)).get(t); st.InFlight != 3 {
		t.Fatalf("in flight %d, want 3", st.InFlight)
	}
	if held := must(s.ReleaseLease(portal, leases[0], policy.FlowLimits{}, policy.SignalNone)).get(t); !held {
		t.Fatalf("release of a live lease: held false")
	}
	if held := must(s.ReleaseLease(portal, leases[0], policy.FlowLimits{}, policy.SignalNone)).get(t); held {
		t.Fatalf("second release: held true, want false (ignored)")
	}
	if held := must(s.ReleaseLease(policy.BreakerKey{Tenant: "acme", Target: "elsewhere"}, leases[1], policy.FlowLimits{}, policy.SignalNone)).get(t); held {
		t.Fatalf("release under another key: held true")
	}
	if st := must(s.Pool(portal)).get(t); st.InFlight != 2 || st.Stray != 1 {
		t.Fatalf("pool %+v, want 2 in flight and 1 stray release", st)
	}
	// The leases survive a restart, and so does the ceiling they fill.
	s = e.reopen(s)
	if a := must(s.AdmitFlow(portal, cfg, policy.FlowLimits{Ceiling: 3, LeaseTTL: 10 * time.Second, FullWait: time.Second})).get(t); !a.Admitted {
		t.Fatalf("third slot after reopen: %+v, want admitted", a)
	}
	if a := must(s.AdmitFlow(portal, cfg, policy.FlowLimits{Ceiling: 3, LeaseTTL: 10 * time.Second, FullWait: time.Second})).get(t); a.Admitted {
		t.Fatalf("fourth after reopen: %+v, want refused: the leases were persisted", a)
	}
	// Unreturned leases expire: a crashed worker cannot leak them.
	e.clock.Advance(10 * time.Second)
	if st := must(s.Pool(portal)).get(t); st.InFlight != 0 {
		t.Fatalf("after the lease life: %d in flight, want 0", st.InFlight)
	}
}

func TestLeaseIsReturnedWhenTheBreakerRefuses(t *testing.T) {
	s := newEnv(t).open()
	cfg := policy.BreakerConfig{ConsecutiveFailures: 1}
	record(t, s, portal, cfg, policy.ResultTransientFailure, 1)
	for range 5 {
		a := must(s.AdmitFlow(portal, cfg, policy.FlowLimits{Ceiling: 1, LeaseTTL: 10 * time.Second, FullWait: time.Second})).get(t)
		if a.Admitted || a.Reason != fleet.ReasonOpen || a.LeaseID != "" {
			t.Fatalf("OPEN breaker: got %+v, want refused breaker:open without a lease", a)
		}
	}
	if st := must(s.Pool(portal)).get(t); st.InFlight != 0 {
		t.Fatalf("%d leases held after refusals, want 0", st.InFlight)
	}
}

// TestLeasesUnderConcurrency: 32 goroutines taking and returning leases of
// a ceiling of 5 never hold more than 5 at once.
func TestLeasesUnderConcurrency(t *testing.T) {
	s := newEnv(t).open()
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				a, err := s.AdmitFlow(portal, policy.BreakerConfig{}, policy.FlowLimits{Ceiling: 5, LeaseTTL: time.Minute, FullWait: time.Millisecond})
				if err != nil {
					t.Error(err)
					return
				}
				if !a.Admitted {
					continue
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				inside.Add(-1)
				if _, err := s.ReleaseLease(portal, a.LeaseID, policy.FlowLimits{}, policy.SignalNone); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m > 5 || m < 1 {
		t.Fatalf("at most %d inside at once, want 1 to 5", m)
	}
}

func TestDamagedFlowRecordIsRefused(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	must(s.AdmitFlow(portal, policy.BreakerConfig{}, policy.FlowLimits{Ceiling: 3, LeaseTTL: time.Minute, FullWait: time.Second})).get(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(e.opts.Path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("flow")).Put([]byte("acme\x00portal"), []byte{1, 0, 0})
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	_, err = breakerstore.Open(e.opts)
	t.Logf("Open: %v", err)
	if !errors.Is(err, breakerstore.ErrCorrupt) || !strings.Contains(err.Error(), "bucket flow") || !strings.Contains(err.Error(), e.opts.Path) {
		t.Fatalf("Open of a damaged flow record: %v, want ErrCorrupt naming the file and the bucket", err)
	}
}

// TestRateCeilingIsGCRA: a rate of 2/s with a burst of 3 admits 3 at once,
// then one each 500ms, telling each refusal the exact wait; the account
// survives a restart, and a refusal by the breaker gives its slot back.
func TestRateCeilingIsGCRA(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	lim := policy.FlowLimits{Interval: 500 * time.Millisecond, Burst: 3}
	var cfg policy.BreakerConfig
	for i := range 3 {
		if a := must(s.AdmitFlow(portal, cfg, lim)).get(t); !a.Admitted || a.LeaseID != "" {
			t.Fatalf("burst %d: %+v, want admitted without a lease", i, a)
		}
	}
	a := must(s.AdmitFlow(portal, cfg, lim)).get(t)
	if a.Admitted || a.Reason != fleet.ReasonRate || a.RetryAfter != 500*time.Millisecond {
		t.Fatalf("past the burst: %+v, want refused %s after exactly 500ms", a, fleet.ReasonRate)
	}
	e.clock.Advance(200 * time.Millisecond)
	if a := must(s.AdmitFlow(portal, cfg, lim)).get(t); a.Admitted || a.RetryAfter != 300*time.Millisecond {
		t.Fatalf("200ms later: %+v, want refused after exactly 300ms", a)
	}
	s = e.reopen(s)
	e.clock.Advance(300 * time.Millisecond)
	if a := must(s.AdmitFlow(portal, cfg, lim)).get(t); !a.Admitted {
		t.Fatalf("after the wait (across a restart): %+v, want admitted", a)
	}
	if a := must(s.AdmitFlow(portal, cfg, lim)).get(t); a.Admitted {
		t.Fatalf("at once again: %+v, want refused: the account was persisted", a)
	}
	// A breaker that refuses takes no slot.
	e.clock.Advance(time.Second)
	open := policy.BreakerConfig{ConsecutiveFailures: 1}
	record(t, s, portal, open, policy.ResultTransientFailure, 1)
	for range 10 {
		if a := must(s.AdmitFlow(portal, open, lim)).get(t); a.Admitted || a.Reason != fleet.ReasonOpen {
			t.Fatalf("OPEN breaker: %+v, want refused breaker:open", a)
		}
	}
	if _, err := s.ResetBreaker(portal); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if a := must(s.AdmitFlow(portal, cfg, lim)).get(t); !a.Admitted {
			t.Fatalf("after the refusals, slot %d: %+v, want admitted: refused attempts gave theirs back", i, a)
		}
	}
}

// adaptive are the limits of an adaptive ceiling of at most 10, at least
// 2, halved on congestion, +1 per window of successes, no hold.
var adaptive = policy.FlowLimits{Ceiling: 10, LeaseTTL: 10 * time.Second, FullWait: time.Second,
	Adaptive: policy.AdaptiveBounds{Min: 2, Max: 10, Decrease: 0.5, Increase: 1}}

// TestAdaptiveCeiling: a congestion signal carried by a release cuts the
// ceiling AdmitFlow keeps, also from a lease that expired; the limit, its
// decreases and the leases survive a restart; a success grows it.
func TestAdaptiveCeiling(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	admitAll := func() []string {
		t.Helper()
		var ids []string
		for {
			a := must(s.AdmitFlow(portal, consecutive, adaptive)).get(t)
			if !a.Admitted {
				if a.Reason != fleet.ReasonFull {
					t.Fatalf("refused %+v, want %s", a, fleet.ReasonFull)
				}
				return ids
			}
			ids = append(ids, a.LeaseID)
		}
	}
	ids := admitAll()
	if len(ids) != 10 {
		t.Fatalf("a fresh adaptive ceiling admitted %d, want its maximum 10", len(ids))
	}
	// The leases run out; the congestion they report still teaches.
	e.clock.Advance(11 * time.Second)
	if held := must(s.ReleaseLease(portal, ids[0], adaptive, policy.SignalCongestion)).get(t); held {
		t.Fatalf("release of an expired lease: held true")
	}
	if st := must(s.Pool(portal)).get(t); st.Adaptive != 5 || st.Decreases != 1 || st.Stray != 1 {
		t.Fatalf("after a congestion signal: %+v, want the limit 5 after 1 decrease, 1 stray release", st)
	}
	if ids = admitAll(); len(ids) != 5 {
		t.Fatalf("cut to 5: admitted %d, want 5", len(ids))
	}
	s = e.crashAndReopen(s)
	// Crash loses what the group commit did not flush; Close keeps it.
	if st := must(s.Pool(portal)).get(t); st.Adaptive != 0 {
		t.Fatalf("after a crash within the flush interval: %+v, want the limit not flushed (counter-grade)", st)
	}
	must(s.ReleaseLease(portal, "", adaptive, policy.SignalCongestion)).get(t)
	s = e.reopen(s)
	st := must(s.Pool(portal)).get(t)
	if st.Adaptive != 5 || st.Decreases != 1 {
		t.Fatalf("after a restart: %+v, want the limit 5 after 1 decrease", st)
	}
	for range 5 {
		must(s.ReleaseLease(portal, "", adaptive, policy.SignalSuccess)).get(t)
	}
	// 1/5 + 1/5.2 + ... : just under +1 for the window.
	if st := must(s.Pool(portal)).get(t); st.Adaptive < 5.9 || st.Adaptive >= 6 {
		t.Fatalf("after a window of 5 successes: %+v, want just under 6", st)
	}
	// Without an adaptive ceiling in the limits a signal changes nothing.
	must(s.ReleaseLease(portal, "", policy.FlowLimits{Ceiling: 10}, policy.SignalCongestion)).get(t)
	if st := must(s.Pool(portal)).get(t); st.Adaptive < 5.9 || st.Decreases != 1 {
		t.Fatalf("congestion without adaptive limits: %+v, want unchanged", st)
	}
}

// TestFlowRecordOfVersion1 opens a file of schema version 2 whose flow
// record is of version 1 (before the adaptive ceiling): its leases and
// stray count are read, the adaptive ceiling stands at its maximum, and
// the step to schema version 3 rewrote the record as version 2.
func TestFlowRecordOfVersion1(t *testing.T) {
	e := newEnv(t)
	s := e.open()
	a := must(s.AdmitFlow(portal, consecutive, policy.FlowLimits{Ceiling: 3, LeaseTTL: time.Minute, FullWait: time.Second})).get(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(e.opts.Path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	id, ok := fleet.ParsePermitID(a.LeaseID)
	if !ok {
		t.Fatalf("lease id %q does not parse", a.LeaseID)
	}
	v1 := []byte{1}
	v1 = binary.BigEndian.AppendUint64(v1, 0)
	v1 = binary.BigEndian.AppendUint64(v1, 7) // stray releases
	v1 = binary.BigEndian.AppendUint32(v1, 1)
	v1 = append(v1, id[:]...)
	v1 = binary.BigEndian.AppendUint64(v1, uint64(a.LeaseExpiry.UnixNano()))
	if err := db.Update(func(tx *bbolt.Tx) error {
		if err := tx.Bucket([]byte("meta")).Put([]byte("schema"), binary.BigEndian.AppendUint32(nil, 2)); err != nil {
			return err
		}
		return tx.Bucket([]byte("flow")).Put([]byte("acme\x00portal"), v1)
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s = e.open()
	if st := must(s.Pool(portal)).get(t); st.InFlight != 1 || st.Stray != 7 || st.Adaptive != 0 {
		t.Fatalf("pool of a version 1 record: %+v, want 1 in flight, 7 stray, no adaptive limit", st)
	}
	if n := len(mustAdmitAll(t, s, adaptive)); n != 9 {
		t.Fatalf("adaptive ceiling over a version 1 record admitted %d beside its 1 lease, want 9", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = bbolt.Open(e.opts.Path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.View(func(tx *bbolt.Tx) error {
		if v := tx.Bucket([]byte("meta")).Get([]byte("schema")); binary.BigEndian.Uint32(v) != 3 {
			t.Errorf("schema version %d after open, want 3", binary.BigEndian.Uint32(v))
		}
		if v := tx.Bucket([]byte("flow")).Get([]byte("acme\x00portal")); len(v) == 0 || v[0] != 2 {
			t.Errorf("flow record %x after open, want version 2", v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// mustAdmitAll takes leases under lim until the ceiling refuses.
func mustAdmitAll(t *testing.T, s *breakerstore.Store, lim policy.FlowLimits) []string {
	t.Helper()
	var ids []string
	for {
		a := must(s.AdmitFlow(portal, consecutive, lim)).get(t)
		if !a.Admitted {
			return ids
		}
		ids = append(ids, a.LeaseID)
	}
}
