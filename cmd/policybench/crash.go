package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// crashConfig is what `policybench crash` is told by its flags.
type crashConfig struct {
	Duration      time.Duration
	FlushInterval time.Duration
	Sync          string
	MinUptime     time.Duration
	MaxUptime     time.Duration
	Slack         time.Duration
	Policyd       string
	Seed          uint64
	Keep          bool
}

func crashCmd() *cobra.Command {
	var cfg crashConfig
	cmd := &cobra.Command{
		Use:   "crash",
		Short: "SIGKILL policyd under load again and again, and verify its file after every restart",
		Long: `crash builds policyd, starts it on a temporary file, and for --duration
repeatedly: drives load (the sweep's mix), admin writes (budgets, policies,
budget deletions, breakers forced OPEN), breakers tripped OPEN by failures,
and retries that spend a tenant's budget; SIGKILLs the daemon at a random
moment; runs 'policyd check' on the file; restarts it on the same file and
verifies:

  - every acknowledged admin write is there (and every acknowledged delete
    is gone);
  - every breaker forced or tripped OPEN (acknowledged) is still OPEN;
  - the spending tenant's tokens were not refunded beyond what the last
    --flush-interval (plus --slack for the commit itself and the calls in
    flight) could lose;
  - the loss bound: no answer acknowledged more than --flush-interval plus
    --slack (the one commit in progress) before the kill was lost. The age
    of the oldest acknowledged answer whose spend was lost is measured at
    every kill (from the levels the grants reported and the tokens found
    after the restart) and the largest is printed.

It prints a summary and exits non-zero on any violation.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCrash(cmd.Context(), cfg, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.DurationVar(&cfg.Duration, "duration", 60*time.Second, "how long to keep killing")
	f.DurationVar(&cfg.FlushInterval, "flush-interval", 100*time.Millisecond, "policyd's --flush-interval")
	f.StringVar(&cfg.Sync, "sync", "group", "policyd's --sync")
	f.DurationVar(&cfg.MinUptime, "min-uptime", 300*time.Millisecond, "least time the daemon serves before a kill")
	f.DurationVar(&cfg.MaxUptime, "max-uptime", 2*time.Second, "most time the daemon serves before a kill")
	f.DurationVar(&cfg.Slack, "slack", 50*time.Millisecond, "allowance beyond --flush-interval for the one group commit in progress at the kill: the documented loss bound is --flush-interval plus one commit")
	f.StringVar(&cfg.Policyd, "policyd", "", "policyd binary (default: go build ./cmd/policyd)")
	f.Uint64Var(&cfg.Seed, "seed", uint64(time.Now().UnixNano()), "seed of the kill times and the load")
	f.BoolVar(&cfg.Keep, "keep", false, "keep the temporary directory (the state file) at the end")
	return cmd
}

// crashModel is what the daemon acknowledged, to be found after a restart.
type crashModel struct {
	mu       sync.Mutex
	seq      int
	budgets  map[string]float64 // tenant -> capacity, acknowledged
	deleted  map[string]bool    // tenants whose budget deletion was acknowledged
	policies map[string]uint32  // target -> max_attempts (tenant crash-p), acknowledged
	open     map[string]bool    // keys "tenant\x00target" acknowledged OPEN (forced or tripped)
	forced   int
	tripped  int
	writes   int // acknowledged admin writes in total
	// degraded counts the answers flagged degraded (a Redis replica that
	// decided from its last known state): not acknowledged by the engine,
	// so neither their OPEN breakers nor their grants are in the model.
	degraded int

	// spending: tenant crash-spend's bucket never refills, so its tokens
	// only go down; lowest is the lowest level a granted retry reported.
	lowest  float64
	grants  []time.Time // acknowledgement times of grants since the restart
	granted int

	// acks are the grants since the restart with the level each reported,
	// and killAt when the kill was sent: after the restart, a grant whose
	// level is below the tokens found was acknowledged and then lost.
	acks   []grantAck
	killAt time.Time
}

// grantAck is one acknowledged grant: when the answer arrived and the
// tokens it reported left.
type grantAck struct {
	at        time.Time
	remaining float64
}

const (
	crashSpendTenant  = "crash-spend"
	crashPolicyTenant = "crash-p"
	crashForceTenant  = "crash-forced"
	crashTripTenant   = "crash-trip"
	crashSpendCap     = 1e7
)

func runCrash(ctx context.Context, cfg crashConfig, out io.Writer) error {
	if cfg.MinUptime <= 0 || cfg.MaxUptime < cfg.MinUptime {
		return errors.New("--min-uptime must be > 0 and <= --max-uptime")
	}
	dir, err := os.MkdirTemp("", "policybench-crash")
	if err != nil {
		return err
	}
	if !cfg.Keep {
		defer os.RemoveAll(dir)
	}
	bin, err := policydBinary(cfg.Policyd, dir)
	if err != nil {
		return err
	}
	db := dir + "/policyd.db"
	args := []string{"--sync", cfg.Sync, "--flush-interval", cfg.FlushInterval.String()}
	rng := rand.New(rand.NewPCG(cfg.Seed, 7))
	m := &crashModel{budgets: map[string]float64{}, deleted: map[string]bool{}, policies: map[string]uint32{},
		open: map[string]bool{}, lowest: crashSpendCap}
	var violations []string
	violate := func(format string, a ...any) {
		v := fmt.Sprintf(format, a...)
		violations = append(violations, v)
		fmt.Fprintln(out, "VIOLATION:", v)
	}
	var kills, checks, verifies, maxRefund, maxAllowed, lossKills int
	var lastRefund string
	var maxLoss, sumLoss time.Duration
	end := time.Now().Add(cfg.Duration)
	fmt.Fprintf(out, "crash: policyd --sync %s --flush-interval %s on %s; killing for %s (seed %d)\n",
		cfg.Sync, cfg.FlushInterval, db, cfg.Duration, cfg.Seed)
	for first := true; ; first = false {
		d, err := startDaemon(bin, db, args...)
		if err != nil {
			return fmt.Errorf("restart %d: %w", kills, err)
		}
		tok, err := d.token()
		if err != nil {
			d.kill()
			return err
		}
		conn, err := dial(d.addr, "")
		if err != nil {
			d.kill()
			return err
		}
		aconn, err := dial(d.addr, tok)
		if err != nil {
			d.kill()
			return err
		}
		workers, admin := pb.NewRetryPolicyServiceClient(conn), pb.NewAdminServiceClient(aconn)
		if first {
			if err := crashSetup(ctx, admin); err != nil {
				d.kill()
				return err
			}
		} else {
			loss, lost := lossAge(ctx, m, admin)
			if lost {
				lossKills++
				maxLoss, sumLoss = max(maxLoss, loss), sumLoss+loss
				if bound := cfg.FlushInterval + cfg.Slack; loss > bound {
					violate("after kill %d an answer acknowledged %v before the kill was lost, more than the bound of %v (--flush-interval %v plus one commit, --slack %v)",
						kills, loss.Round(time.Millisecond), bound, cfg.FlushInterval, cfg.Slack)
				}
			}
			refund, allowed, err := verifyCrash(ctx, m, workers, admin, violate)
			if err != nil {
				d.kill()
				return fmt.Errorf("verify after kill %d: %w", kills, err)
			}
			verifies++
			if refund > maxRefund {
				maxRefund = refund
			}
			maxAllowed = max(maxAllowed, allowed)
			lastRefund = fmt.Sprintf("%d (allowed %d)", refund, allowed)
		}
		if time.Now().After(end) || ctx.Err() != nil {
			conn.Close()
			aconn.Close()
			if err := d.stop(); err != nil {
				violate("graceful stop at the end: %v", err)
			}
			if msg, err := runCheck(ctx, bin, db); err != nil {
				violate("policyd check after the final stop: %v: %s", err, msg)
			} else {
				checks++
			}
			break
		}

		lctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		run := func(f func(context.Context)) {
			wg.Add(1)
			go func() { defer wg.Done(); f(lctx) }()
		}
		run(func(ctx context.Context) { adminWriter(ctx, m, admin) })
		run(func(ctx context.Context) { tripper(ctx, m, workers) })
		for range spenders {
			run(func(ctx context.Context) { spender(ctx, m, workers) })
		}
		for i := range 8 {
			c := &caller{g: newGen(i, rng.Uint64()), on: new(atomic.Bool)}
			run(func(ctx context.Context) {
				for ctx.Err() == nil {
					mixLoop(ctx, c, workers)
				}
			})
		}
		uptime := cfg.MinUptime + time.Duration(rng.Int64N(int64(cfg.MaxUptime-cfg.MinUptime)+1))
		sleepCtx(ctx, uptime)
		killAt := time.Now()
		d.kill()
		cancel()
		wg.Wait()
		conn.Close()
		aconn.Close()
		kills++
		m.mu.Lock()
		m.grants = grantsAfter(m.grants, killAt.Add(-(cfg.FlushInterval + cfg.Slack)))
		m.killAt = killAt
		m.mu.Unlock()
		if msg, err := runCheck(ctx, bin, db); err != nil {
			violate("policyd check after kill %d: %v: %s", kills, err, msg)
		} else {
			checks++
		}
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	fmt.Fprintf(out, "\ncrash summary (sync=%s, flush-interval %s, %s):\n", cfg.Sync, cfg.FlushInterval, cfg.Duration)
	fmt.Fprintf(out, "  kills (SIGKILL under load):         %d, uptime %s..%s each\n", kills, cfg.MinUptime, cfg.MaxUptime)
	fmt.Fprintf(out, "  restarts verified:                  %d\n", verifies)
	fmt.Fprintf(out, "  admin writes acknowledged/verified: %d (budgets live %d, deletes %d, policies %d, forced OPEN %d)\n",
		m.writes, len(m.budgets), len(m.deleted), len(m.policies), m.forced)
	fmt.Fprintf(out, "  breakers OPEN verified:             %d (forced %d, tripped by failures %d)\n", len(m.open), m.forced, m.tripped)
	fmt.Fprintf(out, "  budget: retries granted %d; worst refund after a kill %d tokens (allowance that time up to %d); last %s\n",
		m.granted, maxRefund, maxAllowed, lastRefund)
	meanLoss := time.Duration(0)
	if lossKills > 0 {
		meanLoss = sumLoss / time.Duration(lossKills)
	}
	fmt.Fprintf(out, "  loss bound: oldest acknowledged answer lost %v before the kill (worst of %d kills that lost any; mean %v); documented bound --flush-interval + one commit, checked as %v + --slack %v = %v\n",
		maxLoss.Round(time.Millisecond), lossKills, meanLoss.Round(time.Millisecond), cfg.FlushInterval, cfg.Slack, cfg.FlushInterval+cfg.Slack)
	fmt.Fprintf(out, "  policyd check passed:               %d/%d\n", checks, kills+1)
	fmt.Fprintf(out, "  violations:                         %d\n", len(violations))
	if len(violations) > 0 {
		return fmt.Errorf("%d violations", len(violations))
	}
	return nil
}

// grantsAfter keeps the grant times after t.
func grantsAfter(gs []time.Time, t time.Time) []time.Time {
	i := sort.Search(len(gs), func(i int) bool { return gs[i].After(t) })
	return append([]time.Time(nil), gs[i:]...)
}

// crashSetup writes, once, the budget that is spent and the policies of
// the tenants whose breakers trip or spend; a write refused UNAVAILABLE
// (a replica's engine counted down for a moment) is sent again.
func crashSetup(ctx context.Context, admin pb.AdminServiceClient) error {
	if err := setupWorkload(ctx, admin); err != nil {
		return err
	}
	// A zero deposit ratio or floor means the default (0.2, 5/s): the
	// smallest positive ones keep the bucket from refilling, so the tokens
	// found after a restart are what the file kept.
	if err := retryUnavailable(ctx, func(ctx context.Context) error {
		_, err := admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{
			Tenant: crashSpendTenant, Capacity: crashSpendCap, DepositRatio: 1e-12, MinRetriesPerSecond: 1e-12}})
		return err
	}); err != nil {
		return fmt.Errorf("budget %s: %w", crashSpendTenant, err)
	}
	// The spender's breaker must never trip: failure-rate mode that never
	// has enough calls.
	minCalls := uint32(4_000_000_000)
	if err := retryUnavailable(ctx, func(ctx context.Context) error {
		_, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: crashSpendTenant, Policy: &pb.Policy{
			Breaker: &pb.BreakerSettings{Mode: pb.BreakerMode_BREAKER_MODE_FAILURE_RATE, MinCalls: &minCalls}}})
		return err
	}); err != nil {
		return fmt.Errorf("policy %s: %w", crashSpendTenant, err)
	}
	// Tripped breakers stay OPEN for an hour, longer than any crash run.
	five := uint32(5)
	if err := retryUnavailable(ctx, func(ctx context.Context) error {
		_, err := admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: crashTripTenant, Policy: &pb.Policy{
			Breaker: &pb.BreakerSettings{ConsecutiveFailures: &five, Cooldown: durationpb.New(time.Hour)}}})
		return err
	}); err != nil {
		return fmt.Errorf("policy %s: %w", crashTripTenant, err)
	}
	return nil
}

// adminWriter writes until ctx ends (the kill), recording each write once
// it is acknowledged. Every write names a new key, so a write cut by the
// kill leaves nothing to check either way; a deletion is taken out of the
// model before it is sent.
func adminWriter(ctx context.Context, m *crashModel, admin pb.AdminServiceClient) {
	for ctx.Err() == nil {
		m.mu.Lock()
		m.seq++
		n := m.seq
		m.mu.Unlock()
		var err error
		switch k := n % 10; {
		case k < 5:
			t := fmt.Sprintf("cw-%06d", n)
			capacity := float64(n + 1)
			_, err = admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: t, Capacity: capacity}})
			if err == nil {
				m.mu.Lock()
				m.budgets[t], m.writes = capacity, m.writes+1
				m.mu.Unlock()
			}
		case k < 8:
			target := fmt.Sprintf("p-%06d", n)
			attempts := uint32(1 + n%100)
			_, err = admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: crashPolicyTenant, Target: target, Policy: &pb.Policy{MaxAttempts: &attempts}})
			if err == nil {
				m.mu.Lock()
				m.policies[target], m.writes = attempts, m.writes+1
				m.mu.Unlock()
			}
		case k == 8:
			m.mu.Lock()
			var victim string
			for t := range m.budgets { // map order is random enough
				victim = t
				break
			}
			delete(m.budgets, victim)
			m.mu.Unlock()
			if victim == "" {
				continue
			}
			_, err = admin.DeleteTenantBudget(ctx, &pb.DeleteTenantBudgetRequest{Tenant: victim})
			if err == nil {
				m.mu.Lock()
				m.deleted[victim], m.writes = true, m.writes+1
				m.mu.Unlock()
			}
		default:
			target := fmt.Sprintf("f-%06d", n)
			var resp *pb.ForceBreakerResponse
			resp, err = admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{
				Key: &pb.BreakerKey{Tenant: crashForceTenant, Target: target}, State: pb.BreakerState_BREAKER_STATE_OPEN})
			if err == nil && resp.GetBreaker().GetState() == pb.BreakerState_BREAKER_STATE_OPEN {
				m.mu.Lock()
				m.open[crashForceTenant+"\x00"+target], m.writes, m.forced = true, m.writes+1, m.forced+1
				m.mu.Unlock()
			}
		}
		if err != nil {
			if status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled && ctx.Err() == nil {
				fmt.Fprintln(os.Stderr, "crash: admin write:", err)
			}
			return
		}
	}
}

// tripper opens one new breaker after another with transient failures,
// recording each once a NextDelay answer says it is OPEN. Each failure is
// a call of its own: policyd decides a repeated attempt of one call once,
// and counts its failure once.
func tripper(ctx context.Context, m *crashModel, workers pb.RetryPolicyServiceClient) {
	for ctx.Err() == nil {
		m.mu.Lock()
		m.seq++
		target := fmt.Sprintf("t-%06d", m.seq)
		m.mu.Unlock()
		for i := 1; i <= 5; i++ {
			resp, err := workers.NextDelay(ctx, &pb.NextDelayRequest{
				Call:    &pb.CallRef{Tenant: crashTripTenant, Target: target, CallId: fmt.Sprint(target, "-", i), Idempotent: true},
				Attempt: 1, Failure: httpFailure(503)})
			if err != nil {
				return
			}
			if resp.GetDegraded() {
				m.mu.Lock()
				m.degraded++
				m.mu.Unlock()
				break
			}
			if resp.GetBreakerState() == pb.BreakerState_BREAKER_STATE_OPEN {
				m.mu.Lock()
				m.open[crashTripTenant+"\x00"+target], m.tripped = true, m.tripped+1
				m.mu.Unlock()
				break
			}
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

// spender asks for retries of the spending tenant, whose bucket never
// refills, noting the lowest level reported and when each grant was
// acknowledged.
func spender(ctx context.Context, m *crashModel, workers pb.RetryPolicyServiceClient) {
	for i := 0; ctx.Err() == nil; i++ {
		resp, err := workers.NextDelay(ctx, &pb.NextDelayRequest{
			Call:    &pb.CallRef{Tenant: crashSpendTenant, Target: "spend", CallId: fmt.Sprint("s", i), Idempotent: true},
			Attempt: 1, Failure: httpFailure(503)})
		if err != nil {
			return
		}
		if resp.GetDegraded() {
			m.mu.Lock()
			m.degraded++
			m.mu.Unlock()
			continue
		}
		if resp.GetDecision() == pb.Decision_DECISION_RETRY {
			now := time.Now()
			m.mu.Lock()
			m.granted++
			m.grants = append(m.grants, now)
			m.acks = append(m.acks, grantAck{now, resp.GetTenantBudgetRemaining()})
			m.lowest = min(m.lowest, resp.GetTenantBudgetRemaining())
			m.mu.Unlock()
		}
	}
}

// lossAge reads the spending tenant's tokens after a restart and returns
// the age, at the kill, of the oldest acknowledged grant they do not
// account for: its answer reported fewer tokens left than were found, so
// its spend never reached the disk. lost is false when no acknowledged
// grant was lost. It clears the acknowledgements for the next round.
func lossAge(ctx context.Context, m *crashModel, admin pb.AdminServiceClient) (age time.Duration, lost bool) {
	st, err := admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: crashSpendTenant})
	m.mu.Lock()
	defer m.mu.Unlock()
	acks := m.acks
	m.acks = nil
	if err != nil {
		return 0, false
	}
	tokens := st.GetStatus().GetTokens()
	for _, a := range acks { // in order of arrival
		if a.remaining < tokens-0.5 {
			return m.killAt.Sub(a.at), true
		}
	}
	return 0, false
}

// spenders is the number of spender goroutines: at most that many grants
// can be in flight, applied but not acknowledged, at a kill.
const spenders = 4

// verifyCrash checks the restarted daemon against the model. It returns
// the refund of the spending tenant's tokens and what was allowed.
func verifyCrash(ctx context.Context, m *crashModel, workers pb.RetryPolicyServiceClient, admin pb.AdminServiceClient,
	violate func(string, ...any)) (refund, allowed int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// Budgets: every acknowledged one present with its capacity; every
	// acknowledged deletion absent.
	present := map[string]float64{}
	for tok := ""; ; {
		resp, err := admin.ListTenantBudgets(ctx, &pb.ListTenantBudgetsRequest{PageSize: 1000, PageToken: tok})
		if err != nil {
			return 0, 0, err
		}
		for _, b := range resp.GetBudgets() {
			present[b.GetBudget().GetTenant()] = b.GetBudget().GetCapacity()
		}
		if tok = resp.GetNextPageToken(); tok == "" {
			break
		}
	}
	for t, c := range m.budgets {
		if got, ok := present[t]; !ok || got != c {
			violate("acknowledged budget %s (capacity %v) missing after restart (found %v, %v)", t, c, got, ok)
		}
	}
	for t := range m.deleted {
		if _, ok := present[t]; ok {
			violate("acknowledged deletion of budget %s undone after restart", t)
		}
	}
	// Policies.
	policies := map[string]uint32{}
	for tok := ""; ; {
		resp, err := admin.ListPolicies(ctx, &pb.ListPoliciesRequest{PageSize: 1000, PageToken: tok})
		if err != nil {
			return 0, 0, err
		}
		for _, e := range resp.GetEntries() {
			if e.GetTenant() == crashPolicyTenant {
				policies[e.GetTarget()] = e.GetPolicy().GetMaxAttempts()
			}
		}
		if tok = resp.GetNextPageToken(); tok == "" {
			break
		}
	}
	for t, a := range m.policies {
		if got, ok := policies[t]; !ok || got != a {
			violate("acknowledged policy %s/%s (max_attempts %d) missing after restart (found %d, %v)", crashPolicyTenant, t, a, got, ok)
		}
	}
	// Breakers acknowledged OPEN are OPEN.
	open := map[string]bool{}
	for _, tenant := range []string{crashForceTenant, crashTripTenant} {
		for tok := ""; ; {
			resp, err := admin.ListBreakers(ctx, &pb.ListBreakersRequest{Tenant: tenant,
				State: pb.BreakerState_BREAKER_STATE_OPEN, PageSize: 1000, PageToken: tok})
			if err != nil {
				return 0, 0, err
			}
			for _, b := range resp.GetBreakers() {
				open[b.GetKey().GetTenant()+"\x00"+b.GetKey().GetTarget()] = true
			}
			if tok = resp.GetNextPageToken(); tok == "" {
				break
			}
		}
	}
	for k := range m.open {
		if !open[k] {
			violate("breaker %q acknowledged OPEN is not OPEN after restart", k)
		}
	}
	// Tokens: at most the grants acknowledged within the last flush
	// interval (plus slack) before the kill, and those in flight, may have
	// been lost.
	st, err := admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: crashSpendTenant})
	if err != nil {
		return 0, 0, err
	}
	tokens := st.GetStatus().GetTokens()
	refund = int(tokens - m.lowest + 0.5)
	allowed = len(m.grants) + spenders
	if refund > allowed {
		violate("tenant %s: %d tokens refunded after the kill, more than the %d grants of the last flush interval and in flight (tokens %v, lowest acknowledged %v)",
			crashSpendTenant, refund, allowed, tokens, m.lowest)
	}
	m.lowest, m.grants = tokens, nil
	return max(refund, 0), allowed, nil
}
