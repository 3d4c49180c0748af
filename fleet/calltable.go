package fleet

import (
	"strings"

	"github.com/policyd/policyd/policy"
)

// CallTable is a batch run's calls for triage (the dead-letter list), at
// most Cap of them: a new call beyond the cap is not kept, and Untracked
// counts it (the run's ledger still does). Times are Unix ns.
type CallTable struct {
	Cap       int
	Calls     map[string]*CallRecord
	Untracked uint64
}

// CallRecord is one call of a CallTable.
type CallRecord struct {
	Final          Final
	Attempts       uint32
	Classification string
	Detail         string
	First, Last    int64
	Target         string
	TriageRef      string
	PrimaryTarget  string // the call's primary when Target is a fallback
}

// NewCallTable returns an empty table of at most limit calls.
func NewCallTable(limit int) CallTable {
	return CallTable{Cap: limit, Calls: map[string]*CallRecord{}}
}

// Note applies what n tells of call (see CallRecord.Note), adding the call
// when it is new and the table has room. It returns the call id as the
// table keeps it (a copy when new) and whether anything changed; kept is
// "" when the call is beyond the cap. It allocates for a new call and for
// each changed string (a copy, so the table does not pin the caller's
// buffers).
func (t *CallTable) Note(call string, n *policy.CallNote) (kept string, changed bool) {
	c, ok := t.Calls[call]
	if !ok {
		if len(t.Calls) >= t.Cap {
			t.Untracked++
			return "", false
		}
		call = strings.Clone(call)
		c = &CallRecord{}
		t.Calls[call] = c
	}
	return call, c.Note(n) || !ok
}

// Note applies n: the attempt count never goes back; the first and last
// attempt times only widen; the classification follows the highest
// attempt (a note of a lower one does not overwrite it), the detail the
// latest note of the highest attempt or a final disposition; a final
// disposition replaces the one kept (as the run's ledger moves its count);
// a non-empty target or triage reference replaces the one kept, a target
// together with its primary (empty when the target is the primary). It
// reports whether the record changed.
func (c *CallRecord) Note(n *policy.CallNote) bool {
	before := *c
	current := n.Attempt >= c.Attempts
	if n.Attempt > c.Attempts {
		c.Attempts = n.Attempt
	}
	if t := n.Time.UnixNano(); !n.Time.IsZero() {
		if c.First == 0 || t < c.First {
			c.First = t
		}
		c.Last = max(c.Last, t)
	}
	if current && n.Classification != "" && n.Classification != c.Classification {
		c.Classification = strings.Clone(n.Classification)
	}
	final := n.Disposition != policy.DispositionNone
	if (current || final) && n.Detail != "" && n.Detail != c.Detail {
		c.Detail = strings.Clone(n.Detail)
	}
	if final {
		c.Final = Final{Disposition: n.Disposition, Stop: n.Stop}
	}
	if n.Target != "" && n.Target != c.Target {
		c.Target = strings.Clone(n.Target)
	}
	if n.Target != "" && n.PrimaryTarget != c.PrimaryTarget {
		c.PrimaryTarget = strings.Clone(n.PrimaryTarget)
	}
	if n.TriageRef != "" && n.TriageRef != c.TriageRef {
		c.TriageRef = strings.Clone(n.TriageRef)
	}
	return *c != before
}
