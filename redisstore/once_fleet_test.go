package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// keyTwin is one idempotency record held both ways: in Redis through the
// library and as a fleet.KeyRecord, changed at the instant the server
// reports.
type keyTwin struct {
	t      *testing.T
	ref    policy.KeyRef
	v      fleet.KeyRecord
	exists bool
}

func TestKeyRecordMirrorsFleet(t *testing.T) {
	c := standalone(t)
	ctx := context.Background()
	w := &keyTwin{t: t, ref: policy.KeyRef{Tenant: "acme", Key: "doc-1"}}
	serverNow := func() time.Time {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return tm.Truncate(time.Microsecond)
	}
	claim := func(name string, lease, ttl time.Duration, dedupes bool) policy.KeyAnswer {
		t.Helper()
		base := serverNow()
		kc := policy.KeyClaim{LeaseUntil: base.Add(lease), Expires: base.Add(ttl), Dedupes: dedupes}
		id := newLeaseID()
		d := 0
		if dedupes {
			d = 1
		}
		r, err := keyClaimCall(ctx, lib{c: c}, w.ref, strconv.FormatUint(id, 16), kc.LeaseUntil.UnixMicro(), kc.Expires.UnixMicro(), d, 0)
		if err != nil || len(r) != 7 {
			t.Fatalf("%s: claim = %v, %v", name, r, err)
		}
		now, _ := toInt(r[0])
		st, _ := toInt(r[1])
		until, _ := toInt(r[3])
		after, _ := toInt(r[5])
		got := policy.KeyAnswer{State: policy.KeyState(st), LeaseUntil: fromUS(until), ResultRef: toString(r[4]),
			RetryAfter: time.Duration(after) * time.Microsecond, Reason: toString(r[6])}
		want, changed := w.v.Claim(w.exists, now*1000, id, &kc)
		w.exists = w.exists || changed
		if want.State == policy.KeyInFlight || want.State == policy.KeySucceeded || (want.State == policy.KeyUnknown && !dedupes) {
			want.LeaseUntil = time.Time{}
		}
		if !got.LeaseUntil.Equal(want.LeaseUntil) || got.State != want.State || got.ResultRef != want.ResultRef ||
			got.RetryAfter != want.RetryAfter || got.Reason != want.Reason {
			t.Errorf("%s: redis answers %+v, fleet %+v", name, got, want)
		}
		if took := toString(r[2]); (took != "") != (w.v.Lease == id) || (took != "" && took != strconv.FormatUint(id, 16)) {
			t.Errorf("%s: redis lease %q, fleet lease %x (drawn %x)", name, took, w.v.Lease, id)
		}
		w.compare(name, c)
		got.LeaseID = toString(r[2])
		return got
	}
	complete := func(name, lease string, o policy.KeyOutcome, result string) {
		t.Helper()
		_, err := lib{c: c}.fcall(ctx, "policyd_key_complete", []string{keyIdem(w.ref.Tenant, w.ref.Key), keyIdemIndex(w.ref.Tenant)},
			w.ref.Key, lease, int(o), result, 0)
		id, _ := strconv.ParseUint(lease, 16, 64)
		ferr := w.v.Complete(serverNow().UnixNano(), id, o, result, 0)
		if (err != nil) != (ferr != nil) || (ferr != nil && err != fleet.ErrLease) {
			t.Errorf("%s: redis %v, fleet %v", name, err, ferr)
		}
		w.compare(name, c)
	}
	a := claim("first claim", time.Minute, time.Hour, false)
	claim("second claim while leased", time.Minute, time.Hour, false)
	complete("complete with another lease", "beef", policy.KeyOutcomeSucceeded, "")
	complete("complete failed", a.LeaseID, policy.KeyOutcomeFailed, "")
	complete("complete again", a.LeaseID, policy.KeyOutcomeSucceeded, "x")
	a = claim("claim after a failure", 2*time.Millisecond, 2*time.Hour, false)
	waitServerPast(t, c, a.LeaseUntil.UnixMicro())
	claim("claim past the lease, upstream does not dedupe", time.Minute, time.Hour, false)
	claim("the same, again", time.Minute, time.Hour, false)
	a = claim("claim of unknown, upstream dedupes", time.Minute, time.Hour, true)
	complete("complete unknown", a.LeaseID, policy.KeyOutcomeUnknown, "")
	a = claim("retry of unknown", time.Minute, time.Hour, true)
	complete("complete succeeded", a.LeaseID, policy.KeyOutcomeSucceeded, "upstream-record-42")
	claim("claim of a success", time.Minute, 3*time.Hour, true)
}

