package redisstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// NextDelayInOneCall is server.OneCallNextDelay.NextDelayInOneCall: st
// decided in one call of policyd_nextdelay on the tenant's slot (the
// attempt check, the breaker's record, the cool-down, fleet.GateRetry,
// the spend, fleet.Spent, fleet.CutRun and the attempt record, with its
// verdict), and no other round trip but, while this replica owes the
// engine what it granted alone from the tenant's tokens, their charge
// first (chargeOwed, as SpendRetry). ok is false, and the caller decides
// through Begin, while the engine is out of reach (degraded mode, which
// Begin's path keeps) and while the debt is left after its charge. Its
// calls are the request's, within u's time (Begin).
func (s *Store) NextDelayInOneCall(u Changes, st *policy.NextDelayStep) (policy.NextDelayResult, bool, error) {
	s = s.within(u)
	if err := s.check(); err != nil {
		return policy.NextDelayResult{}, true, err
	}
	if st.Result < policy.ResultSuccess || st.Result > policy.ResultPushback {
		return policy.NextDelayResult{}, true, invalid("result", "must be success, transient failure, terminal or pushback")
	}
	if err := checkBreakerKey(st.Key); err != nil {
		return policy.NextDelayResult{}, true, err
	}
	if err := checkName("call_id", st.Call.CallID, false); err != nil {
		return policy.NextDelayResult{}, true, err
	}
	tenant := st.Key.Tenant
	if st.Spend.RunID != "" {
		owner, err := s.runTenant(st.Spend.RunID)
		if err != nil {
			return policy.NextDelayResult{}, true, err
		}
		if owner != tenant || st.Call.Tenant != tenant {
			return policy.NextDelayResult{}, true, invalid("run_id", "the run belongs to another tenant")
		}
	}
	if st.Call.Tenant != tenant || st.Spend.Tenant != tenant {
		// One call decides on one tenant's slot.
		return policy.NextDelayResult{}, false, nil
	}
	if kept := s.down.get(st.Call); kept.Attempt > 0 {
		// This replica answered the call while the engine was down and has
		// not written the record yet: the same attempt replays it, a
		// lower one or any after its STOP is refused, without a round
		// trip (which could wait for an engine not back yet); a later
		// attempt is decided below.
		replay, err := kept.Check(s.opts.Clock().UnixNano(), st.Attempt)
		switch {
		case replay:
			return policy.NextDelayResult{Replay: true, Answer: kept.Answer}, true, nil
		case err != nil:
			return policy.NextDelayResult{}, true, err
		}
	}
	if !s.health.up() {
		return policy.NextDelayResult{}, false, nil
	}
	if s.degraded.owes(tenant, st.Spend.RunID) {
		// What this replica granted alone is charged first, as SpendRetry
		// does; then the one call decides. Left owing (the charge not
		// answered), the decision takes Begin's path.
		s.chargeOwed(tenant, st.Spend.RunID)
		if !s.health.up() || s.degraded.owes(tenant, st.Spend.RunID) {
			return policy.NextDelayResult{}, false, nil
		}
	}
	if p := enginePermit(st.PermitID, s.opts.Clock); p != st.PermitID {
		c := *st
		c.PermitID, st = p, &c
	}
	if _, err := s.follow(tenant); err != nil {
		if errors.Is(err, ErrUnavailable) {
			return policy.NextDelayResult{}, false, nil
		}
		return policy.NextDelayResult{}, true, fmt.Errorf("redisstore: follow tenant %q: %w", tenant, err)
	}
	cfg := fleet.NormConfig(st.Breaker)
	b, _ := s.budgetOf(tenant)
	ctx, cancel := s.call() // bounded from here: a wait for a flush in flight counts (heldOutcomes.rlock)
	defer cancel()
	var carried []result
	if s.opts.BatchOutcomes {
		// The breaker's results held for the flush go first, in this call,
		// as Record sends them: the breaker counts them before this
		// failure, as they were reported.
		if !s.held.rlock(ctx) {
			// Its time went waiting for a flush the engine did not
			// answer: decided in degraded mode, the held results left to
			// the flush.
			res, err := s.degradedNextDelay(st, &cfg)
			return res, true, err
		}
		defer s.held.runlock()
		carried = s.takeResults(st.Key)
	}
	sa := s.degraded.shareArgs(s.id, tenant, st.Spend.RunID, shareGrace*s.opts.Heartbeat)
	keys, args := nextDelayCall(st, &cfg, &b, s.opts.MaxBreakersPerTenant, carried, &sa)
	r, err := s.lib.fcall(ctx, "policyd_nextdelay", keys, args...)
	if err != nil && len(carried) > 0 {
		// As in Record: the engine may have applied them before its answer
		// was lost, so they are not sent again (never twice).
		s.log.Warn("redisstore: held outcome results sent with a failed nextdelay call: dropped", "tenant", tenant,
			"target", st.Key.Target, "results", len(carried), "err", err)
		s.queue.dropped.Add(1)
	}
	if errors.Is(err, ErrUnavailable) {
		// This request has waited for the engine once: it decides in
		// degraded mode now, not through the batch path, whose calls would
		// each wait too until the engine breaker counts it down.
		res, err := s.degradedNextDelay(st, &cfg)
		return res, true, err
	}
	if err != nil {
		return policy.NextDelayResult{}, true, err
	}
	res, err := s.nextDelayReply(st, r)
	return res, true, err
}

