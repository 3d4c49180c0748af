package fleet

// ReasonRate refuses an attempt a rate ceiling does not allow yet; the
// Admission's RetryAfter is the exact wait until it does.
const ReasonRate = "rate:limited"

// Rate is a fleet-wide request-rate ceiling kept by the generic cell rate
// algorithm (GCRA): TAT is the theoretical arrival time (Unix ns) of the
// next request, each admitted request moves it one emission interval
// later, and a request is admitted while TAT is at most burst-1 intervals
// ahead of now. So over any span t no more than t/interval + burst
// requests are admitted. The zero value has admitted nothing.
type Rate struct {
	TAT int64
}

// Take admits one request at now under a ceiling of one per interval (ns)
// with burst requests at once (at least 1), or refuses it with the exact
// wait (ns) until it would be admitted; a refusal changes nothing.
func (r *Rate) Take(now, interval int64, burst int) (ok bool, wait int64, e Effect) {
	tat := max(r.TAT, now)
	allowAt := tat - int64(max(burst, 1)-1)*interval
	if now < allowAt {
		return false, allowAt - now, 0
	}
	r.TAT = tat + interval
	return true, 0, Mutated
}

// Refund gives back a request Take admitted at now that did not happen (a
// full concurrency ceiling or the breaker refused it), so it does not
// count against the rate. TAT never moves before now by it.
func (r *Rate) Refund(now, interval int64) Effect {
	if r.TAT <= now {
		return 0
	}
	r.TAT = max(r.TAT-interval, now)
	return Mutated
}
