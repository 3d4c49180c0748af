package main

import (
	"math"
	"testing"
	"time"
)

// TestMachineBound checks the sweep's account of the machine's CPU: every
// process's CPU per request summed, Redis's only where there is one, and
// the req/s the cores allow at that cost against the req/s measured.
func TestMachineBound(t *testing.T) {
	for _, tc := range []struct {
		name      string
		row       fleetRow
		cores     int
		wantCPU   float64
		wantBound string
	}{
		{"three replicas", fleetRow{RPS: 9000, ServerCPUus: 120, RedisCPUus: 30, ClientCPUus: 50}, 2, 200, "at most 10000 req/s, 90%"},
		{"one daemon, no Redis", fleetRow{RPS: 20000, ServerCPUus: 40, RedisCPUus: -1, ClientCPUus: 40}, 2, 80, "at most 25000 req/s, 80%"},
		{"server not read", fleetRow{RPS: 1, ServerCPUus: -1, RedisCPUus: 30, ClientCPUus: 50}, 2, -1, "-"},
		{"client not read", fleetRow{RPS: 1, ServerCPUus: 120, RedisCPUus: 30, ClientCPUus: -1}, 2, -1, "-"},
	} {
		if got := tc.row.machineCPUus(); got != tc.wantCPU {
			t.Errorf("%s: machineCPUus() = %v, want %v", tc.name, got, tc.wantCPU)
		}
		if got := fmtBound(tc.row, tc.cores); got != tc.wantBound {
			t.Errorf("%s: fmtBound = %q, want %q", tc.name, got, tc.wantBound)
		}
	}
}

// TestCombineTakesTheWindowsAsOne checks that a phase measured in two
// windows is reported as the two taken together: req/s over their time,
// p99 of their latencies merged, CPU per request weighted by each
// window's requests, counts summed, and an unknown reading unknown.
func TestCombineTakesTheWindowsAsOne(t *testing.T) {
	lat := func(d time.Duration, n int) *hist {
		h := new(hist)
		for range n {
			h.record(d)
		}
		return h
	}
	fast := fleetRow{Callers: 64, Phase: "nextdelay", Requests: 300, RPS: 300, P99us: 1000, ServerCPUus: 100, ClientCPUus: 50, RedisCPUus: 30,
		Stolen: 0.1, AuditDropped: 0, Downs: 0, RedisCalls: 900, RedisByCmd: map[string]uint64{"fcall": 300},
		Trips: map[string]uint64{"pipeline policyd_nextdelay": 40}, RequestTrips: 40, Handled: 300}
	fast.win = window{elapsed: time.Second, serverCPU: -1, commits: -1}
	fast.win.hists[rpcNextDelay] = lat(time.Millisecond, 300)
	slow := fleetRow{Callers: 64, Phase: "nextdelay", Requests: 100, RPS: 100, P99us: 100_000, ServerCPUus: 200, ClientCPUus: 70, RedisCPUus: 40,
		Stolen: 0.3, AuditDropped: 2, Downs: 1, RedisCalls: 300, RedisByCmd: map[string]uint64{"fcall": 100, "time": 100},
		Trips: map[string]uint64{"pipeline policyd_nextdelay": 10}, RequestTrips: 10, Handled: 100}
	slow.win = window{elapsed: time.Second, serverCPU: -1, commits: -1}
	slow.win.hists[rpcNextDelay] = lat(100*time.Millisecond, 100)

	c := combine([]fleetRow{fast, slow})
	if c.Requests != 400 || c.RPS != 200 {
		t.Errorf("requests %d at %v/s, want 400 at 200/s", c.Requests, c.RPS)
	}
	// 100 of 400 latencies at 100 ms: the p99 is one of them, not the
	// 1 ms of the larger window.
	if c.P99us < 90_000 || c.P99us > 110_000 {
		t.Errorf("p99 %vµs, want about 100 ms", c.P99us)
	}
	if c.ServerCPUus != 125 || c.ClientCPUus != 55 || c.RedisCPUus != 32.5 {
		t.Errorf("CPU per request: server %v, client %v, Redis %v; want 125, 55, 32.5", c.ServerCPUus, c.ClientCPUus, c.RedisCPUus)
	}
	if math.Abs(c.Stolen-0.2) > 1e-9 || c.AuditDropped != 2 || c.Downs != 1 {
		t.Errorf("stolen %v, audit dropped %d, downs %d; want 0.2, 2, 1", c.Stolen, c.AuditDropped, c.Downs)
	}
	if c.RedisCalls != 1200 || c.RedisByCmd["fcall"] != 400 || c.RedisByCmd["time"] != 100 ||
		c.Trips["pipeline policyd_nextdelay"] != 50 || c.RequestTrips != 50 || c.Handled != 400 {
		t.Errorf("counts not summed: %d calls, %v, %v, %d request trips, %d handled", c.RedisCalls, c.RedisByCmd, c.Trips, c.RequestTrips, c.Handled)
	}
	if len(c.rounds) != 2 || fmtRoundRatios(c.rounds, c.rounds) != "1.00x/1.00x 1.00x/1.00x" {
		t.Errorf("rounds %d, ratios %q", len(c.rounds), fmtRoundRatios(c.rounds, c.rounds))
	}

	slow.RedisCPUus, slow.Stolen, slow.Downs = -1, -1, -1
	c = combine([]fleetRow{fast, slow})
	if c.RedisCPUus != -1 || c.Stolen != -1 || c.Downs != -1 {
		t.Errorf("a window not read: Redis CPU %v, stolen %v, downs %d; want -1 each", c.RedisCPUus, c.Stolen, c.Downs)
	}
	if one := combine([]fleetRow{fast}); one.RPS != 300 || one.rounds != nil {
		t.Errorf("one window: %v/s, %d rounds; want itself", one.RPS, len(one.rounds))
	}
}
