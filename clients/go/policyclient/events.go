package policyclient

import pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"

// EventKind names what an Event reports.
type EventKind int

// The kinds of Event. Only EventBreakerChanged is emitted so far; the kinds
// of the retry loop (attempt started, retry scheduled, stopped, local
// decision) are to come.
const (
	EventUnspecified EventKind = iota
	// EventBreakerChanged: the WatchBreakers stream reported that a
	// breaker of the client's tenant moved to another state.
	EventBreakerChanged
)

// String returns the kind's name.
func (k EventKind) String() string {
	switch k {
	case EventBreakerChanged:
		return "breaker_changed"
	}
	return "unspecified"
}

// Event is what Config.OnEvent receives.
type Event struct {
	Kind EventKind
	// Target is the call's target, or the breaker's for EventBreakerChanged.
	Target string
	// Breaker is the breaker's new state (EventBreakerChanged).
	Breaker pb.BreakerState
}

// emit hands e to Config.OnEvent, if set.
func (c *Client) emit(e Event) {
	if c.cfg.OnEvent != nil {
		c.cfg.OnEvent(e)
	}
}
