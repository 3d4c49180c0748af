package policyclient

import (
	"context"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// The idempotency ledger from the client's side: a call that uses it
// (a non-idempotent call with a key, or any call with Call.ClaimKey)
// claims its key before every attempt (policyd's ClaimKey) and completes
// it after (CompleteKey): a second worker arriving at a key that already
// succeeded gets the result reference without calling the upstream
// (Result.Deduplicated), one that finds another's live lease waits for
// it, and one that finds the previous attempt's outcome lost retries only
// when the policy says the upstream deduplicates by key, else dead-letters
// the call. While policyd is away the call goes on without the ledger,
// except after an attempt whose outcome was lost (a timeout, a 504, a
// reset), or once a claim said another worker holds the key: the upstream
// may have applied the write, and only a claim can say whether another
// is safe, so without one the call is dead-lettered (NOT_IDEMPOTENT,
// idempotency:unknown or idempotency:in_flight). With Config.RequireClaim
// no attempt goes without a claim (idempotency:unavailable).

// usesLedger reports whether the call claims its key.
func (l *loop) usesLedger() bool {
	return l.call.key != "" && (!l.call.idempotent || l.claimAlways)
}

// claim claims the call's key before attempt; it returns the lease held
// ("" for none: policyd is away) or ok false when the call ended (l.res
// set: deduplicated, or dead-lettered).
func (l *loop) claim(attempt int) (lease string, ok bool) {
	for {
		if !l.c.reachable() {
			return "", l.unclaimed(attempt)
		}
		ctx, cancel := context.WithTimeout(l.ctx, l.c.cfg.DecisionTimeout)
		resp, err := l.c.workers.ClaimKey(ctx, &pb.ClaimKeyRequest{Call: l.pbRef(), Attempt: uint32(attempt)})
		cancel()
		if err != nil {
			return "", l.unanswered(err, attempt) && l.unclaimed(attempt)
		}
		switch resp.GetState() {
		case pb.KeyState_KEY_STATE_SUCCEEDED:
			l.c.stats.deduplicated.Add(1)
			l.res.Disposition, l.res.Deduplicated, l.res.ResultRef, l.res.Err = Succeeded, true, resp.GetResultRef(), nil
			l.res.Reason = resp.GetReason()
			l.report(outcome{attempt: attempt, success: true, final: pb.Disposition_DISPOSITION_SUCCEEDED, deduplicated: true})
			return "", false
		case pb.KeyState_KEY_STATE_IN_FLIGHT:
			// Another worker's attempt holds the key: wait for its end.
			if l.mustClaim == "" {
				l.mustClaim = "idempotency:in_flight"
			}
			if !l.waitFor(resp.GetRetryAfter().AsDuration(), attempt, resp.GetReason()) {
				l.res.Reason = resp.GetReason()
				return "", false
			}
			continue
		case pb.KeyState_KEY_STATE_UNKNOWN:
			if resp.GetLeaseId() == "" {
				// The upstream may have applied it, and does not deduplicate.
				l.res.Reason = resp.GetReason()
				l.end(DeadLetter, StopNotIdempotent, attempt-1, nil)
				return "", false
			}
		}
		return resp.GetLeaseId(), true
	}
}

// unclaimed decides an attempt policyd could not be asked to claim: it
// goes on without the ledger (true), unless an earlier attempt's outcome
// was lost or another worker held the key (l.mustClaim), or the client
// requires a claim, when the call ends a dead letter (false).
func (l *loop) unclaimed(attempt int) bool {
	switch {
	case l.mustClaim != "":
		l.res.Reason = l.mustClaim
	case l.c.cfg.RequireClaim:
		l.res.Reason = "idempotency:unavailable"
	default:
		return true
	}
	l.end(DeadLetter, StopNotIdempotent, attempt-1, nil)
	return false
}

// complete tells policyd how the attempt holding lease ended: success (with
// the result reference fn set), a failure that cannot have been applied,
// or one whose outcome is unknown (a timeout, a 504, a reset). It reports
// whether policyd recorded it.
func (l *loop) complete(lease string, err error, f failure) bool {
	o := pb.KeyOutcome_KEY_OUTCOME_SUCCEEDED
	if err != nil {
		o = pb.KeyOutcome_KEY_OUTCOME_FAILED
		if outcomeLost(f) {
			o = pb.KeyOutcome_KEY_OUTCOME_UNKNOWN
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.ctx), l.c.cfg.DecisionTimeout)
	defer cancel()
	if _, cerr := l.c.workers.CompleteKey(ctx, &pb.CompleteKeyRequest{Tenant: l.call.tenant, IdempotencyKey: l.call.key,
		LeaseId: lease, Outcome: o, ResultRef: l.resultRef}); cerr != nil {
		l.c.cfg.Logger.Warn("policyd did not record the idempotency key's outcome", "call_id", l.call.id, "err", cerr)
		return false
	}
	return true
}

// outcomeLost reports whether a failure leaves unknown whether the upstream
// applied the attempt: a timeout, a reset connection, a 504 or a gRPC
// DEADLINE_EXCEEDED or UNKNOWN.
func outcomeLost(f failure) bool {
	switch k := f.pb.GetKind().(type) {
	case *pb.Failure_HttpStatus:
		return k.HttpStatus == 504
	case *pb.Failure_GrpcCode:
		return k.GrpcCode == 4 || k.GrpcCode == 2
	case *pb.Failure_TransportError:
		return k.TransportError == pb.TransportError_TRANSPORT_ERROR_TIMEOUT ||
			k.TransportError == pb.TransportError_TRANSPORT_ERROR_CONNECTION_RESET
	}
	return f.unclassified
}

// SetResultRef records ref (the upstream's record id, say; up to 1 KiB) as
// the result of a successful attempt: the idempotency ledger keeps it, and
// a worker later arriving at the same key gets it in Result.ResultRef
// instead of calling the upstream. Call it from fn before returning nil.
func (a Attempt) SetResultRef(ref string) {
	if a.result != nil {
		*a.result = ref
	}
}

// unanswered handles a call to policyd before attempt that did not answer:
// when the call's own context ended, the call ends a dead letter
// (DEADLINE) and unanswered returns false; otherwise policyd counts as
// away (Client.failed) and the attempt goes on without it (true).
func (l *loop) unanswered(err error, attempt int) bool {
	if l.ctx.Err() != nil {
		l.res.Err = l.ctx.Err()
		l.end(DeadLetter, StopDeadline, attempt-1, nil)
		return false
	}
	l.c.failed(err)
	return true
}
