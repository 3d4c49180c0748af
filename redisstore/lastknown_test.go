package redisstore_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
)

// TestBreakersListedAsLastKnownWhileDown: while Redis does not answer,
// ListBreakers and GetBreaker answer from what the replica knows instead
// of UNAVAILABLE, each breaker flagged degraded: one forced OPEN before
// the pause, one CLOSED then, and one its local copy opened during it;
// the listing's filters and paging hold. Once Redis answers again the
// listing is the engine's, unflagged.
func TestBreakersListedAsLastKnownWhileDown(t *testing.T) {
	srv := redistest.Standalone(t)
	r := boundedReplica(t, srv.Addr)
	ctx := context.Background()
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	fail := func(tenant, target, id string) *pb.NextDelayResponse {
		t.Helper()
		resp, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: tenant, Target: target, CallId: id, Idempotent: true},
			Attempt: 1, Failure: fail503})
		if err != nil {
			t.Fatalf("NextDelay %s/%s: %v", tenant, target, err)
		}
		return resp
	}
	if _, err := r.admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "pay"},
		State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
		t.Fatal(err)
	}
	fail("acme", "geo", "geo-0")
	fail("globex", "mail", "mail-0")
	type row struct {
		key      string
		state    pb.BreakerState
		degraded bool
	}
	// rows leaves out acme/other, where r.until sends its NextDelays:
	// whether one of them is answered in degraded mode, and so known to
	// the replica while Redis is paused, depends on when the engine is
	// counted down (TestBreakersListedAsLastKnownWhileDown failed in CI
	// on a run where none was).
	rows := func(list []*pb.Breaker) []row {
		var out []row
		for _, b := range list {
			if key := b.GetKey().GetTenant() + "/" + b.GetKey().GetTarget(); key != "acme/other" {
				out = append(out, row{key, b.GetState(), b.GetDegraded()})
			}
		}
		return out
	}
	list := func(req *pb.ListBreakersRequest) []row {
		t.Helper()
		resp, err := r.admin.ListBreakers(ctx, req)
		if err != nil {
			t.Fatalf("ListBreakers %v: %v", req, err)
		}
		return rows(resp.GetBreakers())
	}
	const (
		open   = pb.BreakerState_BREAKER_STATE_OPEN
		closed = pb.BreakerState_BREAKER_STATE_CLOSED
	)
	if got, want := list(&pb.ListBreakersRequest{}), []row{{"acme/geo", closed, false}, {"acme/pay", open, false}, {"globex/mail", closed, false}}; !slices.Equal(got, want) {
		t.Fatalf("ListBreakers with Redis answering = %v, want %v", got, want)
	}

	srv.Pause(t)
	r.until(t, "the engine down", func() bool { return !r.store.Up() })
	// acme/geo's local copy opens: five failures in a row, one counted
	// before the pause.
	for i := 1; i < 5; i++ {
		if resp := fail("acme", "geo", "geo-"+strconv.Itoa(i)); !resp.GetDegraded() {
			t.Fatalf("NextDelay with the engine down = %v, not flagged degraded", resp)
		}
	}
	all := []row{{"acme/geo", open, true}, {"acme/pay", open, true}, {"globex/mail", closed, true}}
	if got := list(&pb.ListBreakersRequest{}); !slices.Equal(got, all) {
		t.Errorf("ListBreakers with the engine down = %v, want the last-known %v", got, all)
	}
	if got, want := list(&pb.ListBreakersRequest{Tenant: "acme", State: open}), all[:2]; !slices.Equal(got, want) {
		t.Errorf("ListBreakers of acme's OPEN breakers, engine down = %v, want %v", got, want)
	}
	var paged []row
	for token := ""; ; {
		resp, err := r.admin.ListBreakers(ctx, &pb.ListBreakersRequest{PageSize: 1, PageToken: token})
		if err != nil {
			t.Fatalf("ListBreakers page after %q, engine down: %v", token, err)
		}
		paged = append(paged, rows(resp.GetBreakers())...)
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	if !slices.Equal(paged, all) {
		t.Errorf("ListBreakers page by page, engine down = %v, want %v", paged, all)
	}
	got, err := r.admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "pay"}})
	if err != nil || got.GetBreaker().GetState() != open || !got.GetBreaker().GetForced() || !got.GetBreaker().GetDegraded() {
		t.Errorf("GetBreaker acme/pay, engine down = %v, %v; want forced OPEN, flagged degraded", got, err)
	}

	srv.Resume(t)
	r.until(t, "the engine up again", r.store.Up)
	for _, b := range list(&pb.ListBreakersRequest{}) {
		if b.degraded {
			t.Errorf("ListBreakers with Redis answering again lists %v flagged degraded", b)
		}
		if b.key == "acme/pay" && b.state != open {
			t.Errorf("ListBreakers with Redis answering again: acme/pay %v, want OPEN (forced)", b.state)
		}
	}
}

