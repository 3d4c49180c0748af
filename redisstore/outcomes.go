package redisstore

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// outcomeBatch is one tenant's part of an outcome flush: one call of
// policyd_outcomes.
type outcomeBatch struct {
	id       string // the batch id the library applies at most once
	tenant   string
	groups   []*outcomeGroup
	byKey    map[policy.BreakerKey]*outcomeGroup
	runs     []string       // run ids, in the order of their keys
	runIndex map[string]int // run id -> 1-based index
	finals   []outcomeFinal
	deposit  int
	results  int // in its groups' runs
	// tallies count in the attempt statistics of the hour the batch was
	// made in (its key {T}:stats:HOUR), so a replay counts there too.
	tallies    []pendingTally
	tallyIndex map[tallyKey]int // -> index in tallies of its sum without a condition (sums)
	hour       int64
	// notes are the call-table notes of the batch's tenant's runs, sent
	// in its pipeline: a batch queued for replay keeps them, so the
	// replay notes the call table as well as the ledger.
	notes []pendingNote
}

type outcomeGroup struct {
	key  policy.BreakerKey
	cfg  policy.BreakerConfig
	runs []resultRun // its results in the order reported, as policyd_outcomes takes them
	// before is the number of result runs of the groups before it in its
	// batch's call: its runs are numbered from before+1, as the library
	// numbers them.
	before int
}

// add appends r, the result of update, to g's runs and returns the index
// in g.runs of the run it went in.
func (g *outcomeGroup) add(r result, update int) int {
	g.runs = appendRun(g.runs, resultRun{result: r.Result, n: 1, permit: r.Permit, update: update})
	return len(g.runs) - 1
}

// results is the number of results in g's runs.
func (g *outcomeGroup) results() int {
	n := 0
	for _, r := range g.runs {
		n += r.n
	}
	return n
}

type outcomeFinal struct {
	update int
	run    int // 1-based index into runs
	cond   int // 1-based result index whose refusal cancels it, 0 for none
	call   string
	f      fleet.Final
}

