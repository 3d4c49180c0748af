package main

import (
	"slices"
	"strings"
	"time"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// demoSummary is what the demo measured. Times are seconds from the start
// of the batch.
type demoSummary struct {
	Docs            int               `json:"docs"`
	Workers         int               `json:"workers"`
	Seed            uint64            `json:"seed"`
	Policyd         string            `json:"policyd"` // "embedded" or the address
	StateFile       string            `json:"state_file,omitempty"`
	RunID           string            `json:"run_id"`
	DurationSeconds float64           `json:"duration_seconds"`
	Policy          demoPolicySummary `json:"policy"`
	Ledger          demoLedger        `json:"ledger"`        // AdminService.GetRun
	ClientLedger    demoLedger        `json:"client_ledger"` // the same counts from the workers' Results
	LedgerMatches   bool              `json:"ledger_matches_client"`
	Dispositions    []dispositionRow  `json:"dispositions"`
	Upstream        demoUpstream      `json:"upstream"`
	Client          demoClientStats   `json:"client"`
	Breaker         demoBreaker       `json:"breaker"`
	Saved           demoSaved         `json:"saved"`

	docs []docOutcome // one per document, in document order
}

type demoPolicySummary struct {
	Tenant                string  `json:"tenant"`
	Target                string  `json:"target"`
	MaxAttempts           int     `json:"max_attempts"`
	BaseSeconds           float64 `json:"base_delay_seconds"`
	CapSeconds            float64 `json:"max_delay_seconds"`
	AttemptTimeoutSeconds float64 `json:"attempt_timeout_seconds"`
	BreakerThreshold      int     `json:"breaker_consecutive_failures"`
	CooldownSeconds       float64 `json:"breaker_cooldown_seconds"`
	Probes                int     `json:"half_open_probes"`
}

type demoLedger struct {
	Succeeded               uint64 `json:"succeeded"`
	FailedTerminal          uint64 `json:"failed_terminal"`
	DeadLetterExhausted     uint64 `json:"dead_letter_exhausted"`
	DeadLetterBudget        uint64 `json:"dead_letter_budget"`
	DeadLetterNotIdempotent uint64 `json:"dead_letter_not_idempotent"`
	DeadLetterPushback      uint64 `json:"dead_letter_pushback"`
	CircuitOpen             uint64 `json:"circuit_open"`
	DeadlineCut             uint64 `json:"deadline_cut"`
	RetriesSpent            uint64 `json:"retries_spent,omitempty"`
	RetryPool               uint64 `json:"retry_pool,omitempty"`
}

func (l demoLedger) total() uint64 {
	return l.Succeeded + l.FailedTerminal + l.DeadLetterExhausted + l.DeadLetterBudget +
		l.DeadLetterNotIdempotent + l.DeadLetterPushback + l.CircuitOpen + l.DeadlineCut
}

// counts returns the ledger without the pool, for comparisons.
func (l demoLedger) counts() demoLedger {
	l.RetriesSpent, l.RetryPool = 0, 0
	return l
}

type dispositionRow struct {
	Disposition  string         `json:"disposition"`
	StopReason   string         `json:"stop_reason,omitempty"`
	Docs         int            `json:"docs"`
	Attempts     int            `json:"attempts"`      // calls of the upstream they made
	LastFailures map[string]int `json:"last_failures"` // classification of the last failure -> documents
}

type demoUpstream struct {
	URL                string         `json:"url"`
	OutageStart        float64        `json:"outage_start_seconds"`
	OutageEnd          float64        `json:"outage_end_seconds"`
	Counts             upstreamCounts `json:"counts"`
	ConnectionsRefused int            `json:"connections_refused"` // seen by the workers
	Timeouts           int            `json:"attempt_timeouts"`    // seen by the workers
}

type demoClientStats struct {
	Calls           uint64 `json:"calls"`
	Attempts        uint64 `json:"attempts"`
	AdmitRPCs       uint64 `json:"admit_rpcs"`
	FastFails       uint64 `json:"fast_fails"`
	LocalDecisions  uint64 `json:"local_decisions"`
	OutcomesSent    uint64 `json:"outcomes_sent"`
	OutcomesDropped uint64 `json:"outcomes_dropped"`
}

type breakerTransition struct {
	At        float64 `json:"at_seconds"`
	From      string  `json:"from"`
	To        string  `json:"to"`
	OpenUntil float64 `json:"open_until_seconds,omitempty"`
}

type cooldownStart struct {
	At    float64 `json:"at_seconds"`
	Until float64 `json:"until_seconds"`
}

type demoBreaker struct {
	Opened      int                 `json:"opened"`
	Transitions []breakerTransition `json:"transitions"`
	Cooldowns   []cooldownStart     `json:"cooldowns"`
}

// demoSaved is how many upstream calls the breaker and the cool-down saved,
// and how it is computed (see print).
type demoSaved struct {
	CircuitOpenDocs     int     `json:"circuit_open_docs"`
	CircuitOpenCalls    int     `json:"circuit_open_calls_made"`
	CircuitOpenNotMade  int     `json:"circuit_open_calls_not_made"` // max_attempts x docs - calls made
	RefusedBeforeCall   int     `json:"refused_before_first_call"`
	FastFails           uint64  `json:"fast_fails"`       // client Stats.FastFails: refused from the WatchBreakers cache
	AdmitRefusals       int     `json:"admit_refusals"`   // refused by an Admit RPC (OPEN or probe permits taken)
	NextDelayStops      int     `json:"next_delay_stops"` // NextDelay answered CIRCUIT_OPEN after a failed call
	StoppedAfterCall    int     `json:"stopped_after_a_call"`
	DocsInOutage        int     `json:"docs_started_in_outage"`
	NaiveSchedule       string  `json:"naive_schedule"`
	NaiveCalls          int     `json:"naive_calls_in_outage"`
	ActualCalls         int     `json:"actual_calls_in_outage"`
	SavedCalls          int     `json:"saved_calls_in_outage"`
	CooldownWaits       int     `json:"cooldown_waits"`
	CooldownWaitSeconds float64 `json:"cooldown_wait_seconds"`
	// CooldownBurst is the most calls made right after a cool-down wait
	// that started within burstSpan of each other, at CooldownBurstAt.
	CooldownBurst   int     `json:"cooldown_burst_calls"`
	CooldownBurstAt float64 `json:"cooldown_burst_at_seconds"`
}

// burstSpan is the span within which calls count as one burst.
const burstSpan = 10 * time.Millisecond

// summarize fills sum from the documents' outcomes, the run, the client's
// counters, the breaker watch and the upstream's counters.
func (d *demo) summarize(sum *demoSummary, run *pb.Run, st policyclient.Stats, w *breakerWatch) {
	cfg, p := d.cfg, d.cfg.Policy
	sum.Policy = demoPolicySummary{Tenant: cfg.Tenant, Target: cfg.Target, MaxAttempts: p.MaxAttempts,
		BaseSeconds: p.Base.Seconds(), CapSeconds: p.Cap.Seconds(), AttemptTimeoutSeconds: p.AttemptTimeout.Seconds(),
		BreakerThreshold: p.Threshold, CooldownSeconds: p.Cooldown.Seconds(), Probes: p.Probes}
	l := run.GetLedger()
	sum.Ledger = demoLedger{Succeeded: l.GetSucceeded(), FailedTerminal: l.GetFailedTerminal(),
		DeadLetterExhausted: l.GetDeadLetterExhausted(), DeadLetterBudget: l.GetDeadLetterBudget(),
		DeadLetterNotIdempotent: l.GetDeadLetterNotIdempotent(), DeadLetterPushback: l.GetDeadLetterPushback(),
		CircuitOpen: l.GetCircuitOpen(), DeadlineCut: l.GetDeadlineCut(),
		RetriesSpent: run.GetRetriesSpent(), RetryPool: run.GetRetryPool()}
	sum.Client = demoClientStats{Calls: st.Calls, Attempts: st.Attempts, AdmitRPCs: st.AdmitRPCs, FastFails: st.FastFails,
		LocalDecisions: st.LocalDecisions, OutcomesSent: st.OutcomesSent, OutcomesDropped: st.OutcomesDropped}

	outStart, outEnd := d.up.outage()
	sum.Upstream = demoUpstream{URL: d.up.URL(), OutageStart: outStart.Seconds(), OutageEnd: outEnd.Seconds(),
		Counts: d.up.snapshot()}
	sv := &sum.Saved
	var cl demoLedger
	var refusedAtAdmit int
	var cooldownWait time.Duration
	var released []time.Duration // calls made right after a cool-down wait
	rows := map[[2]string]*dispositionRow{}
	for _, o := range sum.docs {
		r, tr := o.Result, o.Trace
		switch r.Disposition {
		case policyclient.Succeeded:
			cl.Succeeded++
		case policyclient.FailedTerminal:
			cl.FailedTerminal++
		case policyclient.DeadLetter:
			switch r.StopReason {
			case policyclient.StopBudgetExhausted:
				cl.DeadLetterBudget++
			case policyclient.StopNotIdempotent:
				cl.DeadLetterNotIdempotent++
			case policyclient.StopServerPushback:
				cl.DeadLetterPushback++
			default:
				cl.DeadLetterExhausted++
			}
		case policyclient.CircuitOpen:
			cl.CircuitOpen++
		case policyclient.DeadlineCut:
			cl.DeadlineCut++
		}
		k := [2]string{r.Disposition.String(), r.StopReason.String()}
		row := rows[k]
		if row == nil {
			row = &dispositionRow{Disposition: k[0], StopReason: k[1], LastFailures: map[string]int{}}
			rows[k] = row
		}
		row.Docs++
		row.Attempts += len(tr.Attempts)
		if r.Reason != "" {
			row.LastFailures[r.Reason]++
		}
		for _, a := range tr.Attempts {
			if a.AfterCooldown {
				released = append(released, a.At)
			}
			switch a.Outcome {
			case "refused":
				sum.Upstream.ConnectionsRefused++
			case "timeout":
				sum.Upstream.Timeouts++
			}
		}
		if r.Disposition == policyclient.CircuitOpen {
			sv.CircuitOpenDocs++
			sv.CircuitOpenCalls += len(tr.Attempts)
			if len(tr.Attempts) == 0 {
				sv.RefusedBeforeCall++
			} else {
				sv.StoppedAfterCall++
			}
			if strings.HasPrefix(r.Reason, "breaker:") { // refused at admission, not by NextDelay
				refusedAtAdmit++
			}
		}
		sv.CooldownWaits += tr.CooldownWaits
		cooldownWait += tr.CooldownWait
		if tr.Start >= outStart && tr.Start < outEnd {
			sv.DocsInOutage++
			sv.NaiveCalls += naiveCalls(tr.Start, outEnd, p)
			for _, a := range tr.Attempts {
				if a.At < outEnd {
					sv.ActualCalls++
				}
			}
		}
	}
	sv.CircuitOpenNotMade = p.MaxAttempts*sv.CircuitOpenDocs - sv.CircuitOpenCalls
	sv.FastFails = st.FastFails
	sv.AdmitRefusals = refusedAtAdmit - int(st.FastFails)
	sv.NextDelayStops = sv.CircuitOpenDocs - refusedAtAdmit
	sv.NaiveSchedule = naiveSchedule(p)
	sv.SavedCalls = sv.NaiveCalls - sv.ActualCalls
	sv.CooldownWaitSeconds = cooldownWait.Seconds()
	slices.Sort(released)
	for i, j := 0, 0; j < len(released); j++ {
		for released[j]-released[i] > burstSpan {
			i++
		}
		if j-i+1 > sv.CooldownBurst {
			sv.CooldownBurst, sv.CooldownBurstAt = j-i+1, released[i].Seconds()
		}
	}
	sum.ClientLedger = cl
	sum.LedgerMatches = cl == sum.Ledger.counts()

	order := map[string]int{"succeeded": 0, "failed_terminal": 1, "dead_letter": 2, "deadline_cut": 3, "circuit_open": 4}
	for _, row := range rows {
		sum.Dispositions = append(sum.Dispositions, *row)
	}
	slices.SortFunc(sum.Dispositions, func(a, b dispositionRow) int {
		if c := order[a.Disposition] - order[b.Disposition]; c != 0 {
			return c
		}
		return strings.Compare(a.StopReason, b.StopReason)
	})

	w.mu.Lock()
	sum.Breaker = demoBreaker{Transitions: slices.Clone(w.transitions), Cooldowns: slices.Clone(w.cooldowns)}
	w.mu.Unlock()
	for _, t := range sum.Breaker.Transitions {
		if t.To == "OPEN" {
			sum.Breaker.Opened++
		}
	}
}

// naiveCalls is how many calls a naive loop (p.MaxAttempts attempts at the
// policy's nominal backoff, no jitter, no breaker) makes for a document
// started at start before the outage ends at end. Outage answers are
// immediate, so each attempt starts one nominal delay after the previous.
func naiveCalls(start, end time.Duration, p demoPolicy) int {
	n, at, delay := 0, start, p.Base
	for range p.MaxAttempts {
		if at < end {
			n++
		}
		at += delay
		delay = min(2*delay, p.Cap)
	}
	return n
}

// naiveSchedule describes naiveCalls' attempt times, e.g. "t, t+200ms, t+600ms".
func naiveSchedule(p demoPolicy) string {
	parts := []string{"t"}
	at, delay := time.Duration(0), p.Base
	for range p.MaxAttempts - 1 {
		at += delay
		delay = min(2*delay, p.Cap)
		parts = append(parts, "t+"+at.String())
	}
	return strings.Join(parts, ", ")
}
