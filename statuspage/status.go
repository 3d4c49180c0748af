package statuspage

import (
	"cmp"
	"slices"
	"time"

	"github.com/policyd/policyd/policy"
)

// Status is what the page shows and /status.json serves.
type Status struct {
	Time     time.Time    `json:"time"`
	Store    *StoreHealth `json:"store,omitempty"`
	Breakers []Breaker    `json:"breakers"`
	// BreakersOmitted counts the breakers past Config.MaxBreakers, when
	// the store's health says how many there are.
	BreakersOmitted int        `json:"breakers_omitted"`
	Cooldowns       []Cooldown `json:"cooldowns"`
	Tenants         []Tenant   `json:"tenants"`
	TenantsOmitted  bool       `json:"tenants_omitted"`
	Runs            []Run      `json:"runs"`
	RunsOmitted     bool       `json:"runs_omitted"`
	// Escalations are the stored policies' fallback chains.
	Escalations []Escalation `json:"escalations"`
	// Replicas are the daemons serving the fleet state (Config.Replicas).
	Replicas []Replica `json:"replicas"`
	// Errors lists the sections the store could not list, and why.
	Errors []string `json:"errors,omitempty"`
}

// StoreHealth is the state engine's health: its counters since start and a
// verdict over them.
type StoreHealth struct {
	Engine        string `json:"engine"`
	Breakers      int    `json:"breakers"`
	Tenants       int    `json:"tenants"`
	Runs          int    `json:"runs"`
	Commits       uint64 `json:"commits"`
	FlushErrors   uint64 `json:"flush_errors"`
	AuditRecords  int    `json:"audit_records"`
	AuditBuffered int    `json:"audit_buffered"`
	AuditDropped  uint64 `json:"audit_dropped"`
	// File is the bbolt file's base name; "" for a shared engine.
	File string `json:"file,omitempty"`
	// Replica is this daemon's id in a shared engine's replica set.
	Replica string `json:"replica,omitempty"`
	// Degraded is true while a shared engine does not answer and this
	// replica decides from its last known state (redisstore.Store.Up).
	Degraded bool `json:"degraded"`
	// Up is !Degraded: the store answers (set by the page).
	Up bool `json:"up"`
	// State is OK; DEGRADED while the engine does not answer; or
	// FLUSH_FAILING while group commits have failed within the last
	// FlushFailingFor (set by the page, not the source).
	State string `json:"state"`
}

// FlushFailingFor is how long after a failed group commit the store's
// health reads FLUSH_FAILING.
const FlushFailingFor = time.Minute

// Breaker is one breaker as the page shows it.
type Breaker struct {
	Tenant string `json:"tenant"` // "" for a target-scoped breaker
	Target string `json:"target"`
	State  string `json:"state"` // CLOSED, OPEN, HALF_OPEN, DISABLED
	Forced bool   `json:"forced"`
	// Since is when the breaker last changed state.
	Since          time.Time  `json:"since"`
	OpenUntil      *time.Time `json:"open_until,omitempty"`
	ProbesInFlight int        `json:"probes_in_flight"`
	Mode           string     `json:"mode"`
	// Failures is the count the mode trips on: consecutive failures, or
	// failures in the FAILURE_RATE window (out of WindowCalls).
	Failures    uint64 `json:"failures"`
	WindowCalls uint64 `json:"window_calls"`
	// Recent is Failures sampled every Config.Sample, oldest first, the
	// last value being Failures now.
	Recent []uint64 `json:"recent_failures"`
	// Ceiling is the key's fleet-wide ceilings under its effective
	// policy; nil when it has none.
	Ceiling *Ceiling `json:"ceiling,omitempty"`
	// Degraded is true for this replica's last-known state of the
	// breaker, listed because its shared store did not answer.
	Degraded bool `json:"degraded,omitempty"`
}

