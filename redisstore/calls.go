package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// This file holds one Go function per library function: arguments in,
// domain values out, and the time (Unix µs) the change was made at: the
// server's, or the engine's clock when it has one (lib).
// They hold no state; Store adds the cache, the feed and the defaults.

// admitCall is policyd_admit on the breaker under key.
func admitCall(ctx context.Context, l lib, key policy.BreakerKey, cfg *policy.BreakerConfig, id fleet.PermitID, maxBreakers int) (now int64, a policy.Admission, st state, err error) {
	args := cfgArgs([]any{key.Target}, cfg)
	args = append(args, id.String(), maxBreakers)
	r, err := l.fcall(ctx, "policyd_admit", []string{keyBreaker(key.Tenant, key.Target), keyEvents(key.Tenant), keyIndex(key.Tenant)}, args...)
	if err != nil {
		return 0, a, st, err
	}
	if len(r) != 17 {
		return 0, a, st, errReply
	}
	now, err = toInt(r[0])
	if err != nil {
		return 0, a, st, err
	}
	ok, _ := toInt(r[1])
	after, _ := toInt(r[4])
	if st, err = parseState(r[6:]); err != nil {
		return 0, a, st, err
	}
	a = policy.Admission{Admitted: ok == 1, State: st.State, PermitID: toString(r[3]),
		RetryAfter: time.Duration(after) * time.Microsecond, Reason: toString(r[2])}
	return now, a, st, nil
}

// result is one result to record on a breaker.
type result struct {
	Result policy.Result
	Permit string
}

// recordGroup is the results of one breaker for recordCall.
type recordGroup struct {
	Key     policy.BreakerKey
	Cfg     *policy.BreakerConfig
	Results []result
}

// recorded is what recordCall reports per group.
type recorded struct {
	Events  []string // stream ids of the transitions published
	Refused []bool   // per result: its permit was not live (fleet.ErrPermit)
	State   state
}

// recordCall is policyd_record: every group's results, on breakers of one
// tenant, in one call.
func recordCall(ctx context.Context, l lib, tenant string, groups []recordGroup, maxBreakers int) (int64, []recorded, error) {
	keys := []string{keyEvents(tenant), keyIndex(tenant)}
	args := []any{maxBreakers}
	for _, g := range groups {
		if g.Key.Tenant != tenant {
			return 0, nil, fmt.Errorf("redisstore: record: breaker of tenant %q in a batch of %q", g.Key.Tenant, tenant)
		}
		keys = append(keys, keyBreaker(tenant, g.Key.Target))
		args = append(args, g.Key.Target)
		args = cfgArgs(args, g.Cfg)
		args = append(args, len(g.Results))
		for _, r := range g.Results {
			args = append(args, int(r.Result), r.Permit)
		}
	}
	r, err := l.fcall(ctx, "policyd_record", keys, args...)
	if err != nil {
		return 0, nil, err
	}
	if len(r) != 1+3*len(groups) {
		return 0, nil, errReply
	}
	now, err := toInt(r[0])
	if err != nil {
		return 0, nil, err
	}
	out := make([]recorded, len(groups))
	for i := range groups {
		evs, _ := r[1+3*i].([]any)
		flags, _ := r[2+3*i].([]any)
		for _, e := range evs {
			if s := toString(e); s != "" {
				out[i].Events = append(out[i].Events, s)
			}
		}
		for _, f := range flags {
			n, _ := toInt(f)
			out[i].Refused = append(out[i].Refused, n == 1)
		}
		if out[i].State, err = parseState(r[3+3*i]); err != nil {
			return 0, nil, err
		}
	}
	return now, out, nil
}