// degradedNextDelay is st decided as the batch path decides it while the
// engine does not answer (degraded.go), by the same rules (fleet.GateRetry,
// fleet.Spent, fleet.CutRun): this replica's copy of the breaker records
// the failure, the pushback cool-down is not shared, the budgets spend
// from this replica's shares, and the attempt record is kept by this
// replica until the engine answers (downAttempts): a NextDelay sent again
// replays it. It makes no round trip. cfg is st's
// breaker configuration, normalized.
func (s *Store) degradedNextDelay(st *policy.NextDelayStep, cfg *policy.BreakerConfig) (policy.NextDelayResult, error) {
	now := s.opts.Clock().UnixNano()
	cached, _ := s.cachedState(st.Key)
	snap, err := s.degraded.record(st.Key, *cfg, cached, st.Result, st.PermitID, now)
	res := policy.NextDelayResult{Decision: st.Decision, Breaker: snap}
	if err != nil {
		return res, err
	}
	dec, a := &res.Decision, st.Answer
	ask, spread := fleet.GateRetry(dec, st.Policy, snap.State, fleet.UnixNano(snap.CooldownUntil), now, st.Spend.RunID != "", st.SpreadDraw)
	if ask {
		b, _ := s.budgetOf(st.Spend.Tenant)
		res.Asked, res.Spend = true, s.degraded.spend(st.Spend.Tenant, &b, st.Spend.Timeout, st.Spend.RunID)
		fleet.Spent(dec, &res.Spend)
		a.TenantTokens, a.RunRemaining = res.Spend.TenantTokens, res.Spend.RunRemaining
	}
	fleet.CutRun(dec, fleet.UnixNano(st.RunCutoff), now, st.CutBinds)
	a.Retry, a.Stop, a.Disposition, a.Breaker, a.Checks = dec.Retry, dec.Stop, dec.Disposition, snap.State, dec.Checks
	a.Delay = 0
	if dec.Retry {
		a.Delay = dec.Delay
	} else {
		a.AttemptTimeout = 0
	}
	if spread {
		a.Note = fleet.SpreadNote(a.Note)
	}
	a.Degraded = true
	res.Answer = a
	s.keepDown(st.Call, st.Attempt, a, st.Keep.UnixNano())
	return res, nil
}

// KnownRun is server.OneCallNextDelay.KnownRun: run id's ID, Tenant and
// Cutoff, which never change, as this replica last read or opened it
// (Run, OpenRun), without a round trip.
func (s *Store) KnownRun(id string) (policy.Run, bool) {
	v, ok := s.runCutoffs.Load(id)
	if !ok {
		return policy.Run{}, false
	}
	return v.(policy.Run), true
}