// Cooldown is a fleet-wide pushback cool-down in force.
type Cooldown struct {
	Tenant string    `json:"tenant"`
	Target string    `json:"target"`
	Until  time.Time `json:"until"`
}

// Tenant is one tenant's retry budget.
type Tenant struct {
	Tenant   string  `json:"tenant"`
	Tokens   float64 `json:"tokens"`
	Capacity float64 `json:"capacity"`
	Granted  uint64  `json:"granted"`
	Refused  uint64  `json:"refused"`
	DryRun   bool    `json:"dry_run"`
	Default  bool    `json:"default"` // no budget set: the default applies
}

// Run is a batch run whose cut-off is ahead.
type Run struct {
	ID          string    `json:"id"`
	Tenant      string    `json:"tenant"`
	Description string    `json:"description,omitempty"`
	Pool        uint64    `json:"retry_pool"`
	Spent       uint64    `json:"retries_spent"`
	Created     time.Time `json:"created"`
	Cutoff      time.Time `json:"cutoff"`
	Ledger      Ledger    `json:"ledger"`
}

// Ledger counts a run's final dispositions.
type Ledger struct {
	Succeeded      uint64      `json:"succeeded"`
	FailedTerminal uint64      `json:"failed_terminal"`
	DeadLetter     DeadLetters `json:"dead_letter"`
	CircuitOpen    uint64      `json:"circuit_open"`
	DeadlineCut    uint64      `json:"deadline_cut"`
}

// DeadLetters counts a run's dead-lettered calls by reason.
type DeadLetters struct {
	Exhausted     uint64 `json:"attempts_exhausted"`
	Budget        uint64 `json:"budget_exhausted"`
	NotIdempotent uint64 `json:"not_idempotent"`
	Pushback      uint64 `json:"server_pushback"`
}

// Total is the number of dead-lettered calls.
func (d DeadLetters) Total() uint64 { return d.Exhausted + d.Budget + d.NotIdempotent + d.Pushback }

// Total is the number of calls with a final disposition.
func (l Ledger) Total() uint64 {
	return l.Succeeded + l.FailedTerminal + l.DeadLetter.Total() + l.CircuitOpen + l.DeadlineCut
}

// severity orders breaker states on the page: what needs eyes first.
var severity = []policy.BreakerState{policy.BreakerOpen, policy.BreakerHalfOpen, policy.BreakerDisabled, policy.BreakerClosed}

// breakers lists up to cfg.MaxBreakers breakers, most severe state first.
func (p *Page) breakers() ([]policy.BreakerSnapshot, error) {
	var out []policy.BreakerSnapshot
	for _, st := range severity {
		left := p.cfg.MaxBreakers - len(out)
		if left <= 0 {
			break
		}
		bs, err := p.cfg.Source.Breakers("", st, policy.BreakerKey{}, left)
		if err != nil {
			return out, err
		}
		out = append(out, bs...)
	}
	return out, nil
}

