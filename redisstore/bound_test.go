package redisstore_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/redisstore"
)

// deadlines is a go-redis hook that keeps the deadline of every call a
// request sends while armed (the feeds and the heartbeat left out).
type deadlines struct {
	mu    sync.Mutex
	armed bool
	seen  []time.Time
	names []string
}

func (d *deadlines) DialHook(next redis.DialHook) redis.DialHook { return next }

func (d *deadlines) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name != "xread" && name != "hello" && name != "client" {
			d.keep(ctx, callName(cmd))
		}
		return next(ctx, cmd)
	}
}

func (d *deadlines) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() != "zadd" && cmds[0].Name() != "hello" && cmds[0].Name() != "client" {
			d.keep(ctx, "pipeline "+callName(cmds[0]))
		}
		return next(ctx, cmds)
	}
}

func (d *deadlines) keep(ctx context.Context, name string) {
	dl, _ := ctx.Deadline()
	d.mu.Lock()
	if d.armed {
		d.seen, d.names = append(d.seen, dl), append(d.names, name)
	}
	d.mu.Unlock()
}

func (d *deadlines) arm() {
	d.mu.Lock()
	d.armed, d.seen, d.names = true, nil, nil
	d.mu.Unlock()
}

func (d *deadlines) take() ([]time.Time, []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed = false
	return d.seen, d.names
}

// hookedReplica is a replica of the Redis at addr whose client carries
// hook, with a store timeout of 250 ms that never counts the engine down
// (DownAfter): the moments before a replica does, when one call at a time
// goes to Redis.
func hookedReplica(t *testing.T, addr string, hook redis.Hook) *replica {
	return newReplicaWith(t, func() redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		c.AddHook(hook)
		return c
	}, redisstore.Options{Timeout: 250 * time.Millisecond, BatchOutcomes: true, FlushInterval: time.Hour, DownAfter: 1000})
}

// oneDeadline fails t unless the calls of one request (what), sent while
// Redis was stopped, were at least one and all bounded by the first's
// deadline.
func oneDeadline(t *testing.T, what string, seen []time.Time, names []string) {
	t.Helper()
	if len(seen) == 0 {
		t.Fatal(what + " with Redis stopped asked Redis nothing; want its first call sent")
	}
	for i, dl := range seen {
		if !dl.Equal(seen[0]) {
			t.Errorf("engine call %d of %d of one %s (%s) bounded %v after the first (%s): want every call of a request under one deadline",
				i+1, len(seen), what, names[i], dl.Sub(seen[0]), names[0])
		}
	}
}

// callName is the function an FCALL or FCALL_RO calls, else the command.
func callName(cmd redis.Cmder) string {
	if a := cmd.Args(); (cmd.Name() == "fcall" || cmd.Name() == "fcall_ro") && len(a) > 1 {
		if f, ok := a[1].(string); ok {
			return f
		}
	}
	return cmd.Name()
}

// TestDecisionCallsShareOneTimeout: the engine calls of one decision share
// one --store-timeout, from the request's Begin, so a decision that makes
// several (a call with a fallback chain, an attempt that held a
// concurrency lease) answers
// within the timeout when Redis stalls, not within one timeout per call.
// The replica never counts the engine down here (DownAfter), the moments
// before it does: while it is suspect one call at a time goes to Redis,
// and the same request's next call may be that one.
func TestDecisionCallsShareOneTimeout(t *testing.T) {
	ten := uint32(10)
	for _, tc := range []struct {
		name, target string
		fallback     *pb.FallbackSettings
		flow         *pb.FlowSettings
	}{
		{"fallback chain", "geo-a", &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1}, nil},
		{"lease", "geo", nil, &pb.FlowSettings{MaxInFlight: &ten}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Standalone(t)
			hook := &deadlines{}
			r := hookedReplica(t, srv.Addr, hook)
			ctx := context.Background()
			three := uint32(3)
			if _, err := r.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: tc.target, Policy: &pb.Policy{
				MaxAttempts: &three, Fallback: tc.fallback, Flow: tc.flow}}); err != nil {
				t.Fatalf("SetPolicy: %v", err)
			}
			fail := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}
			req := func(id string) *pb.NextDelayRequest {
				call := &pb.CallRef{Tenant: "acme", Target: tc.target, CallId: id, Idempotent: true}
				a, err := r.workers.Admit(ctx, &pb.AdmitRequest{Call: call, Attempt: 1})
				if err != nil || !a.GetAdmitted() || (tc.flow != nil) != (a.GetLeaseId() != "") {
					t.Fatalf("Admit(%s) = %v, %v; want admitted, with a lease under a ceiling", id, a, err)
				}
				return &pb.NextDelayRequest{Call: call, Attempt: 1, Failure: fail, LeaseId: a.GetLeaseId()}
			}
			eventually(t, "a NextDelay answered by the engine (a store call of 250ms may time out on a loaded machine)", func() bool {
				resp, err := r.workers.NextDelay(ctx, req("warm"))
				return err == nil && !resp.GetDegraded()
			})
			c1 := req("c1")
			srv.Pause(t)
			hook.arm()
			resp, err := r.workers.NextDelay(ctx, c1)
			seen, names := hook.take()
			if err != nil || !resp.GetDegraded() {
				t.Errorf("NextDelay with Redis stopped = %v, %v; want an answer flagged degraded", resp, err)
			}
			oneDeadline(t, "NextDelay", seen, names)
		})
	}
}

