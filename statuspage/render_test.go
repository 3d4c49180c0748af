package statuspage

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/policyd/policyd/policy"
)

func TestSparklineScalesToItsPeak(t *testing.T) {
	for _, samples := range [][]uint64{{0}, {0, 0, 0}, {1, 2, 3}, {9, 0, 4, 9}, {5}, {0, 1000000}} {
		pts := strings.Fields(sparkline(samples))
		if len(pts) != len(samples) {
			t.Fatalf("%v: got %d points, want %d", samples, len(pts), len(samples))
		}
		peak := uint64(0)
		for _, v := range samples {
			peak = max(peak, v)
		}
		for i, p := range pts {
			var x, y float64
			if _, err := fmt.Sscanf(p, "%g,%g", &x, &y); err != nil {
				t.Fatalf("%v: point %q: %v", samples, p, err)
			}
			if x < 0 || x > sparkW || y < 1 || y > sparkH-1 {
				t.Errorf("%v: point %q outside the %gx%g box (1 unit margin)", samples, p, sparkW, sparkH)
			}
			if samples[i] == peak && peak > 0 && y != 1 {
				t.Errorf("%v: the peak %d at y %g, want the top (1)", samples, peak, y)
			}
			if samples[i] == 0 && y != sparkH-1 {
				t.Errorf("%v: a zero at y %g, want the bottom (%g)", samples, y, sparkH-1)
			}
		}
		if len(pts) > 1 && !strings.HasPrefix(pts[len(pts)-1], fmt.Sprintf("%.1f,", sparkW)) {
			t.Errorf("%v: the last point %q is not at the right edge", samples, pts[len(pts)-1])
		}
	}
	if got := sparkline(nil); got != "" {
		t.Errorf("no samples: got %q, want no points", got)
	}
}

func TestLedgerBarFillsTheBarInOrder(t *testing.T) {
	l := Ledger{Succeeded: 120, FailedTerminal: 9, DeadLetter: DeadLetters{Exhausted: 14, Budget: 3}, CircuitOpen: 7}
	segs := ledgerBar(l)
	var names []string
	x := 0.0
	for _, s := range segs {
		names = append(names, fmt.Sprintf("%s %d", s.Class, s.N))
		if math.Abs(s.X-x) > 1e-9 {
			t.Errorf("%s starts at %g, want %g (right after the one before)", s.Class, s.X, x)
		}
		x += s.W
	}
	if got, want := strings.Join(names, ", "), "succeeded 120, terminal 9, deadletter 17, circuit 7"; got != want {
		t.Errorf("segments: got %s, want %s (empty ones left out)", got, want)
	}
	if math.Abs(x-100) > 1e-9 {
		t.Errorf("segments add up to %g%%, want 100%%", x)
	}
	if segs := ledgerBar(Ledger{}); segs != nil {
		t.Errorf("empty ledger: got %+v, want no segment", segs)
	}
}

func TestCeilingOfAnAdaptivePool(t *testing.T) {
	p := policy.Default()
	p.Flow = policy.FlowConfig{MaxInFlight: 10, Adaptive: policy.Adaptive{Enabled: true, Min: 3}}
	for _, tc := range []struct {
		name     string
		adaptive float64
		want     Ceiling
	}{
		{"not started: at the maximum", 0, Ceiling{InFlight: 2, Limit: 10, MaxInFlight: 10, Adaptive: true, AdaptiveMin: 3}},
		{"shrunk: rounded down", 7.6, Ceiling{InFlight: 2, Limit: 7, MaxInFlight: 10, Adaptive: true, AdaptiveMin: 3, AdaptiveLimit: 7.6}},
		{"below the floor: the floor", 2.5, Ceiling{InFlight: 2, Limit: 3, MaxInFlight: 10, Adaptive: true, AdaptiveMin: 3, AdaptiveLimit: 2.5}},
	} {
		got := ceilingOf(&p, policy.PoolStatus{InFlight: 2, Adaptive: tc.adaptive})
		if got == nil || *got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got := ceilingOf(new(policy.Default()), policy.PoolStatus{}); got != nil {
		t.Errorf("no ceiling: got %+v, want nil", got)
	}
}