// ApplyOutcomes applies a batch of reported outcomes: each one's result to
// its breaker, its audit records, and its final disposition to its run's
// ledger (skipped when its result's permit was refused, as Refused then
// says; refused in Refused when the call is final already with another
// disposition, fleet.AlreadyFinal), then deposits[tenant] successes, with one call of
// policyd_outcomes per tenant (all of them sent in one pipeline): never
// one per outcome. Updates are checked first, in order; it applies those
// before the first bad one and returns their number with its error. When
// a call fails, it returns the number of updates before the first one that
// call held; updates of other tenants' calls after it may have been
// applied.
func (s *Store) ApplyOutcomes(ups []policy.OutcomeUpdate, deposits map[string]int) (int, error) {
	if err := s.check(); err != nil {
		return 0, err
	}
	sc := applyScratchPool.Get().(*applyScratch)
	defer sc.put()
	sc.size(len(ups))
	limit, firstErr := len(ups), error(nil)
	runTenant := sc.runTenant
	up := s.health.up()
	for i := range ups {
		u := &ups[i]
		u.Refused = nil
		if up {
			u.PermitID = enginePermit(u.PermitID, s.opts.Clock)
		}
		err := func() error {
			if u.Result != 0 {
				if u.Result < policy.ResultSuccess || u.Result > policy.ResultPushback {
					return invalid("result", "must be success, transient failure, terminal or pushback")
				}
				if err := checkBreakerKey(u.Key); err != nil {
					return err
				}
				if len(u.PermitID) > maxPackedString {
					// policyd_outcomes packs it with a length byte.
					return invalid("permit_id", "must be at most "+strconv.Itoa(maxPackedString)+" bytes")
				}
			}
			if u.RunID == "" || u.Final == policy.DispositionNone {
				return nil
			}
			if err := checkName("call_id", u.CallID, false); err != nil {
				return err
			}
			if ledgerField(fleet.Final{Disposition: u.Final, Stop: u.Stop}) == "" {
				return invalid("disposition", "must be a final disposition")
			}
			t, err := s.runTenant(u.RunID)
			runTenant[i] = t
			return err
		}()
		if err != nil {
			limit, firstErr = i, err
			break
		}
	}
	batches := sc.batches
	hour := fleet.HourOf(s.opts.Clock().UnixNano())
	batch := func(tenant string) *outcomeBatch {
		b := batches[tenant]
		if b == nil {
			b = &outcomeBatch{id: newPermitID().String(), tenant: tenant, byKey: map[policy.BreakerKey]*outcomeGroup{}, runIndex: map[string]int{}, hour: hour}
			batches[tenant] = b
		}
		return b
	}
	for i := range ups[:limit] {
		u := &ups[i]
		if u.Result == 0 {
			continue
		}
		b := batch(u.Key.Tenant)
		g := b.byKey[u.Key]
		if g == nil {
			// A report's breaker mostly holds a few runs.
			g = &outcomeGroup{key: u.Key, cfg: fleet.NormConfig(u.Breaker), runs: make([]resultRun, 0, 4)}
			b.byKey[u.Key] = g
			b.groups = append(b.groups, g)
		}
		sc.groupOf[i], sc.runOf[i] = g, g.add(result{u.Result, u.PermitID}, i)
		b.results++
	}
	// Number the result runs as the library does (group by group) and
	// send each final with the run of the result it depends on when both
	// are in one call.
	for _, b := range batches {
		n := 0
		for _, g := range b.groups {
			g.before = n
			n += len(g.runs)
		}
	}
	resultNo := func(i int) int { return sc.groupOf[i].before + sc.runOf[i] + 1 }
	crossTenant := sc.cross[:0] // finals whose result is in another tenant's call
	for i := range ups[:limit] {
		u := &ups[i]
		if u.RunID == "" || u.Final == policy.DispositionNone {
			if u.Tally.Target != "" {
				// Counted unless its result's permit is refused.
				b := batch(u.Tally.Tenant) // a batch of tallies alone is sent too
				if u.Result != 0 && u.PermitID != "" && u.Key.Tenant == u.Tally.Tenant {
					b.addTally(u, resultNo(i), 0)
				} else {
					sc.tallies[tenantTally{u.Tally.Tenant, tallyKeyOf(u.Tally)}]++
				}
			}
			continue
		}
		if u.Result != 0 && u.Key.Tenant != runTenant[i] {
			crossTenant = append(crossTenant, i)
			continue
		}
		cond := 0
		if u.Result != 0 {
			cond = resultNo(i)
		}
		b := batch(runTenant[i])
		fi := b.addFinal(i, u.RunID, cond, u.CallID, fleet.Final{Disposition: u.Final, Stop: u.Stop, Deduplicated: u.Deduplicated})
		if u.Tally.Target != "" {
			// Counted when the ledger takes the final as the call's first.
			b.addTally(u, 0, fi)
		}
	}
	sc.cross = crossTenant // its array, for the next call
	for k, n := range sc.tallies {
		b := batches[k.tenant]
		if len(b.tallies) == cap(b.tallies) {
			b.tallies = slices.Grow(b.tallies, len(sc.tallies)) // most calls are of one tenant
		}
		b.tallies = append(b.tallies, pendingTally{key: k.key, n: n})
	}
	if firstErr == nil {
		for tenant, n := range deposits {
			if n > 0 && tenant != "" {
				batch(tenant).deposit += n
			}
		}
	}
	// A note whose update's result cannot be refused (no permit) goes in
	// the outcomes' pipeline; the others once their refusal is known.
	early, err := s.outcomeNotes(ups[:limit], func(u *policy.OutcomeUpdate) bool { return u.Result == 0 || u.PermitID == "" })
	if err != nil {
		return 0, err
	}
	if n, err := s.runOutcomes(ups, batches, early, true); err != nil {
		return min(n, limit), err
	}
	if len(crossTenant) > 0 {
		second := map[string]*outcomeBatch{}
		for _, i := range crossTenant {
			if ups[i].Refused != nil {
				continue
			}
			b := second[runTenant[i]]
			if b == nil {
				b = &outcomeBatch{id: newPermitID().String(), tenant: runTenant[i], byKey: map[policy.BreakerKey]*outcomeGroup{}, runIndex: map[string]int{}, hour: hour}
				second[runTenant[i]] = b
			}
			fi := b.addFinal(i, ups[i].RunID, 0, ups[i].CallID, fleet.Final{Disposition: ups[i].Final, Stop: ups[i].Stop, Deduplicated: ups[i].Deduplicated})
			if ups[i].Tally.Target != "" {
				b.addTally(&ups[i], 0, fi)
			}
		}
		if n, err := s.runOutcomes(ups, second, nil, true); err != nil {
			return min(n, limit), err
		}
	}
	late, err := s.outcomeNotes(ups[:limit], func(u *policy.OutcomeUpdate) bool {
		return u.Result != 0 && u.PermitID != "" && u.Refused == nil
	})
	if err != nil {
		return limit, err
	}
	if len(late) > 0 {
		if _, err := s.runOutcomes(ups, nil, late, true); err != nil {
			return limit, err
		}
	}
	s.appendAuditOf(ups[:limit])
	return limit, firstErr
}