// TestAdmitChainCallsShareOneTimeout: an Admit that moves along a fallback
// chain (on_circuit_open past a full ceiling) asks each target's ceiling
// within one request's time, so with Redis stalled it answers within one
// --store-timeout, not one per target.
func TestAdmitChainCallsShareOneTimeout(t *testing.T) {
	srv := redistest.Standalone(t)
	hook := &deadlines{}
	r := hookedReplica(t, srv.Addr, hook)
	ctx := context.Background()
	one := uint32(1)
	for _, target := range []string{"geo-a", "geo-b", "geo-c"} {
		p := &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: &one}}
		if target == "geo-a" {
			p.Fallback = &pb.FallbackSettings{Targets: []string{"geo-b", "geo-c"}, OnCircuitOpen: true}
		}
		if _, err := r.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: target, Policy: p}); err != nil {
			t.Fatalf("SetPolicy(%s): %v", target, err)
		}
	}
	admit := func(id string) (*pb.AdmitResponse, error) {
		return r.workers.Admit(ctx, &pb.AdmitRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo-a", CallId: id, Idempotent: true}, Attempt: 1})
	}
	// A lease held on each target, by the engine.
	for i, want := range []string{"geo-a", "geo-b", "geo-c"} {
		a, err := admit("hold-" + want)
		if err != nil || !a.GetAdmitted() || a.GetTarget() != want || a.GetDegraded() {
			t.Fatalf("Admit %d = %v, %v; want admitted by the engine on %s", i+1, a, err, want)
		}
	}
	srv.Pause(t)
	// The first Admit takes geo-a's share of its ceiling in degraded
	// mode (ceil(1 / 1 live replica)), so the next one is refused there,
	// movably, and moves on to geo-b.
	if a, err := admit("c1"); err != nil || !a.GetAdmitted() || a.GetTarget() != "geo-a" || !a.GetDegraded() {
		t.Fatalf("Admit with Redis stopped = %v, %v; want geo-a's degraded share", a, err)
	}
	hook.arm()
	a, err := admit("c2")
	seen, names := hook.take()
	if err != nil || !a.GetDegraded() || a.GetTarget() != "geo-b" {
		t.Errorf("Admit with Redis stopped = %v, %v; want geo-b's answer, flagged degraded", a, err)
	}
	oneDeadline(t, "Admit", seen, names)
}

// TestSpentRequestSaysNothingOfTheEngine: a call whose request's time ran
// out before it was sent is not sent, and is not counted against Redis: a
// decision's several calls after one timeout are one failure, so the
// replica does not count the engine down sooner than DownAfter timeouts.
func TestSpentRequestSaysNothingOfTheEngine(t *testing.T) {
	srv := redistest.Standalone(t)
	r := newReplicaWith(t, func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	}, redisstore.Options{Timeout: 250 * time.Millisecond, BatchOutcomes: true, FlushInterval: time.Hour, DownAfter: 2, Heartbeat: time.Hour})
	ctx := context.Background()
	three := uint32(3)
	if _, err := r.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "geo-a", Policy: &pb.Policy{
		MaxAttempts: &three, Fallback: &pb.FallbackSettings{Targets: []string{"geo-b"}, AfterAttempts: 1}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	req := func(id string) *pb.NextDelayRequest {
		return &pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo-a", CallId: id, Idempotent: true},
			Attempt: 1, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}}
	}
	eventually(t, "a NextDelay answered by the engine (a store call of 250ms may time out on a loaded machine)", func() bool {
		resp, err := r.workers.NextDelay(ctx, req("warm"))
		return err == nil && !resp.GetDegraded()
	})
	downs := r.store.Downs()
	srv.Pause(t)
	resp, err := r.workers.NextDelay(ctx, req("c1"))
	if err != nil || !resp.GetDegraded() {
		t.Errorf("NextDelay with Redis stopped = %v, %v; want an answer flagged degraded", resp, err)
	}
	if n := r.store.Downs() - downs; n != 0 {
		t.Errorf("one NextDelay's calls with Redis stopped brought the engine down %d times; want none: one timeout is one failure of DownAfter 2", n)
	}
}