// nextDelayCall returns the keys and arguments of st's policyd_nextdelay
// call (policyd.lua has their order) under the breaker configuration cfg
// (normalized) and the tenant's budget b, with the breaker's held
// results carried, its spend as replica sa.replica. Its numbers go as one
// argument, packed (nextDelayHead, nextDelayFresh), the strings as
// arguments of their own, in one slice of the length they take.
func nextDelayCall(st *policy.NextDelayStep, cfg *policy.BreakerConfig, b *policy.TenantBudget, maxBreakers int, carried []result, sa *shareArgs) ([]string, []any) {
	t := st.Key.Tenant
	runKey := keyRun(t, st.Spend.RunID) // with no run, a key on the tenant's slot the library leaves alone
	dec, p := &st.Decision, st.Policy
	n := make(numbers, 0, nextDelayNumbersLen+len(carried))
	n.int(int64(st.Attempt))
	n.int(int64(len(carried)))
	n.cfg(cfg)
	n.int(int64(st.Result))
	n.int(int64(maxBreakers))
	n.int(int64(st.Share))
	n.bit(dec.Retry)
	n.int(int64(dec.Delay))
	n.int(int64(dec.Stop))
	n.int(int64(dec.Disposition))
	n.time(dec.Deadline)
	n.int(int64(p.AttemptTimeout))
	n.float(p.Pushback.SpreadRatio)
	n.int(int64(p.Pushback.MinSpread))
	n.int(int64(p.Pushback.MaxHint))
	n.float(st.SpreadDraw)
	n.float(b.Capacity)
	n.float(b.DepositRatio)
	n.float(b.MinPerSecond)
	n.float(b.RetryCost)
	n.float(b.TimeoutCost)
	n.bit(b.DryRun)
	n.bit(st.Spend.Timeout)
	n.bit(st.Spend.RunID != "")
	n.time(st.RunCutoff)
	n.bit(st.CutBinds)
	n.int(int64(dec.Checks))
	n.int(st.Keep.UnixMilli() + 1)
	n.int(int64(sa.bucket))
	n.int(int64(sa.run))
	n.int(us(sa.grace))
	for _, c := range carried {
		n.small(uint8(c.Result))
	}
	args := make([]any, 0, nextDelayArgs+len(carried))
	args = append(args, []byte(n), st.Key.Target, st.PermitID, packAnswer(&st.Answer), sa.replica, sa.live)
	for _, c := range carried {
		args = append(args, c.Permit)
	}
	keys := []string{keyAttempt(t, st.Call.CallID), keyBreaker(t, st.Key.Target), keyEvents(t), keyIndex(t), keyBucket(t), runKey}
	return keys, args
}

// nextDelayArgs is the number of policyd_nextdelay's arguments but the
// carried results' permits (policyd.lua nextdelay).
const nextDelayArgs = 6

