package redisstore

import (
	"errors"
	"strings"
	"testing"

	"github.com/policyd/policyd/policy"
)

// TestOutcomesFormatIsTheLibrarys: the library reads a group of
// policyd_outcomes' numbers with the layout call writes, and a group's
// argument is as long as that layout says.
func TestOutcomesFormatIsTheLibrarys(t *testing.T) {
	checkLibraryLocals(t, map[string]string{
		"OUTCOMES_GROUP": "'" + outcomesGroup + "'",
		"OUTCOMES_RUN":   "'" + outcomesRun + "'",
	})
	g := &outcomeGroup{key: policy.BreakerKey{Tenant: "acme", Target: "pay"}, cfg: policy.Default().Breaker}
	g.add(result{Result: policy.ResultSuccess}, -1)
	g.add(result{Result: policy.ResultSuccess}, -1)
	g.add(result{Result: policy.ResultTransientFailure, Permit: "0a1b"}, -1)
	b := &outcomeBatch{tenant: "acme", groups: []*outcomeGroup{g}}
	_, args := b.call(&policy.TenantBudget{}, 0)
	var packed []byte
	for i, a := range args {
		if a == "pay" {
			packed = args[i+1].([]byte)
			break
		}
	}
	if want := outcomesGroupLen + 2*outcomesRunLen + len("0a1b"); len(packed) != want {
		t.Fatalf("the group's numbers are %d bytes, want %d (two runs, one with a permit of 4)", len(packed), want)
	}
}

// TestOutcomePermitTooLongToPack: a permit id is packed with a length
// byte, so ApplyOutcomes refuses one longer than 255 bytes, naming the
// field and the rule, and takes one of 255 (no permit of this engine's:
// counted as a result with a permit the breaker does not know).
func TestOutcomePermitTooLongToPack(t *testing.T) {
	_, s := storeOnStandalone(t)
	key := policy.BreakerKey{Tenant: "acme", Target: "pay"}
	up := func(permit string) []policy.OutcomeUpdate {
		return []policy.OutcomeUpdate{{Key: key, Breaker: policy.Default().Breaker, Result: policy.ResultSuccess, PermitID: permit}}
	}
	_, err := s.ApplyOutcomes(up(strings.Repeat("f", 256)), nil)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "permit_id") || !strings.Contains(err.Error(), "at most 255 bytes") {
		t.Fatalf("a permit of 256 bytes: %v, want ErrInvalid naming permit_id and at most 255 bytes", err)
	}
	ups := up(strings.Repeat("f", 255))
	if n, err := s.ApplyOutcomes(ups, nil); err != nil || n != 1 || ups[0].Refused != nil {
		t.Fatalf("a permit of 255 bytes: applied %d, %v, refused %v; want 1 applied", n, err, ups[0].Refused)
	}
	snap, err := s.Breaker(key)
	if err != nil || snap.WindowCalls != 1 {
		t.Fatalf("breaker after it: %+v, %v; want one call counted", snap, err)
	}
}