// TestReportOutcomeCallsShareOneTimeout: a ReportOutcome's engine calls
// (here the release of each outcome's lease, and the outcome batch)
// share one --store-timeout too, so with Redis stalled a batch of
// outcomes holding leases answers within it, not within one per lease.
func TestReportOutcomeCallsShareOneTimeout(t *testing.T) {
	srv := redistest.Standalone(t)
	hook := &deadlines{}
	r := hookedReplica(t, srv.Addr, hook)
	ctx := context.Background()
	ten := uint32(10)
	var outs []*pb.Outcome
	for i := range 3 {
		target := "geo-" + strconv.Itoa(i)
		if _, err := r.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: target,
			Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: &ten}}}); err != nil {
			t.Fatalf("SetPolicy(%s): %v", target, err)
		}
		call := &pb.CallRef{Tenant: "acme", Target: target, CallId: "c-" + target, Idempotent: true}
		a, err := r.workers.Admit(ctx, &pb.AdmitRequest{Call: call, Attempt: 1})
		if err != nil || a.GetLeaseId() == "" || a.GetDegraded() {
			t.Fatalf("Admit(%s) = %v, %v; want a lease from the engine", target, a, err)
		}
		outs = append(outs, &pb.Outcome{Call: call, Attempt: 1, Success: true, LeaseId: a.GetLeaseId(),
			FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED})
	}
	srv.Pause(t)
	hook.arm()
	resp, err := r.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: outs})
	seen, names := hook.take()
	if err != nil || resp.GetAccepted() != 3 {
		t.Errorf("ReportOutcome with Redis stopped = %v, %v; want its 3 outcomes accepted", resp, err)
	}
	oneDeadline(t, "ReportOutcome", seen, names)
}

// TestDeduplicatedOutcomeWithRedisStoppedIsUnavailable: a deduplicated
// success needs its idempotency key's record; with Redis stopped the
// record cannot be read, and ReportOutcome answers UNAVAILABLE (the
// client sends the batch again), not INVALID_ARGUMENT, which a client
// takes for a batch it must drop.
func TestDeduplicatedOutcomeWithRedisStoppedIsUnavailable(t *testing.T) {
	srv := redistest.Standalone(t)
	r := newReplicaWith(t, func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	}, redisstore.Options{Timeout: 250 * time.Millisecond, DownAfter: 1000})
	ctx := context.Background()
	call := &pb.CallRef{Tenant: "acme", Target: "pay", CallId: "doc-1", IdempotencyKey: "sha-1"}
	claim, err := r.workers.ClaimKey(ctx, &pb.ClaimKeyRequest{Call: call, Attempt: 1})
	if err != nil || claim.GetLeaseId() == "" {
		t.Fatalf("ClaimKey = %v, %v; want a lease", claim, err)
	}
	if _, err := r.workers.CompleteKey(ctx, &pb.CompleteKeyRequest{Tenant: "acme", IdempotencyKey: "sha-1",
		LeaseId: claim.GetLeaseId(), Outcome: pb.KeyOutcome_KEY_OUTCOME_SUCCEEDED}); err != nil {
		t.Fatalf("CompleteKey = %v", err)
	}
	dup := &pb.CallRef{Tenant: "acme", Target: "pay", CallId: "doc-1-again", IdempotencyKey: "sha-1"}
	srv.Pause(t)
	_, err = r.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: dup, Attempt: 1, Success: true,
		FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED, Deduplicated: true}}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ReportOutcome of a deduplicated success with Redis stopped = %v; want UNAVAILABLE", err)
	}
}
