package policyclient

import (
	"time"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// EventKind names what an Event reports.
type EventKind int

// The kinds of Event.
const (
	EventUnspecified EventKind = iota
	// EventAttemptStarted: Do is about to call fn for Attempt.
	EventAttemptStarted
	// EventRetryScheduled: Attempt failed (Reason) and Do waits Delay
	// before the next; Local when the local policy decided.
	EventRetryScheduled
	// EventCallEnded: the call ended with Disposition (StopReason and
	// Reason for a failed call) after Attempt attempts.
	EventCallEnded
	// EventLocalDecision: policyd did not answer within the decision
	// timeout (or could not be reached), so the local copy of the default
	// policy decided after Attempt: a degraded answer, without the
	// fleet's breakers and budgets.
	EventLocalDecision
	// EventBreakerChanged: the WatchBreakers stream reported that the
	// breaker of Target moved to Breaker.
	EventBreakerChanged
	// EventFallbackTaken: policyd (or, while it is away, the chain it
	// showed) sent Attempt and the call's later attempts from target From
	// to Target, another target of the call's escalation chain.
	EventFallbackTaken
)

var eventKindNames = [...]string{
	EventUnspecified: "unspecified", EventAttemptStarted: "attempt_started", EventRetryScheduled: "retry_scheduled",
	EventCallEnded: "call_ended", EventLocalDecision: "local_decision", EventBreakerChanged: "breaker_changed",
	EventFallbackTaken: "fallback_taken",
}

// String returns the kind's name (attempt_started, retry_scheduled, ...).
func (k EventKind) String() string {
	if k >= 0 && int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return "unspecified"
}

// Event is what Config.OnEvent receives. Kind says which fields are set.
type Event struct {
	Kind EventKind
	// Target is the attempt's target: the call's, or the fallback policyd
	// escalated it to (the breaker's for EventBreakerChanged, the target
	// moved to for EventFallbackTaken).
	Target string
	// From is the target the call's attempts went to before
	// (EventFallbackTaken).
	From string
	// CallID names the call; empty for EventBreakerChanged.
	CallID string
	// Attempt is the attempt's number, from 1 (for EventCallEnded the
	// attempts made, 0 when none was admitted).
	Attempt int
	// Delay is the wait before the next attempt (EventRetryScheduled).
	Delay time.Duration
	// Local says the local policy decided (EventRetryScheduled).
	Local bool
	// Reason is the classification of the last failure (transient:503).
	Reason string
	// Disposition and StopReason say how the call ended (EventCallEnded).
	Disposition Disposition
	StopReason  StopReason
	// Breaker is the breaker's new state (EventBreakerChanged).
	Breaker pb.BreakerState
}

// emit hands e to Config.OnEvent, if set.
func (c *Client) emit(e Event) {
	if c.cfg.OnEvent != nil {
		c.cfg.OnEvent(e)
	}
}
