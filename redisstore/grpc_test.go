package redisstore_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/redisstore"
	"github.com/policyd/policyd/server"
)

// replica is one policyd replica over a shared Redis: the real handlers on
// a redisstore.Store, reached through bufconn, with its round trips to
// Redis counted.
type replica struct {
	store   *redisstore.Store
	workers pb.RetryPolicyServiceClient
	admin   pb.AdminServiceClient
	trips   *tripCounter
	// stop ends the replica at once, as a kill would: its gRPC server
	// and its connections, then its store.
	stop func()
}

// tripCounter counts a client's round trips to Redis (a command, or a
// pipeline of them) and the commands by name, leaving out the feeds'
// XREADs and heartbeats, which run whether or not anyone calls, and the handshake of a
// new pooled connection (HELLO, CLIENT SETINFO), and the audit flushes'
// calls of policyd_audit, made by the flusher every FlushInterval
// whatever requests their records come from (the server's FCALL counts
// leave them out too: nonAuditFCalls).
type tripCounter struct {
	mu    sync.Mutex
	trips int
	cmds  map[string]int
}

func (c *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); !isAudit(cmd) && name != "xread" && name != "hello" && name != "client" {
			c.mu.Lock()
			c.trips++
			c.cmds[cmd.Name()]++
			c.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (c *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		counted := false
		for _, cmd := range cmds {
			// The heartbeat (zadd, zremrangebyscore, zrange) runs whether
			// or not anyone calls, as the feeds do.
			if name := cmd.Name(); !isAudit(cmd) && name != "hello" && name != "client" && name != "zadd" && name != "zremrangebyscore" && name != "zrange" {
				c.cmds[name]++
				counted = true
			}
		}
		if counted {
			c.trips++
		}
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

// nonAuditFCalls returns the FCALLs the server ran between the stats
// before and after, less the audit flushes' (each policyd_audit call runs
// one XTRIM, and nothing else does).
func nonAuditFCalls(before, after map[string]int64) int64 {
	return after["fcall"] - before["fcall"] - (after["xtrim"] - before["xtrim"])
}

// isAudit reports whether cmd is a call of policyd_audit.
func isAudit(cmd redis.Cmder) bool {
	a := cmd.Args()
	return cmd.Name() == "fcall" && len(a) > 1 && a[1] == "policyd_audit"
}

// take returns the round trips and commands since the last take.
func (c *tripCounter) take() (int, map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, m := c.trips, c.cmds
	c.trips, c.cmds = 0, map[string]int{}
	return n, m
}

func newReplica(t *testing.T, client func() redis.UniversalClient) *replica {
	t.Helper()
	return newReplicaWith(t, client, redisstore.Options{Timeout: 2 * time.Second})
}

// newReplicaWith is newReplica with the store's options opts (its Client
// set here).
func newReplicaWith(t *testing.T, client func() redis.UniversalClient, opts redisstore.Options) *replica {
	t.Helper()
	c := client()
	trips := &tripCounter{cmds: map[string]int{}}
	c.AddHook(trips)
	t.Cleanup(func() { _ = c.Close() })
	opts.Client = c
	st, err := redisstore.Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	gs := server.New(st, server.Config{})
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	stop := func() {
		gs.Stop()
		_ = conn.Close()
		_ = st.Close()
	}
	t.Cleanup(stop)
	return &replica{store: st, workers: pb.NewRetryPolicyServiceClient(conn), admin: pb.NewAdminServiceClient(conn), trips: trips, stop: stop}
}

// serverStats reads INFO commandstats of every server: calls per
// command, summed.
type serverStats []*redis.Client

func (ss serverStats) calls(t *testing.T) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, c := range ss {
		info, err := c.Info(context.Background(), "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
			if !ok {
				continue
			}
			n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			out[strings.TrimPrefix(name, "cmdstat_")] += n
		}
	}
	return out
}

func statsOf(t *testing.T, addrs ...string) serverStats {
	var ss serverStats
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { _ = c.Close() })
		ss = append(ss, c)
	}
	return ss
}

