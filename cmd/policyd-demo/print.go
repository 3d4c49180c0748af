package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// printer writes progress lines, stamped with the time since the start of
// the batch; it is safe for concurrent use.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) line(at time.Duration, format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "%6.1fs  %s\n", at.Seconds(), fmt.Sprintf(format, args...))
}

func (p *printer) text(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

func (d *demo) header(sum *demoSummary, up *upstream, addr string, run *pb.Run) {
	cfg, p, s := d.cfg, d.cfg.Policy, d.cfg.Upstream
	where := "embedded on " + addr + ", state in " + sum.StateFile + " (removed at the end)"
	if cfg.Addr != "" {
		where = "the running policyd at " + addr
	}
	d.pr.text("policyd demo: %d documents, %d workers, seed %d\n", cfg.Docs, cfg.Workers, cfg.Seed)
	d.pr.text("  upstream  %s, a fake flaky API: per request %.1f%% 429 (Retry-After: %d), %.1f%% 503, %.1f%% hang %s;\n"+
		"            %.0f%% of documents malformed (400); outage at %s: 503 for %s, then connection refused for %s\n",
		up.URL(), 100*s.P429, int(s.RetryAfter.Seconds()), 100*s.P503, 100*s.PHang, s.Hang,
		100*cfg.PBad, s.OutageAt, s.Outage503, s.OutageRefused)
	d.pr.text("  policyd   %s\n", where)
	d.pr.text("  policy    tenant %s, target %s: %d attempts, backoff %s x 2^n (cap %s, full jitter), attempt timeout %s,\n"+
		"            breaker opens after %d transient failures in a row, stays open %s, then lets %d probe through\n",
		cfg.Tenant, cfg.Target, p.MaxAttempts, p.Base, p.Cap, p.AttemptTimeout, p.Threshold, p.Cooldown, p.Probes)
	d.pr.text("  run       %s: retry pool %d (3 x %d documents), cut-off in %s\n",
		run.GetRunId(), run.GetRetryPool(), cfg.Docs, cfg.Cutoff)
	d.pr.text("  feed      documents released evenly over %s; every document is one policyclient.Do call\n\n", cfg.Feed)
}

func (s *demoSummary) print(w io.Writer) {
	l, c, sv, u := s.Ledger, s.Client, s.Saved, s.Upstream
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "NO"
	}
	fmt.Fprintf(w, "\nRun reconciliation (AdminService.GetRun %s)\n", s.RunID)
	for _, r := range []struct {
		name string
		v    uint64
		note string
	}{
		{"succeeded", l.Succeeded, ""}, {"failed terminal", l.FailedTerminal, ""},
		{"dead letter: attempts exhausted", l.DeadLetterExhausted, ""}, {"dead letter: budget", l.DeadLetterBudget, ""},
		{"dead letter: not idempotent", l.DeadLetterNotIdempotent, ""}, {"dead letter: server pushback", l.DeadLetterPushback, ""},
		{"circuit open", l.CircuitOpen, ""}, {"deadline cut", l.DeadlineCut, ""},
		{"total", l.total(), fmt.Sprintf("  (of %d documents)", s.Docs)},
		{"retries spent", l.RetriesSpent, fmt.Sprintf("  (of a pool of %d)", l.RetryPool)},
	} {
		fmt.Fprintf(w, "  %-32s %6d%s\n", r.name, r.v, r.note)
	}
	fmt.Fprintf(w, "  every count equals the workers' own Results: %s\n", yes(s.LedgerMatches))
	if !s.LedgerMatches {
		fmt.Fprintf(w, "  the workers counted %+v\n", s.ClientLedger)
	}

	fmt.Fprintf(w, "\nFinal dispositions (policyclient Results, one per document)\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  DISPOSITION\tSTOP REASON\tDOCS\tUPSTREAM CALLS\tLAST FAILURE OR REFUSAL (docs)")
	total := 0
	for _, r := range s.Dispositions {
		total += r.Docs
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\n", r.Disposition, orDash(r.StopReason), r.Docs, r.Attempts, histogram(r.LastFailures))
	}
	fmt.Fprintf(tw, "  total\t\t%d\t%d\t\n", total, c.Attempts)
	tw.Flush()

	inOutage := 0
	for _, t := range s.Breaker.Transitions {
		if t.To == "OPEN" && t.At >= u.OutageStart && t.At <= u.OutageEnd {
			inOutage++
		}
	}
	fmt.Fprintf(w, "\nBreaker %s/%s (WatchBreakers): opened %s, %d of them during the outage\n",
		s.Policy.Tenant, s.Policy.Target, plural(s.Breaker.Opened, "time"), inOutage)
	var steps []string
	for _, t := range s.Breaker.Transitions {
		steps = append(steps, fmt.Sprintf("%.1fs %s", t.At, t.To))
	}
	if len(steps) > 0 {
		fmt.Fprintf(w, "  %s\n", strings.Join(steps, " -> "))
	}

	uc := u.Counts
	fmt.Fprintf(w, "\nUpstream (counted by the fake server; refusals and timeouts by the workers)\n")
	fmt.Fprintf(w, "  requests   %d: 200 x %d, 200 replayed x %d, 429 x %d (Retry-After windows opened: %d), 503 flaky x %d,\n"+
		"             503 outage x %d, 400 x %d, hung x %d\n", uc.Requests, uc.OK, uc.Replays, uc.Throttled, uc.RateWindows,
		uc.Flaky503, uc.Outage503, uc.BadRequest, uc.Hung)
	fmt.Fprintf(w, "  workers    connections refused while the port was closed: %d; attempts timed out (%gs): %d\n",
		u.ConnectionsRefused, s.Policy.AttemptTimeoutSeconds, u.Timeouts)
	fmt.Fprintf(w, "  writes     applied: %d, applied twice: %d; retries of a write applied before its answer was lost,\n"+
		"             answered from the idempotency-key cache instead of writing again: %d\n",
		uc.WritesApplied, uc.DuplicateWrites, uc.Replays)

	fmt.Fprintf(w, "\nUpstream calls the breaker and the cool-down saved (all measured in this run)\n")
	fmt.Fprintf(w, "  breaker    %s ended CIRCUIT_OPEN having made %s; at %d attempts each they were\n"+
		"             allowed %d: %s not made. %d were refused before their first call, %d after a failed one.\n"+
		"             Of the refusals, %d were fast-fails from the client's WatchBreakers cache (Stats.FastFails:\n"+
		"             no RPC, no call), %d Admit refusals (OPEN, or every probe permit taken), %d NextDelay stops.\n",
		plural(sv.CircuitOpenDocs, "document"), plural(sv.CircuitOpenCalls, "call"), s.Policy.MaxAttempts,
		s.Policy.MaxAttempts*sv.CircuitOpenDocs, plural(sv.CircuitOpenNotMade, "call"), sv.RefusedBeforeCall, sv.StoppedAfterCall, sv.FastFails, sv.AdmitRefusals,
		sv.NextDelayStops)
	pct := 0.0
	if sv.NaiveCalls > 0 {
		pct = 100 * float64(sv.SavedCalls) / float64(sv.NaiveCalls)
	}
	fmt.Fprintf(w, "  outage     %.1fs-%.1fs (503, then connection refused): %s started in it. A naive loop\n"+
		"             (%d attempts at %s, no breaker) sends them %s before the outage\n"+
		"             ends; through policyd they sent %d: %d fewer (%.0f%%).\n",
		u.OutageStart, u.OutageEnd, plural(sv.DocsInOutage, "document"), s.Policy.MaxAttempts, sv.NaiveSchedule,
		plural(sv.NaiveCalls, "call"), sv.ActualCalls, sv.SavedCalls, pct)
	fmt.Fprintf(w, "  cool-down  Retry-After windows the upstream opened with a 429 (it answers 429 to every call inside\n"+
		"             one): %d. Attempts that waited at Admit for the fleet-wide cool-down instead of calling into a\n"+
		"             window: %d (%.1fs of waiting in all). Requests that arrived inside a window all the same: %d.\n",
		uc.RateWindows, sv.CooldownWaits, sv.CooldownWaitSeconds, uc.InsideWindow)
	if sv.CooldownBurst > 0 {
		fmt.Fprintf(w, "             The waiting attempts went out together when a cool-down ended: the largest burst was\n"+
			"             %d calls within %s, at %.1fs.\n", sv.CooldownBurst, burstSpan, sv.CooldownBurstAt)
	}

	fmt.Fprintf(w, "\nClient (policyclient Stats): %d calls, %d attempts, %d Admit RPCs, %d fast fails, %d local decisions, "+
		"%d outcomes sent, %d dropped\n", c.Calls, c.Attempts, c.AdmitRPCs, c.FastFails, c.LocalDecisions, c.OutcomesSent, c.OutcomesDropped)
	fmt.Fprintf(w, "The batch took %.1fs.\n", s.DurationSeconds)
}

// plural returns "1 call", "2 calls".
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return strconv.Itoa(n) + " " + word + "s"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// histogram prints counts as "a x 3, b x 1", largest first.
func histogram(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if m[a] != m[b] {
			return m[b] - m[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s (%d)", k, m[k])
	}
	return strings.Join(parts, ", ")
}
