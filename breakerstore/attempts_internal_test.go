package breakerstore

import (
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// TestAttemptTableGroupCommits: the attempt table's group commit writes
// every record changed and deletes every record dropped, also when a
// commit fails after write took its lists (redirty lists the records
// again; the deletions wait) and when a record changes while a commit is
// being written (the next one writes it).
func TestAttemptTableGroupCommits(t *testing.T) {
	s, err := Open(Options{Path: filepath.Join(t.TempDir(), "a.db"), FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	decide := func(call string, attempt uint32, note string, keep int64) {
		t.Helper()
		k := policy.CallKey{Tenant: "acme", CallID: call}
		if _, _, err := s.ClaimAttempt(k, attempt); err != nil {
			t.Fatalf("ClaimAttempt(%s, %d) = %v", call, attempt, err)
		}
		if err := s.recordAttempt(k, attempt, policy.Answer{Retry: true, Note: note}, keep, nil); err != nil {
			t.Fatalf("recordAttempt(%s, %d) = %v", call, attempt, err)
		}
	}
	later := s.now() + int64(time.Hour)
	failed := errors.New("disk on fire")
	// write runs the table's part of a group commit; during runs in its
	// transaction after the write, and the commit fails with fail.
	write := func(fail bool, during func()) error {
		return s.db.Update(func(tx *bbolt.Tx) error {
			if _, err := s.attempts.write(tx, true); err != nil {
				return err
			}
			if during != nil {
				during()
			}
			if fail {
				return failed
			}
			return nil
		})
	}
	onDisk := func() string {
		t.Helper()
		var got string
		if err := s.db.View(func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketAttempts).ForEach(func(k, v []byte) error {
				a, err := decodeAttempts(v)
				if err != nil {
					return err
				}
				got += fmt.Sprintf("%s:%d:%s ", k[len("acme")+1:], a.Attempt, a.Answer.Note)
				return nil
			})
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}

	decide("c1", 1, "", later)
	decide("c2", 1, "", later)
	decide("c3", 1, "", s.now()+int64(time.Minute))
	if err := write(false, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := onDisk(), "c1:1: c2:1: c3:1: "; got != want {
		t.Fatalf("after the first commit: %q, want %q", got, want)
	}

	// c1 moves on with a note too long for its record's place, c3
	// expires, c4 is new; the commit fails.
	decide("c1", 2, "a pushback note longer than the room kept for one, to move the record", later)
	if !s.attempts.expire(s.now() + int64(2*time.Minute)) {
		t.Fatal("expire dropped nothing, want c3")
	}
	decide("c4", 1, "", later)
	if err := write(true, nil); !errors.Is(err, failed) {
		t.Fatalf("the failing commit = %v", err)
	}
	s.attempts.redirty() // what commit does after a failure
	decide("c5", 1, "", later)
	// c2 moves on and c6 is decided while the next commit is written.
	if err := write(false, func() {
		decide("c2", 2, "during", later)
		decide("c6", 1, "", later)
	}); err != nil {
		t.Fatal(err)
	}
	want := "c1:2:a pushback note longer than the room kept for one, to move the record c2:1: c4:1: c5:1: "
	if got := onDisk(); got != want {
		t.Fatalf("after the failed commit and the next: %q, want %q", got, want)
	}
	if err := write(false, nil); err != nil {
		t.Fatal(err)
	}
	want = "c1:2:a pushback note longer than the room kept for one, to move the record c2:2:during c4:1: c5:1: c6:1: "
	if got := onDisk(); got != want {
		t.Fatalf("after the commit that follows: %q, want %q", got, want)
	}
	if got, ok := s.LastAnswer(policy.CallKey{Tenant: "acme", CallID: "c1"}); !ok || got.Note != "a pushback note longer than the room kept for one, to move the record" {
		t.Errorf("LastAnswer(c1) = %+v, %v; want the answer with its note", got, ok)
	}
}

// TestAttemptArenaCompacts: records rewritten many times, each moving to
// the end of the arena, leave it compacted, and every call's last answer
// is still the one recorded.
func TestAttemptArenaCompacts(t *testing.T) {
	s, err := Open(Options{Path: filepath.Join(t.TempDir(), "a.db"), FlushInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	later := s.now() + int64(time.Hour)
	const calls, rounds = 400, 40
	for r := range uint32(rounds) {
		for c := range calls {
			k := policy.CallKey{Tenant: "acme", CallID: fmt.Sprint("call-", c)}
			if _, _, err := s.ClaimAttempt(k, r+1); err != nil {
				t.Fatal(err)
			}
			note := fmt.Sprintf("round %d %0*d", r, int(r)*4, c) // longer every round
			if err := s.recordAttempt(k, r+1, policy.Answer{Retry: true, Note: note}, later, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	size := 0
	for i := range s.attempts.shards {
		sh := &s.attempts.shards[i]
		size += len(sh.arena)
		if sh.garbage >= 64<<10 && sh.garbage >= len(sh.arena)/2 {
			t.Errorf("shard %d: %d of %d arena bytes garbage, want it compacted", i, sh.garbage, len(sh.arena))
		}
	}
	// Never compacted, they would hold every round's copy: about 3 MB.
	if live := calls * (rounds*4 + 100); size > 2*live+attemptShards*64<<10 {
		t.Errorf("arenas hold %d bytes for about %d live, want them compacted", size, live)
	}
	for c := range calls {
		k := policy.CallKey{Tenant: "acme", CallID: fmt.Sprint("call-", c)}
		want := fmt.Sprintf("round %d %0*d", rounds-1, (rounds-1)*4, c)
		if got, ok := s.LastAnswer(k); !ok || got.Note != want {
			t.Errorf("LastAnswer(%v) = %q, %v; want %q", k, got.Note, ok, want)
		}
	}
}

// TestAttemptsRecordBytes pins the attempts record's bytes (version 1,
// and version 2 with a target), as the file holds them: the answer part
// is fleet's packed answer, which must not move a byte of them.
func TestAttemptsRecordBytes(t *testing.T) {
	ans := policy.Answer{Retry: true, Delay: 1500 * time.Millisecond, AttemptTimeout: 10 * time.Second,
		Stop: policy.StopBudgetExhausted, Disposition: policy.DispositionDeadLetter, Category: policy.CategoryTransient,
		Class: "transient:503", Note: "retry-after:2s", Checks: policy.CheckBreaker | policy.CheckTenantBudget,
		Breaker: policy.BreakerHalfOpen, TenantTokens: 41.25, RunRemaining: 7, Deadline: time.Unix(0, 1_800_000_000_123_456_789)}
	fallback := ans
	fallback.Target = "api-b"
	tests := []struct {
		a    fleet.Attempts
		want string
	}{
		{fleet.Attempts{Attempt: 3, Expiry: 1_800_000_000_000_000_000, Answer: ans},
			"010000000318fae27693b40000010000000059682f0000000002540be4000503010060034044a00000000000000000000000000718fae2769b0fcd15" +
				"000d7472616e7369656e743a353033000e72657472792d61667465723a3273"},
		{fleet.Attempts{Attempt: 4, Expiry: 1_800_000_001_000_000_000, Answer: fallback},
			"020000000418fae276cf4eca00010000000059682f0000000002540be4000503010060034044a00000000000000000000000000718fae2769b0fcd15" +
				"000d7472616e7369656e743a353033000e72657472792d61667465723a327300056170692d62"},
	}
	for _, tt := range tests {
		got := hex.EncodeToString(encodeAttempts(&tt.a))
		if got != tt.want {
			t.Errorf("record of attempt %d:\ngot  %s\nwant %s", tt.a.Attempt, got, tt.want)
		}
		back, err := decodeAttempts(encodeAttempts(&tt.a))
		if err != nil || back.Attempt != tt.a.Attempt || back.Expiry != tt.a.Expiry || back.Answer != tt.a.Answer {
			t.Errorf("record of attempt %d read back as %+v, %v", tt.a.Attempt, back, err)
		}
	}
}
