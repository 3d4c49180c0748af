package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/redisstore"
	"github.com/policyd/policyd/server/storetest"
)

// TestRateCeilingAcrossReplicas: three replicas on one Redis, telling
// time by one fake clock, race 48 workers a round for a rate ceiling of
// 8/s with a burst of 5 while the clock moves on by uneven steps: after
// every round the fleet has admitted at most t x rate + burst over the
// span t since the first, and exactly as many as one GCRA account
// (fleet.Rate) admits for the same 48 requests a round: three replicas
// keep one ceiling, not three.
func TestRateCeilingAcrossReplicas(t *testing.T) {
	srv := redistest.Standalone(t)
	clock := storetest.NewClock()
	var f []*redisstore.Store
	for range 3 {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		s, err := redisstore.Open(context.Background(), redisstore.Options{Client: c, Clock: clock.Now, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		f = append(f, s)
	}
	const rate, burst = 8.0, 5
	p := policy.Default()
	p.Flow.MaxRate, p.Flow.Burst = rate, burst
	lim := p.FlowLimits()
	key := policy.BreakerKey{Tenant: "acme", Target: "funder"}
	start := clock.Now()
	var admitted atomic.Int64
	var one fleet.Rate // the reference: one account
	want := 0
	steps := []time.Duration{0, 90 * time.Millisecond, 310 * time.Millisecond, time.Second, 7 * time.Millisecond,
		2500 * time.Millisecond, 143 * time.Millisecond, 142 * time.Millisecond, 4 * time.Second, 999 * time.Millisecond}
	for round, step := range steps {
		clock.Advance(step)
		for range 48 {
			if ok, _, _ := one.Take(clock.Now().UnixNano(), int64(lim.Interval), lim.Burst); ok {
				want++
			}
		}
		var wg sync.WaitGroup
		for w := range 48 {
			wg.Go(func() {
				a, err := f[w%3].AdmitFlow(key, policy.BreakerConfig{}, lim)
				switch {
				case err != nil:
					t.Errorf("AdmitFlow = %v", err)
				case a.Admitted:
					admitted.Add(1)
				case a.Reason != fleet.ReasonRate || a.RetryAfter <= 0:
					t.Errorf("refused %+v, want %s with a wait", a, fleet.ReasonRate)
				}
			})
		}
		wg.Wait()
		span := clock.Now().Sub(start).Seconds()
		if n, most := admitted.Load(), span*rate+burst; float64(n) > most {
			t.Fatalf("round %d: %d admitted over %.3fs, more than t x rate + burst = %.2f", round, n, span, most)
		}
		if n := admitted.Load(); n != int64(want) {
			t.Fatalf("round %d: the replicas admitted %d in all, one GCRA account %d", round, n, want)
		}
	}
	span := clock.Now().Sub(start).Seconds()
	t.Logf("%d admitted over %.3fs at %v/s with a burst of %d (bound t x rate + burst = %.2f)", admitted.Load(), span, rate, burst, span*rate+burst)
}

// TestCeilingDegradedShare: while Redis is stopped (SIGSTOP), each of two
// replicas admits its share of a ceiling of 9, ceil(9 / 2) = 5 leases,
// every answer flagged degraded, the sixth refused concurrency:full; a
// lease of its share comes back to it. Once Redis answers again the
// engine decides: its own leases count, not the shares.
func TestCeilingDegradedShare(t *testing.T) {
	srv := redistest.Standalone(t)
	r := boundedPair(t, srv.Addr)
	key := policy.BreakerKey{Tenant: "acme", Target: "portal"}
	lim := policy.FlowLimits{Ceiling: 9, LeaseTTL: time.Minute, FullWait: time.Second}
	var engine []string // leases the engine handed out
	for range 3 {
		a, err := r[0].store.AdmitFlow(key, policy.BreakerConfig{}, lim)
		if err != nil || !a.Admitted || a.Degraded {
			t.Fatalf("AdmitFlow before the pause = %+v, %v; want admitted, not degraded", a, err)
		}
		engine = append(engine, a.LeaseID)
	}
	srv.Pause(t)
	for i := range r {
		eventually(t, "the engine down on replica "+strconv.Itoa(i), func() bool {
			_, _ = r[i].store.AdmitFlow(policy.BreakerKey{Tenant: "acme", Target: "probe"}, policy.BreakerConfig{}, lim)
			return !r[i].store.Up()
		})
	}
	for i := range r {
		var leases []string
		for n := range 6 {
			a, err := r[i].store.AdmitFlow(key, policy.BreakerConfig{}, lim)
			if err != nil || !a.Degraded {
				t.Fatalf("replica %d: AdmitFlow while Redis is stopped = %+v, %v; want an answer flagged degraded", i, a, err)
			}
			switch {
			case n < 5 && (!a.Admitted || a.LeaseID == ""):
				t.Fatalf("replica %d: lease %d of its share of 5: %+v, want admitted with a lease", i, n+1, a)
			case n == 5 && (a.Admitted || a.Reason != fleet.ReasonFull):
				t.Fatalf("replica %d: past its share: %+v, want refused %s", i, a, fleet.ReasonFull)
			}
			leases = append(leases, a.LeaseID)
		}
		if held, err := r[i].store.ReleaseLease(key, leases[0], lim, policy.SignalNone); err != nil || !held {
			t.Errorf("replica %d: ReleaseLease of a lease of its share = %v, %v; want held", i, held, err)
		}
		if held, err := r[i].store.ReleaseLease(key, engine[0], lim, policy.SignalNone); err != nil || held {
			t.Errorf("replica %d: ReleaseLease of the engine's lease while down = %v, %v; want not held here, no error", i, held, err)
		}
		if a, err := r[i].store.AdmitFlow(key, policy.BreakerConfig{}, lim); err != nil || !a.Admitted || !a.Degraded {
			t.Errorf("replica %d: AdmitFlow into the freed slot = %+v, %v; want admitted, degraded", i, a, err)
		}
	}
	srv.Resume(t)
	for i := range r {
		eventually(t, "the engine up on replica "+strconv.Itoa(i), r[i].store.Up)
	}
	for n := range 7 {
		a, err := r[1].store.AdmitFlow(key, policy.BreakerConfig{}, lim)
		if err != nil || a.Degraded {
			t.Fatalf("AdmitFlow after SIGCONT = %+v, %v; want the engine's answer", a, err)
		}
		if want := n < 6; a.Admitted != want {
			t.Fatalf("AdmitFlow %d after SIGCONT: admitted %v, want %v: the engine holds 3 leases of 9", n+1, a.Admitted, want)
		}
	}
}

// TestAdmitWithCeilingIsOneRoundTrip counts the Redis round trips of
// Admit and ReleaseLease over gRPC for a target with a concurrency and a
// rate ceiling, through three replicas: from the replicas' clients (a
// hook) and from the server's INFO commandstats (FCALL before and
// after). Each is one function call: the rate slot, the lease and the
// breaker's admission in one step.
func TestAdmitWithCeilingIsOneRoundTrip(t *testing.T) {
	srv := redistest.Standalone(t)
	oneRoundTrip(t, statsOf(t, srv.Addr), func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) })
}