// addFinal adds a final disposition to b and returns its 1-based index
// among b's finals.
func (b *outcomeBatch) addFinal(update int, run string, cond int, call string, f fleet.Final) int {
	ri := b.runIndex[run]
	if ri == 0 {
		b.runs = append(b.runs, run)
		ri = len(b.runs)
		b.runIndex[run] = ri
	}
	b.finals = append(b.finals, outcomeFinal{update: update, run: ri, cond: cond, call: call, f: f})
	return len(b.finals)
}

// addTally adds u's tally to b, counted when the result numbered cond
// (0: none) was not refused and the final numbered final (0: none)
// changed the ledger; tallies without a condition are summed per field.
func (b *outcomeBatch) addTally(u *policy.OutcomeUpdate, cond, final int) {
	k := tallyKeyOf(u.Tally)
	if cond == 0 && final == 0 {
		sums := b.sums()
		if i, ok := sums[k]; ok {
			b.tallies[i].n++
			return
		}
		sums[k] = len(b.tallies)
	}
	b.tallies = append(b.tallies, pendingTally{key: k, n: 1, cond: cond, final: final})
}

// sums returns b.tallyIndex, the index of b's tallies without a
// condition, made from its tallies the first time (ApplyOutcomes adds its
// sums without one).
func (b *outcomeBatch) sums() map[tallyKey]int {
	if b.tallyIndex == nil {
		b.tallyIndex = make(map[tallyKey]int, len(b.tallies))
		for i, tl := range b.tallies {
			if tl.cond == 0 && tl.final == 0 {
				b.tallyIndex[tl.key] = i
			}
		}
	}
	return b.tallyIndex
}

// runOutcomes sends every batch's policyd_outcomes call and the call
// notes in one pipeline and applies the replies to ups and the cache. On
// failure it returns the lowest update index of a failed call; a note of
// a run gone since is dropped. A batch the engine does not answer for
// (ErrUnavailable) is queued for replay, not a failure: its updates'
// permits are not checked (Refused stays nil). A note goes with the batch
// of its run's tenant (outcomeBatch.notes), queued and replayed with it;
// only a note of a tenant without a batch here is lost then. With hold
// (an ApplyOutcomes call's), the batches that need no answer are held for
// the next flush instead (Store.hold), and the held batch of every tenant
// sent now goes first, in the same pipeline; a held batch's failure is
// not the caller's: it is logged and counted as dropped. A batch sent now
// waits for a flush in flight only until the call's bound (rlockOr): past
// it every update is accepted, as in degraded mode, and the batches go
// out in their turn.
func (s *Store) runOutcomes(ups []policy.OutcomeUpdate, batches map[string]*outcomeBatch, notes []pendingNote, hold bool) (int, error) {
	if len(batches) == 0 && len(notes) == 0 {
		return len(ups), nil
	}
	var rest []pendingNote
	for _, n := range notes {
		if b := batches[n.tenant]; b != nil {
			b.notes = append(b.notes, n)
		} else {
			rest = append(rest, n)
		}
	}
	hold = hold && s.opts.BatchOutcomes
	if hold && !s.holdsAll(batches, rest) {
		if s.bound.IsZero() {
			s = s.bounded() // one bound for the wait and the call, as a request's view has
		}
		ctx, cancel := s.call()
		shared := s.held.rlockOr(ctx, func() func() {
			// The request is answered as in degraded mode (every update
			// accepted); its batches go in its turn, within a bound of
			// their own (the request's is past), and a refusal then has
			// no caller to tell. The map is copied now: it is the
			// request's scratch.
			late, n := maps.Clone(batches), len(ups)
			return func() {
				if _, err := s.bounded().sendOutcomes(make([]policy.OutcomeUpdate, n), late, rest, true, s.queueOne); err != nil {
					s.log.Warn("redisstore: outcome batch sent after its request's deadline refused: dropped", "err", err)
					s.queue.dropped.Add(1)
				}
			}
		})
		cancel()
		if !shared {
			return len(ups), nil
		}
		defer s.held.runlock()
	}
	return s.sendOutcomes(ups, batches, rest, hold, s.queueOne)
}

