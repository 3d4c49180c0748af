package breakerstore_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/policy"
)

// TestDeletionsFreeAFullFile fills a file to Options.MaxSize, lets small
// writes take what is left, and checks that deletions still commit and
// make room for writes again, without reopening the file.
func TestDeletionsFreeAFullFile(t *testing.T) {
	e := newEnv(t, func(o *breakerstore.Options) { o.MaxSize = 1 << 20 })
	s := e.open()
	big := policy.Default()
	for c := 400; c < 600; c++ {
		big.TerminalHTTP = append(big.TerminalHTTP, c) // a record of about 1 KiB
	}
	var written []string
	for i := 0; ; i++ {
		target := fmt.Sprintf("p-%04d", i)
		_, err := s.SetPolicy("t", target, big)
		if err != nil {
			wantErr(t, "SetPolicy in a full file", err, breakerstore.ErrDiskFull)
			break
		}
		written = append(written, target)
		if i > 10000 {
			t.Fatalf("the file never filled: %d policies written", i)
		}
	}
	refused := 0
	for i := range 300 {
		if _, err := s.SetBudget(policy.TenantBudget{Tenant: fmt.Sprint("b-", i), Capacity: 1}); err != nil {
			wantErr(t, "SetBudget in a full file", err, breakerstore.ErrDiskFull)
			refused++
		}
	}
	if refused == 0 {
		t.Fatal("300 small writes in a full file: got none refused, want the last ones refused")
	}
	// Delete half, in no particular order.
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(written), func(i, j int) { written[i], written[j] = written[j], written[i] })
	for i, target := range written[:len(written)/2] {
		if err := s.DeletePolicy("t", target); err != nil {
			t.Fatalf("DeletePolicy %d of %d in a full file: %v, want it to free space", i+1, len(written)/2, err)
		}
	}
	for i := range 50 {
		if _, err := s.SetPolicy("t", fmt.Sprint("again-", i), big); err != nil {
			t.Fatalf("SetPolicy %d after deleting half the policies: %v, want room", i+1, err)
		}
	}
	if err := s.Flush(); err != nil {
		t.Errorf("Flush after freeing space: %v", err)
	}
}