// TestAdmitWithCeilingIsOneRoundTripCluster is the same on a Cluster of
// three masters.
func TestAdmitWithCeilingIsOneRoundTripCluster(t *testing.T) {
	addrs := redistest.Cluster(t)
	oneRoundTrip(t, statsOf(t, addrs...), func() redis.UniversalClient {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	})
}

func oneRoundTrip(t *testing.T, stats serverStats, client func() redis.UniversalClient) {
	r := []*replica{newReplica(t, client), newReplica(t, client), newReplica(t, client)}
	ctx := context.Background()
	ten, manyPerSecond, burst := uint32(10), 1e6, uint32(100)
	if _, err := r[0].admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: "portal", Policy: &pb.Policy{
		Flow: &pb.FlowSettings{MaxInFlight: &ten, MaxRate: &manyPerSecond, Burst: &burst}}}); err != nil {
		t.Fatalf("SetPolicy with ceilings = %v, want nil", err)
	}
	call := func(id string) *pb.CallRef {
		return &pb.CallRef{Tenant: "acme", Target: "portal", CallId: id, Idempotent: true}
	}
	for i := range r { // the first call of a replica follows the tenant's stream and reads the policy
		eventually(t, "replica "+strconv.Itoa(i)+" has the policy", func() bool {
			resp, err := r[i].workers.Admit(ctx, &pb.AdmitRequest{Call: call("warm"), Attempt: 1})
			if err != nil || resp.GetLeaseId() == "" {
				return false
			}
			_, err = r[i].workers.ReleaseLease(ctx, &pb.ReleaseLeaseRequest{Call: call("warm"), LeaseId: resp.GetLeaseId()})
			return err == nil
		})
		r[i].trips.take()
	}
	const admits = 300
	fcallLine := func() string { // the server's own account of FCALL: calls, total µs, µs per call
		var lines []string
		for _, c := range stats {
			info, err := c.Info(ctx, "commandstats").Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(info, "\n") {
				if strings.HasPrefix(l, "cmdstat_fcall:") {
					lines = append(lines, strings.TrimSpace(l))
				}
			}
		}
		return strings.Join(lines, "; ")
	}
	t.Logf("before: %s", fcallLine())
	before := stats.calls(t)
	for n := range admits {
		rp := r[n%3]
		resp, err := rp.workers.Admit(ctx, &pb.AdmitRequest{Call: call("c" + strconv.Itoa(n)), Attempt: 1})
		if err != nil || !resp.GetAdmitted() || resp.GetLeaseId() == "" {
			t.Fatalf("Admit %d = %v, %v; want admitted with a lease", n, resp, err)
		}
		if _, err := rp.workers.ReleaseLease(ctx, &pb.ReleaseLeaseRequest{Call: call("c" + strconv.Itoa(n)), LeaseId: resp.GetLeaseId()}); err != nil {
			t.Fatalf("ReleaseLease %d = %v", n, err)
		}
	}
	after := stats.calls(t)
	t.Logf("after: %s", fcallLine())
	trips, by := 0, map[string]int{}
	for _, rp := range r {
		n, m := rp.trips.take()
		trips += n
		for k, v := range m {
			by[k] += v
		}
	}
	fcalls := nonAuditFCalls(before, after)
	t.Logf("%d Admits and %d ReleaseLeases with a ceiling over 3 replicas: %d round trips from the replicas (%v), %d FCALLs on the server",
		admits, admits, trips, by, fcalls)
	if trips != 2*admits || by["fcall"] != 2*admits {
		t.Errorf("%d round trips (%v) for %d Admits and as many releases, want %d: one function call each", trips, by, admits, 2*admits)
	}
	if fcalls != 2*admits {
		t.Errorf("%d FCALLs on the server for %d Admits and as many releases, want %d", fcalls, admits, 2*admits)
	}

	// 64 concurrent Admits over the replicas, none released: the ceiling's
	// 10 get a lease, the 54 refused cost one call each too.
	before = stats.calls(t)
	var wg sync.WaitGroup
	var leased atomic.Int32
	for n := range 64 {
		wg.Go(func() {
			resp, err := r[n%3].workers.Admit(ctx, &pb.AdmitRequest{Call: call("r" + strconv.Itoa(n)), Attempt: 1})
			if err != nil {
				t.Errorf("Admit = %v", err)
			}
			if resp.GetAdmitted() {
				leased.Add(1)
			}
		})
	}
	wg.Wait()
	after = stats.calls(t)
	trips, by = 0, map[string]int{}
	for _, rp := range r {
		n, m := rp.trips.take()
		trips += n
		for k, v := range m {
			by[k] += v
		}
	}
	fcalls = nonAuditFCalls(before, after)
	t.Logf("64 concurrent Admits over 3 replicas at a ceiling of 10: %d leased, %d round trips from the replicas (%v), %d FCALLs on the server",
		leased.Load(), trips, by, fcalls)
	// A refused Admit is an audit record: those go in the replica's audit
	// flush (one policyd_audit call per tenant per FlushInterval, counted
	// apart), not in the Admit.
	// Every replica's GetBreaker shows the ceiling's leases (Pool).
	for i := range r {
		resp, err := r[i].admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "acme", Target: "portal"}})
		if err != nil || resp.GetBreaker().GetLeasesInFlight() != 10 {
			t.Errorf("GetBreaker on replica %d = %v, %v; want 10 leases in flight", i, resp, err)
		}
	}
	flushOnly := true
	for cmd := range by {
		flushOnly = flushOnly && cmd == "fcall"
	}
	if leased.Load() != 10 || by["fcall"] != 64 || fcalls != 64 || !flushOnly {
		t.Errorf("64 concurrent Admits: %d leased, %d round trips (%v), %d FCALLs; want 10 leased, one call per Admit besides the audit flushes",
			leased.Load(), trips, by, fcalls)
	}
}