// sendOutcomes is runOutcomes once the notes are with their batches (rest
// the others) and, for a batch to send now with hold, the caller holds a
// share of s.held.sending. A batch the engine does not take (down, or not
// answering) goes to notTaken with the number of updates: queueOne, or
// the replay's own (replay).
func (s *Store) sendOutcomes(ups []policy.OutcomeUpdate, batches map[string]*outcomeBatch, rest []pendingNote, hold bool,
	notTaken func(n int, b *outcomeBatch)) (int, error) {
	var prior map[string]*outcomeBatch
	if hold {
		batches, prior = s.hold(batches, rest)
		if len(batches) == 0 && len(prior) == 0 && len(rest) == 0 {
			return len(ups), nil
		}
	}
	// calls are the batches in the order sent: by tenant, a tenant's held
	// batch before its new one.
	var calls []*outcomeBatch
	isPrior := map[*outcomeBatch]bool{}
	tenants := make([]string, 0, len(batches)+len(prior))
	for t := range batches {
		tenants = append(tenants, t)
	}
	for t := range prior {
		if batches[t] == nil {
			tenants = append(tenants, t)
		}
	}
	slices.Sort(tenants)
	for _, t := range tenants {
		if b := prior[t]; b != nil {
			calls = append(calls, b)
			isPrior[b] = true
		}
		if b := batches[t]; b != nil {
			calls = append(calls, b)
		}
	}
	queueAll := func() {
		for _, b := range calls {
			notTaken(len(ups), b)
		}
	}
	if !s.health.up() {
		queueAll()
		return len(ups), nil
	}
	for _, t := range tenants {
		if _, err := s.follow(t); err != nil {
			if errors.Is(err, ErrUnavailable) {
				queueAll()
				return len(ups), nil
			}
			return 0, fmt.Errorf("redisstore: follow tenant %q: %w", t, err)
		}
	}
	ctx, cancel := s.call()
	defer cancel()
	cmds := make([]*redis.Cmd, len(calls))
	all, _ := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, b := range calls {
			bg, _ := s.budgetOf(b.tenant)
			keys, args := b.call(&bg, s.opts.MaxBreakersPerTenant)
			cmds[i] = s.lib.on(p).run(ctx, "policyd_outcomes", keys, args...)
		}
		for _, b := range calls {
			queueNotes(ctx, s.lib.on(p), b.notes, s.opts.MaxRunCalls)
		}
		queueNotes(ctx, s.lib.on(p), rest, s.opts.MaxRunCalls)
		return nil
	})
	failed := len(ups)
	var firstErr error
	queued := map[*outcomeBatch]bool{}
	for i, b := range calls {
		if err := b.apply(s, ups, cmds[i]); err != nil {
			switch {
			case errors.Is(err, ErrUnavailable):
				notTaken(len(ups), b)
				queued[b] = true
			case isPrior[b]:
				s.log.Warn("redisstore: held outcome batch refused: dropped", "tenant", b.tenant, "err", err)
				s.queue.dropped.Add(1)
			default:
				lo := b.lowest(len(ups))
				if firstErr == nil || lo < failed {
					failed, firstErr = lo, err
				}
			}
		}
	}
	// The notes' replies, in the order sent: a queued batch's notes are
	// sent again with it.
	next := len(calls)
	noteErr := func(n int, skip bool) {
		for ; n > 0 && next < len(all); n-- {
			if err := all[next].Err(); err != nil && !skip && !redisNotFound(err) && firstErr == nil {
				failed, firstErr = len(ups), fmt.Errorf("redisstore: note calls: %w", err)
			}
			next++
		}
	}
	for _, b := range calls {
		noteErr(len(b.notes), queued[b] || isPrior[b])
	}
	// The notes of tenants without a batch here are lost when the engine
	// did not answer, as when it is down (above): counted, not the
	// caller's failure.
	lost := 0
	for range rest {
		if next < len(all) && errors.Is(all[next].Err(), ErrUnavailable) {
			lost++
			next++
			continue
		}
		noteErr(1, false)
	}
	if lost > 0 {
		s.log.Warn("redisstore: run call-table notes not answered by the engine: dropped", "notes", lost)
		s.queue.dropped.Add(1)
	}
	return failed, firstErr
}

