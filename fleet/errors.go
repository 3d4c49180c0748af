package fleet

// Refusal is a request the state's rules refuse as it stands (a probe
// permit that is not live, an attempt already decided): not bad input in
// itself, but at odds with the state. Field names the request field, Rule
// the rule it breaks. Engines pass it on unchanged; the server answers
// FAILED_PRECONDITION.
type Refusal struct {
	Field string
	Rule  string
}

// Error returns "field: rule".
func (r *Refusal) Error() string { return r.Field + ": " + r.Rule }

// FailedPrecondition reports that the request conflicts with the state.
func (r *Refusal) FailedPrecondition() bool { return true }

// ErrPermit refuses a result carrying a permit id that is not a live probe
// permit of the breaker's current HALF_OPEN generation: another breaker's,
// an expired one, one of an earlier generation, or one never handed out.
var ErrPermit = &Refusal{Field: "permit_id",
	Rule: "is not a live probe permit of this breaker's HALF_OPEN generation; only its own probe may settle it"}