// compare checks the record in Redis against the fleet value (times in
// µs there, ns here).
func (w *keyTwin) compare(name string, c redis.UniversalClient) {
	w.t.Helper()
	h, err := c.HGetAll(context.Background(), keyIdem(w.ref.Tenant, w.ref.Key)).Result()
	if err != nil {
		w.t.Fatal(err)
	}
	var lease uint64
	if h["lease"] != "" {
		lease, _ = strconv.ParseUint(h["lease"], 16, 64)
	}
	st, _ := strconv.Atoi(h["state"])
	until, _ := strconv.ParseInt(h["lease_until"], 10, 64)
	exp, _ := strconv.ParseInt(h["expires"], 10, 64)
	got := fleet.KeyRecord{State: policy.KeyState(st), Lease: lease, LeaseUntil: until * 1000, Expires: exp * 1000, Result: h["result"]}
	if got != w.v {
		w.t.Errorf("%s: redis holds %+v, fleet %+v", name, got, w.v)
	}
}

func TestCallNoteMirrorsFleet(t *testing.T) {
	c := standalone(t)
	ctx := context.Background()
	if err := c.HSet(ctx, keyRun("acme", "r1"), "pool", 10, "cutoff", time.Now().Add(time.Hour).UnixMicro(), "spent", 0).Err(); err != nil {
		t.Fatal(err)
	}
	at := func(s int) time.Time { return time.Unix(1_800_000_000+int64(s), 123456000) }
	table := fleet.NewCallTable(2)
	notes := []struct {
		call string
		n    policy.CallNote
	}{
		{"a", policy.CallNote{Target: "pay", TriageRef: "doc://1", Attempt: 1, Classification: "transient:503", Detail: "retry in 1s", Time: at(10)}},
		{"a", policy.CallNote{Attempt: 2, Classification: "transport:timeout", Detail: "retry in 2s", Time: at(12)}},
		{"a", policy.CallNote{Attempt: 1, Classification: "transient:502", Detail: "late note", Time: at(5)}},
		{"a", policy.CallNote{Attempt: 1, Detail: "stopped: deadline", Disposition: policy.DispositionDeadLetter, Stop: policy.StopDeadline, Time: at(13)}},
		{"a", policy.CallNote{Attempt: 1, Detail: "stopped: deadline", Disposition: policy.DispositionDeadLetter, Stop: policy.StopDeadline, Time: at(13)}},
		{"b", policy.CallNote{Target: "pay", Attempt: 1, Detail: "attempt succeeded", Disposition: policy.DispositionSucceeded}},
		{"b", policy.CallNote{Target: "pay2", TriageRef: "doc://2"}},
		{"c", policy.CallNote{Target: "beyond the cap", Attempt: 1}},
		{"d", policy.CallNote{Target: "beyond the cap", Attempt: 1}},
	}
	for i, s := range notes {
		p := pendingNote{tenant: "acme", run: "r1", call: s.call, n: s.n}
		got, err := lib{c: c}.run(ctx, "policyd_note_call", p.keys(), p.args(table.Cap)...).Int()
		if err != nil {
			t.Fatalf("note %d: %v", i, err)
		}
		_, changed := table.Note(s.call, &s.n)
		if (got == 1) != changed {
			t.Errorf("note %d: redis changed %d, fleet %v", i, got, changed)
		}
		h, err := c.HGetAll(ctx, keyCallTable("acme", "r1")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(h) != len(table.Calls) {
			t.Errorf("note %d: redis keeps %d calls, fleet %d", i, len(h), len(table.Calls))
		}
		for id, want := range table.Calls {
			rec, err := decodeCall(h[id])
			if err != nil {
				t.Fatalf("note %d: call %q: %v", i, id, err)
			}
			rec.First, rec.Last = rec.First*1000, rec.Last*1000
			if rec != *want {
				t.Errorf("note %d: call %q: redis %+v, fleet %+v", i, id, rec, *want)
			}
		}
		untracked, _ := c.HGet(ctx, keyRun("acme", "r1"), "calls_untracked").Uint64()
		if untracked != table.Untracked {
			t.Errorf("note %d: redis untracked %d, fleet %d", i, untracked, table.Untracked)
		}
	}
	p := pendingNote{tenant: "acme", run: "nope", call: "a"}
	if _, err := (lib{c: c}).run(ctx, "policyd_note_call", p.keys(), p.args(2)...).Result(); !redisNotFound(err) {
		t.Errorf("note of an unknown run = %v, want NOTFOUND", err)
	}
}
