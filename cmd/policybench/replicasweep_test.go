package main

import "testing"

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
