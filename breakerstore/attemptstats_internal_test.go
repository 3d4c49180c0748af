package breakerstore

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/policyd/policyd/policy"
)

// TestTargetStatsRewriteAfterAFailedCommit: a group commit that fails
// after write cleared the hours it wrote loses none of them: redirty makes
// the next write put every hour again and delete the records of hours
// dropped meanwhile.
func TestTargetStatsRewriteAfterAFailedCommit(t *testing.T) {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "t.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket(bucketStats); return err }); err != nil {
		t.Fatal(err)
	}
	h := int64(time.Hour)
	ts := &targetStats{key: policy.BreakerKey{Tenant: "acme", Target: "geo"}}
	count := func(now int64) {
		hour, dropped := ts.v.Count(now, 1, true)
		ts.changed = append(ts.changed, hour)
		ts.dropped = append(ts.dropped, dropped...)
		ts.dirty = true
	}
	keys := func() []int64 {
		var hours []int64
		_ = db.View(func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketStats).ForEach(func(k, _ []byte) error {
				hours = append(hours, int64(k[len(k)-1]))
				return nil
			})
		})
		return hours
	}
	count(1 * h)
	count(2 * h)
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := ts.write(tx, true); return err }); err != nil {
		t.Fatal(err)
	}
	// Hour 3 counted, and at hour 169 hour 1 dropped (the retention
	// keeps 2 to 169); the commit that writes them fails after write
	// cleared its marks.
	count(3 * h)
	count(169 * h)
	failed := errors.New("disk on fire")
	if err := db.Update(func(tx *bbolt.Tx) error {
		if _, err := ts.write(tx, true); err != nil {
			return err
		}
		return failed
	}); !errors.Is(err, failed) {
		t.Fatalf("the failing commit = %v", err)
	}
	if len(ts.changed) != 0 || len(ts.dropped) != 0 {
		t.Fatalf("write with clear kept %v / %v, want them cleared", ts.changed, ts.dropped)
	}
	ts.redirty() // what commit does after a failure
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := ts.write(tx, true); return err }); err != nil {
		t.Fatal(err)
	}
	if got := keys(); len(got) != 3 || got[0] != 2 || got[1] != 3 || got[2] != 169 {
		t.Errorf("records after the rewrite: hours %v, want 2, 3 and 169 (1 dropped)", got)
	}
}