// TestLocalTransitionsWatched: a breaker the replica's local copy opens
// while Redis does not answer reaches the replica's WatchBreakers
// subscribers, flagged degraded and at the resume token they had (it is
// on no stream), so a client answering Admit from its watch stops
// sending first attempts there; once Redis answers again they are told
// the engine's state, unflagged.
func TestLocalTransitionsWatched(t *testing.T) {
	srv := redistest.Standalone(t)
	r := boundedReplica(t, srv.Addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	fail := func(target, id string) {
		t.Helper()
		if _, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: target, CallId: id, Idempotent: true},
			Attempt: 1, Failure: fail503}); err != nil {
			t.Fatalf("NextDelay acme/%s: %v", target, err)
		}
	}
	fail("geo", "geo-0")
	// Bounded: a change never told ends the watch, and the test, here.
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	watch, err := r.workers.WatchBreakers(wctx, &pb.WatchBreakersRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	var token string
	for {
		m, err := watch.Recv()
		if err != nil {
			t.Fatalf("WatchBreakers before its snapshot completed: %v", err)
		}
		if m.GetSnapshotComplete() {
			token = m.GetResumeToken()
			break
		}
	}
	// geo's next event: skips the other breakers' (acme/other opens
	// locally too, bringing the engine down).
	next := func(what string) *pb.WatchBreakersResponse {
		t.Helper()
		for {
			m, err := watch.Recv()
			if err != nil {
				t.Fatalf("WatchBreakers, waiting for %s: %v", what, err)
			}
			if m.GetBreaker().GetKey().GetTarget() == "geo" {
				return m
			}
		}
	}

	srv.Pause(t)
	r.until(t, "the engine down", func() bool { return !r.store.Up() })
	for i := 1; i < 5; i++ {
		fail("geo", "geo-"+strconv.Itoa(i))
	}
	m := next("acme/geo opened by the local copy")
	if b := m.GetBreaker(); b.GetState() != pb.BreakerState_BREAKER_STATE_OPEN || !b.GetDegraded() || m.GetResumeToken() != token {
		t.Errorf("watched with Redis stopped: %v; want acme/geo OPEN, degraded, at the resume token %q of before", m, token)
	}

	srv.Resume(t)
	r.until(t, "the engine up again", r.store.Up)
	m = next("acme/geo as the engine has it")
	if b := m.GetBreaker(); b.GetState() != pb.BreakerState_BREAKER_STATE_CLOSED || b.GetDegraded() {
		t.Errorf("watched once Redis answers again: %v; want acme/geo CLOSED as the engine has it, not degraded", m)
	}
}

// TestStopFromALocallyOpenedBreakerFlaggedDegraded: while Redis does not
// answer but the replica has not yet counted it down, each NextDelay's
// engine call times out and the replica's local copy of the breaker
// records the failure; once that copy opens, the CIRCUIT_OPEN stop it
// answers spends nothing, and is still an answer made without the engine,
// so it says so. (It was answered unflagged: the decision's breaker came
// from the local copy, but only a spend from the replica's shares flagged
// the answer.)
func TestStopFromALocallyOpenedBreakerFlaggedDegraded(t *testing.T) {
	srv := redistest.Standalone(t)
	// Never counted down in this test: every answer below is made while
	// the engine breaker still lets calls through, each ending at Timeout.
	r := boundedReplicaWith(t, srv.Addr, 1<<20)
	ctx := context.Background()
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
	fail := func(id string) *pb.NextDelayResponse {
		t.Helper()
		resp, err := r.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: id, Idempotent: true},
			Attempt: 1, Failure: fail503})
		if err != nil {
			t.Fatalf("NextDelay %s: %v", id, err)
		}
		return resp
	}
	// Spent through the engine: the replica holds a share of the bucket.
	if resp := fail("geo-0"); resp.GetDecision() != pb.Decision_DECISION_RETRY || resp.GetDegraded() {
		t.Fatalf("NextDelay with Redis answering = %v, want RETRY, not degraded", resp)
	}

	srv.Pause(t)
	defer srv.Resume(t)
	// Failures 2 to 5 in a row: retried from the replica's share, then
	// the fifth opens the local copy and stops.
	var resp *pb.NextDelayResponse
	for i := 1; i < 5; i++ {
		if resp = fail("geo-" + strconv.Itoa(i)); !resp.GetDegraded() {
			t.Errorf("NextDelay %d with Redis paused = %v, not flagged degraded", i, resp)
		}
	}
	if resp.GetStopReason() != pb.StopReason_STOP_REASON_CIRCUIT_OPEN || resp.GetBreakerState() != pb.BreakerState_BREAKER_STATE_OPEN {
		t.Errorf("NextDelay of the fifth failure in a row = %v, want STOP CIRCUIT_OPEN (the local copy opened)", resp)
	}
	if resp = fail("geo-5"); resp.GetStopReason() != pb.StopReason_STOP_REASON_CIRCUIT_OPEN || !resp.GetDegraded() {
		t.Errorf("NextDelay on the local copy opened = %v, want STOP CIRCUIT_OPEN, flagged degraded", resp)
	}
	if !r.store.Up() {
		t.Errorf("engine counted down with DownAfter %d: the test no longer covers answers made while it counts up", 1<<20)
	}
}