// cooldownCall is policyd_cooldown: the breaker's cool-down moves to until
// when that is later; it returns the end in force (Unix µs).
func cooldownCall(ctx context.Context, l lib, key policy.BreakerKey, cfg *policy.BreakerConfig, until time.Time, maxBreakers int) (now, inForce int64, st state, err error) {
	args := cfgArgs([]any{key.Target}, cfg)
	args = append(args, until.UnixMicro(), maxBreakers)
	r, err := l.fcall(ctx, "policyd_cooldown", []string{keyBreaker(key.Tenant, key.Target), keyEvents(key.Tenant), keyIndex(key.Tenant)}, args...)
	if err != nil {
		return 0, 0, st, err
	}
	if len(r) != 4 {
		return 0, 0, st, errReply
	}
	now, _ = toInt(r[0])
	inForce, _ = toInt(r[1])
	st, err = parseState(r[3])
	return now, inForce, st, err
}

// adminCall is policyd_admin_breaker: op "reset" (ErrNotFound for a
// breaker never stored) or "force" to st.
func adminCall(ctx context.Context, l lib, key policy.BreakerKey, op string, st policy.BreakerState, maxBreakers int) (int64, state, error) {
	r, err := l.fcall(ctx, "policyd_admin_breaker", []string{keyBreaker(key.Tenant, key.Target), keyEvents(key.Tenant), keyIndex(key.Tenant)},
		key.Target, op, int(st), maxBreakers)
	if err != nil {
		return 0, state{}, err
	}
	if len(r) != 3 {
		return 0, state{}, errReply
	}
	now, _ := toInt(r[0])
	s, err := parseState(r[2])
	return now, s, err
}

// spendCall is policyd_spend: one retry from tenant's bucket under budget
// b and, when runID is set, from the run's pool, as replica sa.replica,
// whose shares of both it returns.
func spendCall(ctx context.Context, l lib, tenant string, b *policy.TenantBudget, timeout bool, runID string, sa *shareArgs) (int64, policy.Spend, spendShares, error) {
	runKey := keyRun(tenant, "")
	hasRun := 0
	if runID != "" {
		runKey, hasRun = keyRun(tenant, runID), 1
	}
	to := 0
	if timeout {
		to = 1
	}
	args := budgetArgs(nil, b)
	args = append(args, to, hasRun, sa.replica, sa.bucket, sa.run, sa.live, us(sa.grace))
	r, err := l.fcall(ctx, "policyd_spend", []string{keyBucket(tenant), runKey}, args...)
	if err != nil {
		return 0, policy.Spend{}, spendShares{}, err
	}
	if len(r) != 11 {
		return 0, policy.Spend{}, spendShares{}, errReply
	}
	now, _ := toInt(r[0])
	granted, _ := toInt(r[1])
	stop, _ := toInt(r[2])
	disp, _ := toInt(r[3])
	tokens, err := toFloat(r[4])
	if err != nil {
		return 0, policy.Spend{}, spendShares{}, err
	}
	left, _ := toInt(r[5])
	dry, _ := toInt(r[6])
	sh, err := parseShares(r[7:11])
	if err != nil {
		return 0, policy.Spend{}, spendShares{}, err
	}
	return now, policy.Spend{Granted: granted == 1, Stop: policy.StopReason(stop), Disposition: policy.Disposition(disp),
		TenantTokens: tokens, RunRemaining: uint64(left), HasRun: runID != "", DryRunRefused: dry == 1}, sh, nil
}

// shareArgs is what policyd_spend needs to set the caller's shares: its
// replica id, the versions of its bucket and run shares it has seen, the
// live replicas' ids (space-separated) and how long a replica out of
// them must have been silent before its shares are forfeited.
type shareArgs struct {
	replica     string
	bucket, run uint64
	live        string
	grace       time.Duration
}

// spendShares are the caller's shares of a bucket and a run pool after a
// call, as the library reports them.
type spendShares struct{ bucket, run share }

// parseShares reads the library's 4 share numbers: bucket share, its
// version, run share, its version.
func parseShares(a []any) (spendShares, error) {
	var out spendShares
	var err [4]error
	out.bucket.hold, err[0] = toFloat(a[0])
	v, e := toInt(a[1])
	out.bucket.v, err[1] = uint64(v), e
	out.run.hold, err[2] = toFloat(a[2])
	v, e = toInt(a[3])
	out.run.v, err[3] = uint64(v), e
	if e := errors.Join(err[:]...); e != nil {
		return spendShares{}, fmt.Errorf("redisstore: shares %v: %w", a, e)
	}
	return out, nil
}