// status reads the source into a Status.
func (p *Page) status() Status {
	now := p.cfg.Clock.Now()
	st := Status{Time: now, Breakers: []Breaker{}, Cooldowns: []Cooldown{}, Tenants: []Tenant{}, Runs: []Run{},
		Escalations: []Escalation{}, Replicas: []Replica{}}
	if p.cfg.Health != nil {
		h := p.cfg.Health()
		h.State, h.Up = p.hist.storeState(now, h.FlushErrors), !h.Degraded
		if h.Degraded {
			h.State = "DEGRADED"
		}
		st.Store = &h
	}
	if p.cfg.Replicas != nil {
		rs, err := p.cfg.Replicas.Replicas()
		if err != nil {
			st.Errors = append(st.Errors, "replicas: "+err.Error())
		}
		st.Replicas = append(st.Replicas, rs...)
	}
	snaps, err := p.breakers()
	if err != nil {
		st.Errors = append(st.Errors, "breakers: "+err.Error())
	}
	for _, s := range snaps {
		b := Breaker{Tenant: s.Key.Tenant, Target: s.Key.Target, State: s.State.String(), Forced: s.Forced,
			Since: s.Changed, ProbesInFlight: s.ProbesInFlight, Mode: s.Mode.String(),
			Failures: failures(s), WindowCalls: s.WindowCalls, Degraded: s.Degraded}
		if s.State == policy.BreakerOpen && !s.Forced && !s.OpenUntil.IsZero() {
			until := s.OpenUntil
			b.OpenUntil = &until
		}
		b.Recent = append(p.hist.recent(s.Key), b.Failures)
		if pol, _ := p.cfg.Source.Resolve(s.Key.Tenant, s.Key.Target); pol.FlowControlled() {
			pool, err := p.cfg.Source.Pool(s.Key)
			if err != nil {
				st.Errors = append(st.Errors, "ceiling of "+s.Key.Tenant+"/"+s.Key.Target+": "+err.Error())
			}
			b.Ceiling = ceilingOf(&pol, pool)
		}
		st.Breakers = append(st.Breakers, b)
		if s.CooldownUntil.After(now) {
			st.Cooldowns = append(st.Cooldowns, Cooldown{Tenant: s.Key.Tenant, Target: s.Key.Target, Until: s.CooldownUntil})
		}
	}
	if st.Escalations, err = p.escalations(snaps); err != nil {
		st.Errors = append(st.Errors, "policies: "+err.Error())
	}
	if st.Store != nil {
		st.BreakersOmitted = max(0, st.Store.Breakers-len(st.Breakers))
	}
	slices.SortFunc(st.Cooldowns, func(a, b Cooldown) int { return b.Until.Compare(a.Until) })

	budgets, err := p.cfg.Source.Budgets("", p.cfg.MaxTenants+1)
	if err != nil {
		st.Errors = append(st.Errors, "tenants: "+err.Error())
	}
	if len(budgets) > p.cfg.MaxTenants {
		budgets, st.TenantsOmitted = budgets[:p.cfg.MaxTenants], true
	}
	for _, b := range budgets {
		st.Tenants = append(st.Tenants, Tenant{Tenant: b.Budget.Tenant, Tokens: b.Tokens, Capacity: b.Budget.Capacity,
			Granted: b.Granted, Refused: b.Refused, DryRun: b.Budget.DryRun, Default: b.IsDefault})
	}

	runs, err := p.cfg.Source.Runs("", "", 0)
	if err != nil {
		st.Errors = append(st.Errors, "runs: "+err.Error())
	}
	for _, r := range runs {
		if !r.Cutoff.After(now) {
			continue
		}
		if len(st.Runs) == p.cfg.MaxRuns {
			st.RunsOmitted = true
			break
		}
		st.Runs = append(st.Runs, runOf(&r))
	}
	slices.SortFunc(st.Runs, func(a, b Run) int { return cmp.Or(b.Created.Compare(a.Created), cmp.Compare(a.ID, b.ID)) })
	return st
}

// runOf is r as the page shows it.
func runOf(r *policy.Run) Run {
	l := r.Ledger
	return Run{ID: r.ID, Tenant: r.Tenant, Description: r.Description, Pool: r.Pool, Spent: r.Spent,
		Created: r.Created, Cutoff: r.Cutoff, Ledger: Ledger{
			Succeeded: l.Succeeded, FailedTerminal: l.FailedTerminal, CircuitOpen: l.CircuitOpen, DeadlineCut: l.DeadlineCut,
			DeadLetter: DeadLetters{Exhausted: l.DeadLetterExhausted, Budget: l.DeadLetterBudget,
				NotIdempotent: l.DeadLetterNotIdempotent, Pushback: l.DeadLetterPushback},
		}}
}

// failures is the count s's mode trips on.
func failures(s policy.BreakerSnapshot) uint64 {
	if s.Mode == policy.BreakerFailureRate {
		return s.WindowFailures
	}
	return uint64(max(0, s.ConsecutiveFailures))
}
