package policyclient

import (
	"testing"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestFlowCacheKnowsACeilingOnlyWhenTold: controlled (ask Admit) and
// ceilingKnown (never admit locally) differ for a target nothing was said
// of: before a snapshot, or one the snapshot's other-targets flag covers.
func TestFlowCacheKnowsACeilingOnlyWhenTold(t *testing.T) {
	f := newFlowCache()
	if !f.controlled("portal") || f.ceilingKnown("portal") {
		t.Fatalf("before anything is heard: controlled %v, ceilingKnown %v; want true, false", f.controlled("portal"), f.ceilingKnown("portal"))
	}
	f.learn("portal", true)
	f.learn("geo", false)
	f.snapshot(&pb.WatchBreakersResponse{FlowControlledTargets: []string{"portal"}, UncontrolledTargets: []string{"geo"}})
	f.reported([]*pb.Outcome{{Call: &pb.CallRef{Target: "geo"}, AttemptTarget: "fb"}}, &pb.ReportOutcomeResponse{FlowControlledTargets: []string{"fb"}})
	tests := []struct {
		target                string
		controlled, ceilingIs bool
	}{
		{"portal", true, true}, // the snapshot named it
		{"geo", false, false},  // the snapshot named it without one
		{"fb", true, true},     // a report's answer listed it (the attempt's target)
		{"other", false, false},
	}
	for _, tt := range tests {
		if got, known := f.controlled(tt.target), f.ceilingKnown(tt.target); got != tt.controlled || known != tt.ceilingIs {
			t.Errorf("%s: controlled %v, ceilingKnown %v; want %v, %v", tt.target, got, known, tt.controlled, tt.ceilingIs)
		}
	}
	f.snapshot(&pb.WatchBreakersResponse{OtherTargetsFlowControlled: true})
	if !f.ceilingKnown("other") {
		t.Errorf("other, with other_targets_flow_controlled: ceilingKnown false, want true")
	}
}