// depositCall is policyd_deposit of successes into tenant's bucket.
func depositCall(ctx context.Context, l lib, tenant string, b *policy.TenantBudget, successes int) (int64, float64, error) {
	args := budgetArgs(nil, b)
	args = append(args, successes)
	r, err := l.fcall(ctx, "policyd_deposit", []string{keyBucket(tenant)}, args...)
	if err != nil {
		return 0, 0, err
	}
	if len(r) != 2 {
		return 0, 0, errReply
	}
	now, _ := toInt(r[0])
	tokens, err := toFloat(r[1])
	return now, tokens, err
}

// chargeCall withdraws d from its tenant's bucket and run (one call of
// policyd_charge) as replica, and returns the tokens and the run's
// retries left after it and replica's shares of both.
func chargeCall(ctx context.Context, l lib, d *debt, b *policy.TenantBudget, replica string) (tokens float64, left uint64, sh spendShares, err error) {
	runKey, hasRun := keyRun(d.tenant, ""), 0
	if d.run != "" {
		runKey, hasRun = keyRun(d.tenant, d.run), 1
	}
	args := budgetArgs(nil, b)
	args = append(args, strconv.FormatFloat(d.tokens, 'g', -1, 64), d.retries, hasRun, d.id, replica)
	r, err := l.fcall(ctx, "policyd_charge", []string{keyBucket(d.tenant), runKey, keyApplied(d.tenant)}, args...)
	if err != nil {
		return 0, 0, spendShares{}, err
	}
	if len(r) != 8 {
		return 0, 0, spendShares{}, errReply
	}
	if tokens, err = toFloat(r[1]); err != nil {
		return 0, 0, spendShares{}, err
	}
	n, _ := toInt(r[2])
	if sh, err = parseShares(r[4:8]); err != nil {
		return 0, 0, spendShares{}, err
	}
	return tokens, uint64(n), sh, nil
}

// ledgerFields names the run hash's ledger counters, in policy.Ledger's
// field order.
var ledgerFields = [...]string{"succeeded", "failed_terminal", "dl_exhausted", "dl_budget",
	"dl_not_idempotent", "dl_pushback", "circuit_open", "deadline_cut", "dl_deadline", "deduplicated"}

// ledgerField returns the run hash field counting f, or "" for a
// disposition the ledger has no counter for.
func ledgerField(f fleet.Final) string {
	var l policy.Ledger
	slot := fleet.LedgerSlot(&l, f)
	if slot == nil {
		return ""
	}
	for i, p := range ledgerCounters(&l) {
		if p == slot {
			return ledgerFields[i]
		}
	}
	return ""
}

// ledgerCounters returns pointers to l's counters in ledgerFields' order.
func ledgerCounters(l *policy.Ledger) [10]*uint64 {
	return [10]*uint64{&l.Succeeded, &l.FailedTerminal, &l.DeadLetterExhausted, &l.DeadLetterBudget,
		&l.DeadLetterNotIdempotent, &l.DeadLetterPushback, &l.CircuitOpen, &l.DeadlineCut,
		&l.DeadLetterDeadline, &l.Deduplicated}
}

// finalValue is f as the runcalls hash keeps it: "disposition:stop/slot",
// and "/dedup" after it for a success the idempotency ledger answered
// (counted in deduplicated as well as in its slot).
func finalValue(f fleet.Final, field string) string {
	v := fmt.Sprintf("%d:%d/%s", f.Disposition, f.Stop, field)
	if f.Deduplicated {
		v += "/dedup"
	}
	return v
}