// nextDelayReply reads the reply r of st's policyd_nextdelay call: a
// replay or refusal of the attempt record it returns (fleet.Attempts.Check
// of it, by the one decoder), a permit refused, or the decision.
func (s *Store) nextDelayReply(st *policy.NextDelayStep, r []any) (policy.NextDelayResult, error) {
	if len(r) < 2 {
		return policy.NextDelayResult{}, errReply
	}
	now, err := toInt(r[0])
	if err != nil {
		return policy.NextDelayResult{}, errReply
	}
	switch toString(r[1]) {
	case "replay", "refused":
		if len(r) != 6 {
			return policy.NextDelayResult{}, errReply
		}
		f := attemptFields{present: true, attempt: toString(r[2]), expiry: toString(r[3]), answer: toString(r[4]), verdict: toString(r[5])}
		a, err := f.decode()
		if err != nil {
			return policy.NextDelayResult{}, fmt.Errorf("redisstore: attempt record of %q/%q is %w", st.Call.Tenant, st.Call.CallID, err)
		}
		replay, err := a.Check(now*int64(time.Microsecond), st.Attempt)
		switch {
		case replay:
			return policy.NextDelayResult{Replay: true, Answer: a.Answer}, nil
		case err != nil:
			return policy.NextDelayResult{}, err
		}
		return policy.NextDelayResult{}, errReply // the library and fleet disagree
	case "permit":
		if len(r) != 3 {
			return policy.NextDelayResult{}, errReply
		}
		bs, err := parseState(r[2])
		if err != nil {
			return policy.NextDelayResult{}, err
		}
		s.learn(st.Key, bs)
		return policy.NextDelayResult{Breaker: bs.snapshot(st.Key)}, fleet.ErrPermit
	case "decided":
	default:
		return policy.NextDelayResult{}, errReply
	}
	if len(r) != 12 {
		return policy.NextDelayResult{}, errReply
	}
	bs, err := parseState(r[7])
	if err != nil {
		return policy.NextDelayResult{}, err
	}
	s.learn(st.Key, bs)
	res := policy.NextDelayResult{Answer: st.Answer, Decision: st.Decision, Breaker: bs.snapshot(st.Key)}
	if err := applyVerdict(&res.Answer, toString(r[2])); err != nil {
		return policy.NextDelayResult{}, err
	}
	a := &res.Answer
	res.Decision.Retry, res.Decision.Delay, res.Decision.Stop, res.Decision.Disposition = a.Retry, a.Delay, a.Stop, a.Disposition
	res.Decision.Checks = a.Checks
	asked, _ := toInt(r[3])
	granted, _ := toInt(r[4])
	dry, _ := toInt(r[5])
	if res.Asked = asked == 1; res.Asked {
		res.Spend = policy.Spend{Granted: granted == 1, TenantTokens: a.TenantTokens, RunRemaining: a.RunRemaining,
			HasRun: st.Spend.RunID != "", DryRunRefused: dry == 1}
		if !res.Spend.Granted {
			res.Spend.Stop, res.Spend.Disposition = a.Stop, a.Disposition
		}
		sh, err := parseShares(r[8:12])
		if err != nil {
			return policy.NextDelayResult{}, err
		}
		s.degraded.saw(st.Spend.Tenant, st.Spend.RunID, sh)
	}
	return res, nil
}

// DecidedInOneCall is server.OneCallNextDelay.DecidedInOneCall: the
// call-table note and the attempt tally of a decision NextDelayInOneCall
// made are held for the next flush like outcome batches that need no
// answer (held.go; at once without Options.BatchOutcomes), one batch of
// the tenant's, queued for replay while the engine is out of reach. An
// unknown run is ErrNotFound. What waits for the engine (while it is
// down nothing is held: the batch goes out now, behind a flush in
// flight) waits within u's time, the request's.
func (s *Store) DecidedInOneCall(u Changes, runID, callID string, n policy.CallNote, t policy.AttemptTally) error {
	s = s.within(u)
	if runID == "" && t.Target == "" {
		return nil
	}
	batches := map[string]*outcomeBatch{}
	batch := func(tenant string) *outcomeBatch {
		b := batches[tenant]
		if b == nil {
			b = &outcomeBatch{id: newPermitID().String(), tenant: tenant, byKey: map[policy.BreakerKey]*outcomeGroup{},
				runIndex: map[string]int{}, hour: fleet.HourOf(s.opts.Clock().UnixNano())}
			batches[tenant] = b
		}
		return b
	}
	if runID != "" {
		p, err := s.pendingNote(runID, callID, n)
		if err != nil {
			return err
		}
		b := batch(p.tenant)
		b.notes = append(b.notes, p)
	}
	if t.Target != "" {
		batch(t.Tenant).addTally(&policy.OutcomeUpdate{Tally: t}, 0, 0)
	}
	_, err := s.runOutcomes(nil, batches, nil, true)
	return err
}
