package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
)

// watchStream is one WatchBreakers stream of a test's watcher.
type watchStream struct {
	t      *testing.T
	stream pb.RetryPolicyService_WatchBreakersClient
	cancel context.CancelFunc
}

func watchFrom(t *testing.T, r *replica, tenant, token string) *watchStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := r.workers.WatchBreakers(ctx, &pb.WatchBreakersRequest{Tenant: tenant, ResumeToken: token})
	if err != nil {
		t.Fatalf("WatchBreakers: %v", err)
	}
	return &watchStream{t: t, stream: s, cancel: cancel}
}

// snapshot reads up to snapshot_complete and returns the snapshot's
// breakers (targets) and the snapshot_complete message.
func (w *watchStream) snapshot() ([]string, *pb.WatchBreakersResponse) {
	w.t.Helper()
	var targets []string
	for {
		msg, err := w.stream.Recv()
		if err != nil {
			w.t.Fatalf("WatchBreakers before snapshot_complete: %v", err)
		}
		if msg.GetSnapshotComplete() {
			return targets, msg
		}
		targets = append(targets, msg.GetBreaker().GetKey().GetTarget())
	}
}

// TestWatchResumesOnAnotherReplica: three replicas on one redis-server; a
// watcher follows tenant acme through replica 1 while replica 0 opens one
// breaker after another (x00, x01, ...). Replica 1 is killed; more
// breakers open while the watcher has no stream; it reconnects to replica
// 2 with the resume token of the last message it applied, while replica 0
// goes on. It sees every transition exactly once, in order: the replay of
// those it missed, then the live ones, and no snapshot.
func TestWatchResumesOnAnotherReplica(t *testing.T) {
	srv := redistest.Standalone(t)
	client := func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) }
	r := []*replica{newReplica(t, client), newReplica(t, client), newReplica(t, client)}
	ctx := context.Background()
	target := func(i int) string { return fmt.Sprintf("x%02d", i) }
	open := func(from, to int) {
		for i := from; i < to; i++ {
			if _, err := r[0].admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: target(i)},
				State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
				t.Errorf("ForceBreaker %s: %v", target(i), err)
				return
			}
		}
	}
	open(0, 1) // the tenant exists, with one breaker, before the watch

	w := watchFrom(t, r[1], "acme", "")
	snap, done := w.snapshot()
	if len(snap) != 1 || done.GetResumeToken() == "" || done.GetResumed() {
		t.Fatalf("first watch: snapshot %v, snapshot_complete %v; want [x00], a resume token, resumed false", snap, done)
	}
	token := done.GetResumeToken()
	var seen []string
	recv := func(w *watchStream, n int) {
		t.Helper()
		for range n {
			msg, err := w.stream.Recv()
			if err != nil {
				t.Fatalf("WatchBreakers after %v: %v", seen, err)
			}
			if msg.GetSnapshot() || msg.GetSnapshotComplete() {
				t.Fatalf("WatchBreakers after %v: %v; want a change", seen, msg)
			}
			if msg.GetResumeToken() == "" {
				t.Fatalf("change %v carries no resume token", msg)
			}
			seen = append(seen, msg.GetBreaker().GetKey().GetTarget())
			token = msg.GetResumeToken()
		}
	}
	open(1, 11)
	recv(w, 10)

	r[1].stop()
	if _, err := w.stream.Recv(); err == nil {
		t.Fatal("the stream of the killed replica goes on")
	}
	open(11, 21) // while the watcher has no stream

	w2 := watchFrom(t, r[2], "acme", token)
	finished := make(chan struct{})
	go func() { defer close(finished); open(21, 41) }() // while it resumes
	snap, done = w2.snapshot()
	if len(snap) != 0 || !done.GetResumed() || done.GetResumeToken() != token {
		t.Fatalf("resumed watch: snapshot %v, snapshot_complete %v; want no snapshot, resumed true, the token sent (%q)", snap, done, token)
	}
	recv(w2, 30)
	<-finished
	var want []string
	for i := 1; i < 41; i++ {
		want = append(want, target(i))
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("transitions seen across the two replicas:\n%v\nwant each once, in order:\n%v", seen, want)
	}
}

// TestWatchResumeRefused: a token of another tenant's watch or one that is
// not a token is INVALID_ARGUMENT naming resume_token; a token past which
// the stream was trimmed gives a full snapshot, resumed false.
func TestWatchResumeRefused(t *testing.T) {
	srv := redistest.Standalone(t)
	client := func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) }
	r := newReplica(t, client)
	ctx := context.Background()
	for _, tg := range []string{"a", "b"} {
		if _, err := r.admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: tg},
			State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
			t.Fatal(err)
		}
	}
	_, done := watchFrom(t, r, "acme", "").snapshot()
	token := done.GetResumeToken()
	_, other := watchFrom(t, r, "other", "").snapshot()

	for name, tok := range map[string]string{"another tenant's": other.GetResumeToken(), "not a token": "garbage"} {
		s := watchFrom(t, r, "acme", tok)
		_, err := s.stream.Recv()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "resume_token") {
			t.Errorf("%s token: %v, want INVALID_ARGUMENT naming resume_token", name, err)
		}
	}

	// Trimmed past the token: every entry of acme's stream deleted.
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = raw.Close() })
	if _, err := r.admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "c"},
		State: pb.BreakerState_BREAKER_STATE_OPEN}); err != nil {
		t.Fatal(err)
	}
	if err := raw.XTrimMaxLen(ctx, "{=acme}:events", 0).Err(); err != nil {
		t.Fatal(err)
	}
	snap, done := watchFrom(t, r, "acme", token).snapshot()
	if done.GetResumed() || len(snap) != 3 {
		t.Errorf("token past a trim: snapshot %v, resumed %v; want the full snapshot (a, b, c), resumed false", snap, done.GetResumed())
	}
}
