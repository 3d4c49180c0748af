package policy

import (
	"strings"
	"testing"
)

// TestFallbackTargetFor: attempt n goes to entry min((n-1)/K, last) of the
// chain, the primary skipped among the targets; K = 0 keeps the primary.
func TestFallbackTargetFor(t *testing.T) {
	for _, tt := range []struct {
		name string
		f    Fallback
		want string // targets of attempts 1 to 7
	}{
		{"none", Fallback{}, "a a a a a a a"},
		{"after 1", Fallback{Targets: []string{"b", "c"}, AfterAttempts: 1}, "a b c c c c c"},
		{"after 2", Fallback{Targets: []string{"b", "c"}, AfterAttempts: 2}, "a a b b c c c"},
		{"after 0", Fallback{Targets: []string{"b"}, OnCircuitOpen: true}, "a a a a a a a"},
		{"primary among the targets", Fallback{Targets: []string{"a", "b"}, AfterAttempts: 3}, "a a a b b b b"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for n := 1; n <= 7; n++ {
				got = append(got, tt.f.TargetFor("a", n))
			}
			if s := strings.Join(got, " "); s != tt.want {
				t.Fatalf("got %s, want %s", s, tt.want)
			}
		})
	}
	f := Fallback{Targets: []string{"a", "b", "c"}}
	if n, i, at := f.ChainLen("a"), f.ChainIndex("a", "c"), f.ChainAt("a", 3); n != 3 || i != 2 || at != "" {
		t.Fatalf("chain of a under %v: len %d, index of c %d, entry 3 %q; want 3, 2, \"\"", f.Targets, n, i, at)
	}
}