// resultRun is a run of a breaker's results as policyd_outcomes takes
// them: n consecutive results of one value without a permit, applied as n
// results one after another, or one result (n 1) with its permit. The
// library answers the indexes of the runs it refused (only a run with a
// permit can be).
type resultRun struct {
	result policy.Result
	n      int
	permit string
	update int // the update of its first result (-1: none, a held batch's)
}

// appendRun appends r to runs, in order: a run with a permit is a run of
// its own, a run without one joins the last run when that is of the same
// value without a permit (it keeps the last run's update).
func appendRun(runs []resultRun, r resultRun) []resultRun {
	if last := len(runs) - 1; r.permit == "" && last >= 0 && runs[last].permit == "" && runs[last].result == r.result {
		runs[last].n += r.n
		return runs
	}
	return append(runs, r)
}

// The formats of a group of policyd_outcomes' numbers, as the library's
// struct.unpack reads them (policyd.lua OUTCOMES_GROUP and OUTCOMES_RUN,
// which its test checks are these): the breaker's cfg (numbers.cfg) and
// its runs' count i4, then per run the result B, its count i4 and its
// permit id Bc0 (a length byte, then the id; 0 for none).
const (
	outcomesGroup = "<i8i8di8i8i8i8i8i4"
	outcomesRun   = "<Bi4Bc0"
	// their lengths in bytes, a run's without its permit id
	outcomesGroupLen = 8*8 + 4
	outcomesRunLen   = 1 + 4 + 1
)

// call returns the keys and arguments of b's policyd_outcomes call under
// the tenant's budget bg: each group's target, then its numbers packed
// (outcomesGroup) with its results as runs (appendRun, each
// outcomesRun), so the library's work grows with the runs, not with the
// results, and a run costs the call a few bytes, not three arguments.
func (b *outcomeBatch) call(bg *policy.TenantBudget, maxBreakers int) ([]string, []any) {
	t := b.tenant
	keys := make([]string, 0, 5+len(b.groups)+2*len(b.runs))
	keys = append(keys, keyEvents(t), keyIndex(t), keyBucket(t))
	for _, g := range b.groups {
		keys = append(keys, keyBreaker(t, g.key.Target))
	}
	for _, r := range b.runs {
		keys = append(keys, keyRun(t, r), keyRunCalls(t, r))
	}
	if len(b.tallies) > 0 {
		keys = append(keys, keyStats(t, b.hour))
	}
	if b.id != "" {
		keys = append(keys, keyApplied(t))
	}
	args := make([]any, 0, 13+2*len(b.groups)+5*len(b.finals)+4*len(b.tallies))
	args = append(args, len(b.groups), len(b.runs), b.deposit)
	args = budgetArgs(args, bg)
	args = append(args, maxBreakers)
	size := 0
	for _, g := range b.groups {
		size += outcomesGroupLen + outcomesRunLen*len(g.runs)
		for _, r := range g.runs {
			size += len(r.permit)
		}
	}
	// One buffer for every group's numbers, each group's a slice of it.
	buf := make(numbers, 0, size)
	for _, g := range b.groups {
		start := len(buf)
		buf.cfg(&g.cfg)
		buf.int4(int32(len(g.runs)))
		for _, r := range g.runs {
			buf.small(uint8(r.result))
			buf.int4(int32(r.n))
			buf.short(r.permit)
		}
		args = append(args, g.key.Target, []byte(buf[start:len(buf):len(buf)]))
	}
	args = append(args, len(b.finals))
	for _, f := range b.finals {
		field := ledgerField(f.f)
		args = append(args, f.run, f.cond, f.call, field, finalValue(f.f, field))
	}
	if len(b.tallies) > 0 {
		// Between the finals and the batch id: a library without the
		// attempt statistics reads past them (and counts nothing).
		args = append(args, len(b.tallies))
		for _, tl := range b.tallies {
			args = append(args, tl.key.field(), tl.n, tl.cond, tl.final)
		}
	}
	args = append(args, b.id)
	return keys, args
}