func TestReplicasOverGRPC(t *testing.T) {
	srv := redistest.Standalone(t)
	replicasOverGRPC(t, statsOf(t, srv.Addr), func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) })
}

func TestReplicasOverGRPCCluster(t *testing.T) {
	addrs := redistest.Cluster(t)
	replicasOverGRPC(t, statsOf(t, addrs...), func() redis.UniversalClient {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	})
}

// replicasOverGRPC runs three replicas over the Redis client makes, whose
// servers stats reads.
func replicasOverGRPC(t *testing.T, stats serverStats, client func() redis.UniversalClient) {
	r := []*replica{newReplica(t, client), newReplica(t, client), newReplica(t, client)}
	ctx := context.Background()
	two := uint32(2)
	if _, err := r[0].admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "pay", Policy: &pb.Policy{
		Breaker: &pb.BreakerSettings{ConsecutiveFailures: &two}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	call := func(id string) *pb.CallRef {
		return &pb.CallRef{Tenant: "acme", Target: "pay", CallId: id, Idempotent: true}
	}
	fail503 := &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}

	// Admit on a CLOSED breaker: no round trip once the replica knows it.
	if _, err := r[1].workers.Admit(ctx, &pb.AdmitRequest{Call: call("warm"), Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	r[1].trips.take()
	before := stats.calls(t)
	for i := range 1000 {
		resp, err := r[1].workers.Admit(ctx, &pb.AdmitRequest{Call: call("c" + strconv.Itoa(i)), Attempt: 1})
		if err != nil || !resp.GetAdmitted() {
			t.Fatalf("Admit = %v, %v; want admitted", resp, err)
		}
	}
	if n, by := r[1].trips.take(); n != 0 {
		t.Errorf("1000 Admits on a CLOSED breaker made %d round trips (%v), want 0", n, by)
	}
	if fc := nonAuditFCalls(before, stats.calls(t)); fc != 0 {
		t.Errorf("1000 Admits on a CLOSED breaker: %d FCALLs on the server, want 0", fc)
	}

	// A subscriber on replica 2 is told of a transition replica 0 makes.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch, err := r[2].workers.WatchBreakers(wctx, &pb.WatchBreakersRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := watch.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if msg.GetSnapshotComplete() {
			break
		}
	}

	// Replica 0 knows tenant acme already (it wrote the policy and
	// follows the tenant's stream from its first breaker call), so the
	// round trips counted are those of a NextDelay itself.
	if _, err := r[0].workers.Admit(ctx, &pb.AdmitRequest{Call: call("warm0"), Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	r[0].trips.take()
	before = stats.calls(t)
	resp, err := r[0].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("doc-1"), Attempt: 1, Failure: fail503})
	if err != nil || resp.GetDecision() != pb.Decision_DECISION_RETRY {
		t.Fatalf("NextDelay = %v, %v; want RETRY", resp, err)
	}
	n, by := r[0].trips.take()
	fc := nonAuditFCalls(before, stats.calls(t))
	t.Logf("one NextDelay (RETRY): %d round trips %v; FCALLs on the server: %d", n, by, fc)
	if n != 1 || by["fcall"] != 1 || fc != 1 {
		t.Errorf("one NextDelay (RETRY) took %d round trips %v (%d FCALLs on the server), want one function call", n, by, fc)
	}

	if _, err := r[1].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("doc-2"), Attempt: 1, Failure: fail503}); err != nil {
		t.Fatal(err)
	}
	msg, err := watch.Recv()
	if err != nil || msg.GetBreaker().GetState() != pb.BreakerState_BREAKER_STATE_OPEN {
		t.Fatalf("WatchBreakers on replica 2 = %v, %v; want OPEN", msg, err)
	}
	eventually(t, "replica 1 refusing once its cache has the OPEN state", func() bool {
		a, err := r[1].workers.Admit(ctx, &pb.AdmitRequest{Call: call("doc-3"), Attempt: 1})
		return err == nil && !a.GetAdmitted()
	})

	// One outcome batch of 100 outcomes of one tenant: one function call.
	req := &pb.ReportOutcomeRequest{}
	for i := range 100 {
		req.Outcomes = append(req.Outcomes, &pb.Outcome{Call: &pb.CallRef{Tenant: "acme", Target: "t" + strconv.Itoa(i%10),
			CallId: "o" + strconv.Itoa(i), Idempotent: true}, Attempt: 1, Success: true})
	}
	if _, err := r[2].workers.Admit(ctx, &pb.AdmitRequest{Call: call("warm2"), Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	r[2].trips.take()
	before = stats.calls(t)
	if _, err := r[2].workers.ReportOutcome(ctx, req); err != nil {
		t.Fatalf("ReportOutcome: %v", err)
	}
	n, by = r[2].trips.take()
	fc = nonAuditFCalls(before, stats.calls(t))
	t.Logf("one ReportOutcome of 100 outcomes: %d round trips %v; FCALLs on the server besides audit flushes: %d", n, by, fc)
	// The batch's audit records follow within the flush interval, in a
	// call of their own that may or may not land before take.
	if by["fcall"] != 1 || fc != 1 {
		t.Errorf("100 outcomes of one tenant took %d FCALLs (%d on the server), want 1", by["fcall"], fc)
	}
	// Their attempt statistics came with that call, and every replica
	// reads them.
	adv, err := r[1].admin.AdviseTargets(ctx, &pb.AdviseTargetsRequest{Tenant: "acme", Since: durationpb.New(time.Hour)})
	if err != nil {
		t.Fatalf("AdviseTargets: %v", err)
	}
	var counted uint64
	for _, a := range adv.GetAdvice() {
		if strings.HasPrefix(a.GetTarget(), "t") {
			counted += a.GetSuccessesByAttempt()[0]
		}
	}
	if counted != 100 {
		t.Errorf("AdviseTargets on replica 1 counts %d successes on attempt 1 of targets t0..t9, want 100: %v", counted, adv.GetAdvice())
	}

	// A STOP is one function call too; without Options.BatchOutcomes (the
	// daemon's --sync=always) the call's end is counted at once, in an
	// outcome batch of its own, else with the next flush
	// (TestNextDelayIsOneCall). Tenant beta, whose breaker never saw a
	// failure, so that acme's stays as it is.
	beta := &pb.CallRef{Tenant: "beta", Target: "pay", CallId: "last", Idempotent: true}
	if _, err := r[0].workers.Admit(ctx, &pb.AdmitRequest{Call: beta, Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	r[0].trips.take()
	stop, err := r[0].workers.NextDelay(ctx, &pb.NextDelayRequest{Call: beta, Attempt: 3, Failure: fail503})
	if err != nil || stop.GetDecision() != pb.Decision_DECISION_STOP {
		t.Fatalf("NextDelay(attempt 3) = %v, %v; want STOP", stop, err)
	}
	n, by = r[0].trips.take()
	t.Logf("one NextDelay (STOP): %d round trips %v", n, by)
	if n != 2 || by["fcall"] != 2 {
		t.Errorf("one NextDelay (STOP) took %d round trips %v, want 2 (the decision, the outcome batch with the count)", n, by)
	}

	// The audit trail of the fleet: doc-1's decision from replica 0 and
	// its outcome from replica 2, read on replica 1.
	if _, err := r[2].workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
		{Call: call("doc-1"), Attempt: 2, Success: true, FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}}}); err != nil {
		t.Fatalf("ReportOutcome: %v", err)
	}
	// A success that ends its call is one FINAL record.
	want := "AUDIT_EVENT_DECISION AUDIT_EVENT_FINAL"
	got := ""
	defer func() {
		if t.Failed() {
			t.Logf("QueryAudit(doc-1) on replica 1: %s", got)
		}
	}()
	eventually(t, "doc-1's records from replicas 0 and 2 on replica 1", func() bool {
		q, err := r[1].admin.QueryAudit(ctx, &pb.QueryAuditRequest{CallId: "doc-1"})
		if err != nil {
			t.Fatalf("QueryAudit: %v", err)
		}
		var events []string
		for _, rec := range q.GetRecords() {
			events = append(events, rec.GetEvent().String())
		}
		got = strings.Join(events, " ")
		return got == want
	})
}