// TestReportOutcomeReleasesItsLeasesInOneRoundTrip: the leases a
// ReportOutcome's outcomes give back (here eight, over four targets with
// ceilings) go to Redis in one round trip, a pipeline of the releases,
// not one a lease; every one is released.
func TestReportOutcomeReleasesItsLeasesInOneRoundTrip(t *testing.T) {
	srv := redistest.Standalone(t)
	r := newReplica(t, func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: srv.Addr}) })
	ctx := context.Background()
	ten := uint32(10)
	var outs []*pb.Outcome
	for i := range 8 {
		target := "geo-" + strconv.Itoa(i%4)
		if i < 4 {
			if _, err := r.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Target: target,
				Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: &ten}}}); err != nil {
				t.Fatalf("SetPolicy(%s): %v", target, err)
			}
		}
		call := &pb.CallRef{Tenant: "acme", Target: target, CallId: "c" + strconv.Itoa(i), Idempotent: true}
		a, err := r.workers.Admit(ctx, &pb.AdmitRequest{Call: call, Attempt: 1})
		if err != nil || a.GetLeaseId() == "" {
			t.Fatalf("Admit(%s) = %v, %v; want a lease", target, a, err)
		}
		outs = append(outs, &pb.Outcome{Call: call, Attempt: 1, Success: true, LeaseId: a.GetLeaseId(),
			FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED})
	}
	before := r.store.RoundTrips()
	if _, err := r.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: outs}); err != nil {
		t.Fatalf("ReportOutcome: %v", err)
	}
	after := r.store.RoundTrips()
	if n := after["policyd_release_lease"] - before["policyd_release_lease"] +
		after["pipeline policyd_release_lease"] - before["pipeline policyd_release_lease"]; n != 1 {
		t.Errorf("ReportOutcome of 8 outcomes holding leases: %d round trips of releases, want 1", n)
	}
	for i := range 4 {
		key := policy.BreakerKey{Tenant: "acme", Target: "geo-" + strconv.Itoa(i)}
		if ps, err := r.store.Pool(key); err != nil || ps.InFlight != 0 || ps.Stray != 0 {
			t.Errorf("pool of %s after the report = %+v, %v; want every lease released, none stray", key.Target, ps, err)
		}
	}
}