// finalCall is policyd_final: call's final disposition f in run runID of
// tenant; it reports whether the ledger changed, and refuses a disposition
// other than the one in force (fleet.AlreadyFinal: the first wins).
func finalCall(ctx context.Context, l lib, tenant, runID, call string, f fleet.Final) (bool, error) {
	field := ledgerField(f)
	if field == "" {
		return false, invalid("disposition", "must be a final disposition")
	}
	v := finalValue(f, field)
	r, err := l.run(ctx, "policyd_final", []string{keyRun(tenant, runID), keyRunCalls(tenant, runID)}, call, field, v).Result()
	if err != nil {
		if redisNotFound(err) {
			return false, fmt.Errorf("%w: run %q", ErrNotFound, runID)
		}
		return false, fmt.Errorf("redisstore: policyd_final: %w", err)
	}
	if err := finalRefusal(r); err != nil {
		return false, err
	}
	n, err := toInt(r)
	return n == 1, err
}

// finalRefusal returns the refusal a reply of record_final carries: the
// value in force, "disposition:stop/slot", when the call is final already
// with another disposition; nil for any other reply.
func finalRefusal(reply any) error {
	s, ok := reply.(string)
	if !ok {
		return nil
	}
	var d, stop uint8
	if _, err := fmt.Sscanf(s, "%d:%d/", &d, &stop); err != nil {
		return fmt.Errorf("redisstore: final disposition in force %q: %w", s, errReply)
	}
	return fleet.AlreadyFinal(fleet.Final{Disposition: policy.Disposition(d), Stop: policy.StopReason(stop)})
}

func redisNotFound(err error) bool {
	return err != nil && len(err.Error()) >= 8 && err.Error()[:8] == "NOTFOUND"
}

// newPermitID draws an id, a probe permit's for the engine among others:
// 127 bits from crypto/rand, the top bit of its first byte clear, which
// tells it from a permit a replica's local copy handed out in degraded
// mode (degradedPermitID).
func newPermitID() fleet.PermitID {
	var id fleet.PermitID
	_, _ = rand.Read(id[:])
	id[0] &^= degradedPermitBit
	return id
}

// degradedPermitBit, set in the first byte of a probe permit id, marks a
// permit a replica's local copy handed out while the engine did not
// answer, which the engine never saw.
const degradedPermitBit = 0x80

// degradedPermitID draws the id of a probe permit a local copy hands out
// in degraded mode, live until expiry (Unix ns): the first byte's top bit
// set, the expiry in the next 8 bytes (big-endian), 63 bits from
// crypto/rand in the rest. Any replica, not only the one that drew it,
// can then tell the engine such a permit as no permit while it is live by
// its own clock (enginePermit): a client may report the probe to any
// replica. An id forged with the bit set gains nothing: as no permit it
// settles nothing in HALF_OPEN.
func degradedPermitID(expiry int64) fleet.PermitID {
	var id fleet.PermitID
	_, _ = rand.Read(id[:])
	id[0] |= degradedPermitBit
	binary.BigEndian.PutUint64(id[1:9], uint64(expiry))
	return id
}

// degradedPermit returns the expiry (Unix ns) of id when a local copy
// drew it in degraded mode (degradedPermitID); ok is false for the
// engine's permits.
func degradedPermit(id fleet.PermitID) (expiry int64, ok bool) {
	if id[0]&degradedPermitBit == 0 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(id[1:9])), true
}

// readCall is policyd_read: the breaker under key at the call's time,
// or ErrNotFound.
func readCall(ctx context.Context, l lib, key policy.BreakerKey) (state, error) {
	r, err := l.runRO(ctx, "policyd_read", []string{keyBreaker(key.Tenant, key.Target)}).Slice()
	if err != nil {
		if redisNotFound(err) {
			return state{}, fmt.Errorf("%w: breaker %q/%q", ErrNotFound, key.Tenant, key.Target)
		}
		return state{}, fmt.Errorf("redisstore: policyd_read: %w", err)
	}
	if len(r) != 2 {
		return state{}, errReply
	}
	return parseState(r[1])
}