// apply reads b's reply: refusals into ups, states into the cache.
func (b *outcomeBatch) apply(s *Store, ups []policy.OutcomeUpdate, cmd *redis.Cmd) error {
	v, err := cmd.Slice()
	if err != nil {
		return fmt.Errorf("tenant %q: %w", b.tenant, libraryErr("policyd_outcomes", err))
	}
	if len(v) == 1 && toString(v[0]) == "applied" {
		return nil // a replay of a batch the engine has
	}
	if len(v) != 1+3*len(b.groups)+len(b.finals)+1 {
		return errReply
	}
	for gi, g := range b.groups {
		refused, _ := v[2+3*gi].([]any)
		for _, x := range refused {
			// The 1-based index of a run with a permit, of one result.
			ri, err := toInt(x)
			if err != nil || ri < 1 || ri > int64(len(g.runs)) {
				return errReply
			}
			if r := g.runs[ri-1]; r.update >= 0 {
				ups[r.update].Refused = fleet.ErrPermit
			}
		}
		st, err := parseState(v[3+3*gi])
		if err != nil {
			return err
		}
		s.learn(g.key, st)
	}
	for fi, f := range b.finals {
		r := v[1+3*len(b.groups)+fi]
		if err := finalRefusal(r); err != nil {
			if !refusal(err) {
				return err
			}
			ups[f.update].Refused = err
			continue
		}
		if n, _ := toInt(r); n == -1 {
			return fmt.Errorf("%w: run %q", ErrNotFound, ups[f.update].RunID)
		}
	}
	return nil
}

// lowest returns the lowest update index b holds, n for a batch of a
// deposit only (deposits come after every update).
func (b *outcomeBatch) lowest(n int) int {
	lo := n
	for _, g := range b.groups {
		for _, r := range g.runs {
			if r.update >= 0 {
				lo = min(lo, r.update)
			}
		}
	}
	for _, f := range b.finals {
		lo = min(lo, f.update)
	}
	return lo
}

// refusal reports whether err is a refusal of the state's rules
// (fleet.Refusal): an update's answer, not the batch's failure.
func refusal(err error) bool {
	var r *fleet.Refusal
	return errors.As(err, &r)
}

// outcomeNotes returns the pending notes of the updates of ups that
// which selects and that carry a note of a run; a note of an unknown run
// is dropped, as breakerstore drops it.
func (s *Store) outcomeNotes(ups []policy.OutcomeUpdate, which func(*policy.OutcomeUpdate) bool) ([]pendingNote, error) {
	var notes []pendingNote
	for i := range ups {
		u := &ups[i]
		if u.RunID == "" || u.CallID == "" || u.Note == (policy.CallNote{}) || !which(u) {
			continue
		}
		p, err := s.pendingNote(u.RunID, u.CallID, u.Note)
		switch {
		case errors.Is(err, ErrNotFound):
			continue
		case err != nil:
			return nil, err
		}
		notes = append(notes, p)
	}
	return notes, nil
}

// applyScratch is an ApplyOutcomes call's working memory, reused from
// call to call (applyScratchPool): per update of the call, indexed as
// its ups.
type applyScratch struct {
	runTenant []string        // its run's tenant, for a final of a run
	groupOf   []*outcomeGroup // the group of its result, for a result
	runOf     []int           // the index in groupOf's runs of its result's run
	cross     []int           // the finals whose result is in another tenant's call
	// tallies are the call's tallies without a condition, summed by
	// tenant and key before they join their batches.
	tallies map[tenantTally]int
	// batches are the call's, by tenant: the batches themselves are the
	// call's, or held (Store.hold), never reused.
	batches map[string]*outcomeBatch
}

// tenantTally is a tally's tenant and key.
type tenantTally struct {
	tenant string
	key    tallyKey
}

var applyScratchPool = sync.Pool{New: func() any {
	return &applyScratch{batches: map[string]*outcomeBatch{}, tallies: map[tenantTally]int{}}
}}

// size makes sc's slices per update n long, zeroed.
func (sc *applyScratch) size(n int) {
	sc.runTenant = slices.Grow(sc.runTenant[:0], n)[:n]
	sc.groupOf = slices.Grow(sc.groupOf[:0], n)[:n]
	sc.runOf = slices.Grow(sc.runOf[:0], n)[:n]
	clear(sc.runTenant)
	clear(sc.groupOf)
}

// put returns sc to the pool, cleared so it pins no call's strings or
// batches.
func (sc *applyScratch) put() {
	clear(sc.runTenant)
	clear(sc.groupOf)
	clear(sc.batches)
	clear(sc.tallies)
	sc.cross = sc.cross[:0]
	applyScratchPool.Put(sc)
}
