package redisstore

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

// TestBucketFormatIsTheLibrarys: the library packs a bucket and its shares
// with the layout decodeBucketRecord reads.
func TestBucketFormatIsTheLibrarys(t *testing.T) {
	checkLibraryLocals(t, map[string]string{
		"BUCKET_FMT": "'<di8i8i8i8'",
		"BUCKET_LEN": strconv.Itoa(bucketRecordLen),
		"SHARE_FMT":  "'<Bc0ddi8i8'",
		"SHARE_LEN":  strconv.Itoa(shareRecordLen) + " -- and the id",
	})
}

// TestBucketOfAnEarlierLayoutIsRead: a bucket the layout before the
// record stored as a hash of text fields, with another replica's share,
// is read as it was, and the next spend rewrites it as a record holding
// the same numbers and that share beside the spender's.
func TestBucketOfAnEarlierLayoutIsRead(t *testing.T) {
	c, s := storeOnStandalone(t)
	ctx := context.Background()
	if _, err := s.SetBudget(policy.TenantBudget{Tenant: "acme", Capacity: 10, DepositRatio: 0.1,
		MinPerSecond: 1e-9, RetryCost: 1, TimeoutCost: 2}); err != nil {
		t.Fatal(err)
	}
	now := strconv.FormatInt(time.Now().UnixMicro(), 10)
	c.HSet(ctx, keyBucket("acme"), "tokens", "5.5", "last", now, "granted", "7", "refused", "2", "dry", "0",
		"h:r-old", "1.25", "l:r-old", "1.5", "v:r-old", "4", "a:r-old", now)

	st, err := s.Budget("acme")
	if err != nil || st.Granted != 7 || st.Refused != 2 || math.Abs(st.Tokens-5.5) > 1e-3 {
		t.Fatalf("Budget of a hash = %+v, %v; want 5.5 tokens, 7 granted, 2 refused", st, err)
	}
	if sp, err := s.SpendRetry(policy.SpendRequest{Tenant: "acme"}); err != nil || !sp.Granted {
		t.Fatalf("SpendRetry = %+v, %v; want granted", sp, err)
	}
	if typ := c.Type(ctx, keyBucket("acme")).Val(); typ != "string" {
		t.Fatalf("after a spend the bucket is a %s, want a string (its record)", typ)
	}
	r, ok, err := readBucket(ctx, c, "acme")
	if err != nil || !ok {
		t.Fatalf("readBucket = %v, %v", ok, err)
	}
	if r.granted != 8 || r.refused != 2 || math.Abs(r.tokens-4.5) > 1e-3 {
		t.Errorf("the record = %+v, want 4.5 tokens, 8 granted, 2 refused", r)
	}
	var old, mine *bucketShare
	for i, sh := range r.shares {
		switch sh.replica {
		case "r-old":
			old = &r.shares[i]
		case s.id:
			mine = &r.shares[i]
		}
	}
	if len(r.shares) != 2 || old == nil || mine == nil {
		t.Fatalf("the record's shares = %+v, want r-old's and the spender's (%s)", r.shares, s.id)
	}
	if old.hold != 1.25 || old.lock != 1.5 || old.v != 4 || strconv.FormatInt(old.at, 10) != now {
		t.Errorf("r-old's share = %+v, want it as the hash held it", *old)
	}
	if mine.v != 1 || mine.hold <= 0 {
		t.Errorf("the spender's share = %+v, want its first, holding some of the tokens", *mine)
	}
	if err := Check(ctx, c); err != nil {
		t.Errorf("Check after the rewrite = %v", err)
	}
}

// TestSharesGivenBackFromARecord: policyd_release_shares takes the
// caller's share out of a bucket's record, leaves the others, and creates
// no bucket where there is none.
func TestSharesGivenBackFromARecord(t *testing.T) {
	c, s := storeOnStandalone(t)
	ctx := context.Background()
	if _, err := s.SpendRetry(policy.SpendRequest{Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	n, err := s.lib.run(ctx, "policyd_release_shares", []string{keyBucket("acme")}, "r-other").Int()
	if err != nil || n != 0 {
		t.Fatalf("release of a share the bucket has not = %d, %v; want 0", n, err)
	}
	n, err = s.lib.run(ctx, "policyd_release_shares", []string{keyBucket("acme")}, s.id).Int()
	if err != nil || n != 4 {
		t.Fatalf("release of the spender's share = %d, %v; want 4 (its numbers)", n, err)
	}
	if r, ok, err := readBucket(ctx, c, "acme"); err != nil || !ok || len(r.shares) != 0 || r.granted != 1 {
		t.Errorf("after the release the bucket = %+v, %v, %v; want 1 granted and no share", r, ok, err)
	}
	if n, err := s.lib.run(ctx, "policyd_release_shares", []string{keyBucket("nobody")}, s.id).Int(); err != nil || n != 0 {
		t.Errorf("release from no bucket = %d, %v; want 0", n, err)
	}
	if c.Exists(ctx, keyBucket("nobody")).Val() != 0 {
		t.Error("a release made a bucket")
	}
}

// TestDecodeBucketRecord: the shares after the numbers, and what is not
// a record.
func TestDecodeBucketRecord(t *testing.T) {
	le := binary.LittleEndian
	v := le.AppendUint64(nil, math.Float64bits(2.5))
	for _, n := range []uint64{1700, 3, 1, 0} {
		v = le.AppendUint64(v, n)
	}
	v = append(v, 2, 'r', '1')
	for _, n := range []uint64{math.Float64bits(0.5), math.Float64bits(0.75), 9, 1800} {
		v = le.AppendUint64(v, n)
	}
	r, err := decodeBucketRecord(v)
	if err != nil {
		t.Fatal(err)
	}
	want := bucketShare{replica: "r1", hold: 0.5, lock: 0.75, v: 9, at: 1800}
	if r.tokens != 2.5 || r.last != 1700 || r.granted != 3 || r.refused != 1 || len(r.shares) != 1 || r.shares[0] != want {
		t.Errorf("decodeBucketRecord = %+v", r)
	}
	for _, bad := range [][]byte{v[:39], v[:41], v[:len(v)-1]} {
		if _, err := decodeBucketRecord(bad); err == nil || !strings.Contains(err.Error(), "bytes, a") {
			t.Errorf("decodeBucketRecord of %d bytes = %v, want it refused", len(bad), err)
		}
	}
}
