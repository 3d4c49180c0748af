package policy_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/policyd/policyd/policy"
)

const maxDuration = time.Duration(math.MaxInt64)

func TestNominal(t *testing.T) {
	def := policy.Default().Backoff
	tests := []struct {
		name  string
		b     policy.Backoff
		retry int
		want  time.Duration
	}{
		{"retry 0 is base", def, 0, 500 * time.Millisecond},
		{"retry 1", def, 1, time.Second},
		{"retry 2", def, 2, 2 * time.Second},
		{"retry 5", def, 5, 16 * time.Second},
		{"retry 6 capped", def, 6, 30 * time.Second},
		{"retry 1e9 saturates at cap", def, 1_000_000_000, 30 * time.Second},
		{"retry MaxInt saturates at cap", def, math.MaxInt, 30 * time.Second},
		{"negative retry counts as 0", def, -5, 500 * time.Millisecond},
		{"fractional factor", policy.Backoff{Base: time.Second, Factor: 1.5, Max: time.Minute}, 2, 2250 * time.Millisecond},
		{"factor 100", policy.Backoff{Base: time.Millisecond, Factor: 100, Max: time.Hour}, 2, 10 * time.Second},
		{"huge cap never overflows", policy.Backoff{Base: time.Second, Factor: 100, Max: maxDuration}, 1_000_000_000, maxDuration},
		{"no cap saturates", policy.Backoff{Base: time.Second, Factor: 2}, 100, maxDuration},
		{"base 0 gives 0", policy.Backoff{Factor: 2, Max: time.Second}, 3, 0},
		{"NaN factor counts as 1", policy.Backoff{Base: time.Second, Factor: math.NaN(), Max: time.Minute}, 9, time.Second},
		{"Inf factor hits cap", policy.Backoff{Base: time.Second, Factor: math.Inf(1), Max: time.Minute}, 1, time.Minute},
		{"base above cap gives cap", policy.Backoff{Base: time.Hour, Factor: 2, Max: time.Minute}, 0, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := policy.Nominal(tt.b, tt.retry); got != tt.want {
				t.Errorf("Nominal(%+v, %d) = %v, want %v", tt.b, tt.retry, got, tt.want)
			}
		})
	}
}

func TestJittered(t *testing.T) {
	with := func(j policy.Jitter) policy.Backoff {
		b := policy.Default().Backoff // base 500ms, factor 2, max 30s
		b.Jitter = j
		return b
	}
	tests := []struct {
		name  string
		b     policy.Backoff
		retry int
		prev  time.Duration
		u     float64
		want  time.Duration
	}{
		{"none is nominal", with(policy.JitterNone), 2, 0, 0.3, 2 * time.Second},
		{"full u=0", with(policy.JitterFull), 2, 0, 0, 0},
		{"full u=0.5", with(policy.JitterFull), 2, 0, 0.5, time.Second},
		{"full u=1 clamps to nominal", with(policy.JitterFull), 2, 0, 1.5, 2 * time.Second},
		{"full negative u counts as 0", with(policy.JitterFull), 2, 0, -1, 0},
		{"full NaN u counts as 0", with(policy.JitterFull), 2, 0, math.NaN(), 0},
		{"unspecified is full", with(policy.JitterUnspecified), 2, 0, 0.25, 500 * time.Millisecond},
		{"unknown is full", with(policy.Jitter(42)), 2, 0, 0.25, 500 * time.Millisecond},
		{"equal u=0 is half", with(policy.JitterEqual), 2, 0, 0, time.Second},
		{"equal u=0.5", with(policy.JitterEqual), 2, 0, 0.5, 1500 * time.Millisecond},
		{"equal at cap", with(policy.JitterEqual), 40, 0, 0.5, 22500 * time.Millisecond},
		{"decorrelated no prev is base", with(policy.JitterDecorrelated), 3, 0, 0.9, 500 * time.Millisecond},
		{"decorrelated small prev is base", with(policy.JitterDecorrelated), 3, 100 * time.Millisecond, 0.9, 500 * time.Millisecond},
		{"decorrelated u=0.5", with(policy.JitterDecorrelated), 3, time.Second, 0.5, 1750 * time.Millisecond},
		{"decorrelated capped by nominal", with(policy.JitterDecorrelated), 0, 10 * time.Second, 0.5, 500 * time.Millisecond},
		{"decorrelated huge prev", with(policy.JitterDecorrelated), 10, maxDuration, 0.99, 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := policy.Jittered(tt.b, tt.retry, tt.prev, tt.u); got != tt.want {
				t.Errorf("Jittered(%+v, %d, %v, %v) = %v, want %v", tt.b, tt.retry, tt.prev, tt.u, got, tt.want)
			}
		})
	}
}

// randomBackoff returns a valid backoff with the given jitter.
func randomBackoff(r *rand.Rand, j policy.Jitter) policy.Backoff {
	base := time.Duration(1 + r.Int64N(int64(time.Hour)))
	return policy.Backoff{
		Base:   base,
		Factor: 1 + 99*r.Float64() + 1e-9,
		Max:    base + time.Duration(r.Int64N(int64(100*time.Hour))),
		Jitter: j,
	}
}

// randomRetry returns small retry counts mostly and huge ones sometimes.
func randomRetry(r *rand.Rand) int {
	if r.IntN(10) == 0 {
		return r.IntN(math.MaxInt)
	}
	return r.IntN(64)
}

func TestJitteredStaysUnderNominal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	jitters := []policy.Jitter{policy.JitterUnspecified, policy.JitterNone, policy.JitterFull, policy.JitterEqual, policy.JitterDecorrelated}
	for _, j := range jitters {
		t.Run(j.String(), func(t *testing.T) {
			for range 20000 {
				b := randomBackoff(r, j)
				n := randomRetry(r)
				prev := time.Duration(r.Int64N(int64(1000 * time.Hour)))
				if r.IntN(20) == 0 {
					prev = maxDuration - time.Duration(r.Int64N(1000))
				}
				u := r.Float64()
				got := policy.Jittered(b, n, prev, u)
				nominal := policy.Nominal(b, n)
				lo := time.Duration(0)
				if j == policy.JitterEqual {
					lo = nominal / 2
				}
				if got < lo || got > nominal {
					t.Fatalf("Jittered(%+v, %d, %v, %v) = %v, want in [%v, %v]", b, n, prev, u, got, lo, nominal)
				}
				if nominal > b.Max || nominal < 0 {
					t.Fatalf("Nominal(%+v, %d) = %v, want in [0, %v]", b, n, nominal, b.Max)
				}
			}
		})
	}
}

func TestNominalIsMonotonic(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		b := randomBackoff(r, policy.JitterNone)
		prev := policy.Nominal(b, 0)
		if prev != b.Base {
			t.Fatalf("Nominal(%+v, 0) = %v, want %v", b, prev, b.Base)
		}
		for n := 1; n < 80; n++ {
			got := policy.Nominal(b, n)
			if got < prev {
				t.Fatalf("Nominal(%+v, %d) = %v, want >= Nominal(%d) = %v", b, n, got, n-1, prev)
			}
			prev = got
		}
		if got := policy.Nominal(b, 1<<40); got != b.Max {
			t.Fatalf("Nominal(%+v, 1<<40) = %v, want the cap %v", b, got, b.Max)
		}
	}
}

func nan() float64 { return math.NaN() }
