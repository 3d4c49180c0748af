package policyclient

import (
	"sync"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// flowCache knows which targets have a fleet-wide ceiling (a policy's
// flow.max_in_flight), so an attempt to one asks Admit for a lease even
// while its breaker is CLOSED, and an attempt to any other still costs no
// RPC. It learns from the WatchBreakers snapshot (the targets policies
// name, and whether the rest have a ceiling), then from every Admit and
// NextDelay answer and every ReportOutcome answer (which lists the
// batch's targets that have one), so a ceiling set later is learnt within
// one outcome report. Before it has heard anything it answers "has a
// ceiling", and the first Admit tells.
type flowCache struct {
	mu      sync.RWMutex
	known   bool            // a snapshot has arrived
	targets map[string]bool // target -> has a ceiling
	other   bool            // targets not in targets
}

func newFlowCache() *flowCache { return &flowCache{targets: map[string]bool{}} }

// controlled reports whether attempts to target must ask for a lease.
func (f *flowCache) controlled(target string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if v, ok := f.targets[target]; ok {
		return v
	}
	return !f.known || f.other
}

// ceilingKnown reports whether policyd told the client that target has a
// fleet-wide ceiling: an answer about it said so, or the snapshot did of
// the targets it did not name. A target the client has heard nothing of
// is not known to have one, though controlled asks Admit about it.
func (f *flowCache) ceilingKnown(target string) bool {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if v, ok := f.targets[target]; ok {
		return v
	}
	return f.known && f.other
}

// learn records what an answer said of target.
func (f *flowCache) learn(target string, controlled bool) {
	f.mu.RLock()
	v, ok := f.targets[target]
	f.mu.RUnlock()
	if ok && v == controlled {
		return
	}
	f.mu.Lock()
	f.targets[target] = controlled
	f.mu.Unlock()
}

// snapshot replaces what is known with a watch snapshot's message.
func (f *flowCache) snapshot(msg *pb.WatchBreakersResponse) {
	m := make(map[string]bool, len(msg.GetFlowControlledTargets())+len(msg.GetUncontrolledTargets()))
	for _, t := range msg.GetFlowControlledTargets() {
		m[t] = true
	}
	for _, t := range msg.GetUncontrolledTargets() {
		m[t] = false
	}
	f.mu.Lock()
	f.targets, f.other, f.known = m, msg.GetOtherTargetsFlowControlled(), true
	f.mu.Unlock()
}

// reported learns from a ReportOutcome answer: each target of the batch
// has a ceiling when the answer lists it, and none otherwise.
func (f *flowCache) reported(batch []*pb.Outcome, resp *pb.ReportOutcomeResponse) {
	listed := resp.GetFlowControlledTargets()
	last := ""
	for _, o := range batch {
		t := o.GetCall().GetTarget()
		if a := o.GetAttemptTarget(); a != "" {
			t = a
		}
		if t == last {
			continue
		}
		last = t
		in := false
		for _, l := range listed {
			if l == t {
				in = true
				break
			}
		}
		f.learn(t, in)
	}
}
