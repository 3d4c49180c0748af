package statuspage

import (
	"fmt"
	"html/template"
	"slices"
	"strconv"
	"strings"
	"time"
)

// funcs are the page template's helpers; each is a pure function of its
// arguments.
var funcs = template.FuncMap{
	"age":        age,
	"until":      func(now, t time.Time) string { return age(t, now) },
	"stamp":      func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"clock":      func(t time.Time) string { return t.UTC().Format("15:04:05 UTC") },
	"sparkline":  sparkline,
	"ledgerBar":  ledgerBar,
	"tokens":     func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"lower":      strings.ToLower,
	"mul":        func(a, b float64) float64 { return a * b },
	"scopeLabel": scopeLabel,
	"ceilings":   ceilings,
	"lastKnown":  lastKnown,
	"runPath":    runPath,
	"rate":       func(f float64) string { return strconv.FormatFloat(f, 'g', 4, 64) },
	"orClosed": func(s string) string {
		if s == "" {
			return "CLOSED"
		}
		return s
	},
	"orDash": func(s string) string {
		if s == "" || s == "UNSPECIFIED" {
			return "—"
		}
		return s
	},
}

// age is how long before now t was, to the second ("3m12s"); "—" for the
// zero time.
func age(now, t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := now.Sub(t).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String()
}

// scopeLabel names a breaker's tenant; a target-scoped breaker has none.
func scopeLabel(tenant string) string {
	if tenant == "" {
		return "(every tenant)"
	}
	return tenant
}

// Sparkline geometry, in SVG user units.
const sparkW, sparkH = 120.0, 24.0

// sparkline returns the points of an SVG polyline drawing samples, oldest
// at the left, scaled so the largest touches the top (a flat line at the
// bottom when all are zero).
func sparkline(samples []uint64) string {
	if len(samples) == 0 {
		return ""
	}
	peak := uint64(1)
	for _, v := range samples {
		peak = max(peak, v)
	}
	step := 0.0
	if len(samples) > 1 {
		step = sparkW / float64(len(samples)-1)
	}
	var b strings.Builder
	for i, v := range samples {
		if i > 0 {
			b.WriteByte(' ')
		}
		y := sparkH - 1 - (sparkH-2)*float64(v)/float64(peak)
		fmt.Fprintf(&b, "%.1f,%.1f", float64(i)*step, y)
	}
	return b.String()
}

// segment is one disposition's part of a run's ledger bar.
type segment struct {
	Class, Label string
	N            uint64
	X, W         float64 // in percent of the bar
}

// ledgerBar splits a ledger into the segments of a stacked bar, in a fixed
// order, leaving out the empty ones.
func ledgerBar(l Ledger) []segment {
	parts := []segment{
		{Class: "succeeded", Label: "succeeded", N: l.Succeeded},
		{Class: "terminal", Label: "failed terminal", N: l.FailedTerminal},
		{Class: "deadletter", Label: "dead letter", N: l.DeadLetter.Total()},
		{Class: "circuit", Label: "circuit open", N: l.CircuitOpen},
		{Class: "cut", Label: "deadline cut", N: l.DeadlineCut},
	}
	total := l.Total()
	if total == 0 {
		return nil
	}
	out := parts[:0]
	x := 0.0
	for _, s := range parts {
		if s.N == 0 {
			continue
		}
		s.X, s.W = x, 100*float64(s.N)/float64(total)
		x += s.W
		out = append(out, s)
	}
	return out
}

// lastKnown reports whether any of bs is the replica's last-known state,
// listed while its store did not answer.
func lastKnown(bs []Breaker) bool {
	return slices.ContainsFunc(bs, func(b Breaker) bool { return b.Degraded })
}

// ceilings returns the breakers that have a ceiling, in their order.
func ceilings(bs []Breaker) []Breaker {
	var out []Breaker
	for _, b := range bs {
		if b.Ceiling != nil {
			out = append(out, b)
		}
	}
	return out
}
