package server

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/fleet"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// The idempotency ledger: ClaimKey, CompleteKey and GetKey over records
// keyed by tenant and idempotency key, whose rules are fleet.KeyRecord's
// and which the store commits before answering.

// leaseSlack is added to the policy's attempt timeout for a claim's lease:
// the worker reports the attempt's end a little after the timeout.
func leaseSlack(attemptTimeout time.Duration) time.Duration {
	return max(attemptTimeout/10, time.Second)
}

// ClaimKey claims a call's idempotency key before an attempt.
func (d *Decisions) ClaimKey(ctx context.Context, req *pb.ClaimKeyRequest) (*pb.ClaimKeyResponse, error) {
	call, err := checkNamed("call", func(field string) (callRef, error) { return callFromPB(field, req.GetCall(), true) })
	if err != nil {
		return nil, err
	}
	if call.key == "" {
		return nil, invalid("call.idempotency_key", "is required")
	}
	if req.GetAttempt() < 1 || req.GetAttempt() > maxAttempt {
		return nil, invalid("attempt", "must be 1 to "+strconv.Itoa(maxAttempt))
	}
	now := d.cfg.Clock.Now()
	if err := checkOrigin("call.origin_time", call.origin, now, d.cfg.MaxClockSkew); err != nil {
		return nil, err
	}
	p, _ := d.store.Resolve(call.tenant, call.target)
	a, err := d.store.ClaimKey(policy.KeyRef{Tenant: call.tenant, Key: call.key}, keyClaim(&p, &call, now))
	if err != nil {
		return nil, storeError(ctx, d.cfg.Logger, "idempotency key", err)
	}
	return &pb.ClaimKeyResponse{State: enumToPB[pb.KeyState](a.State), LeaseId: a.LeaseID,
		LeaseExpireTime: timePB(a.LeaseUntil), ResultRef: a.ResultRef, RetryAfter: durationPB(a.RetryAfter), Reason: a.Reason}, nil
}

// keyClaim is a claim under p at now: a lease until the attempt timeout
// plus slack, and a record kept for the policy's idempotency TTL, never
// less than the call's remaining schedule (to its deadline, or the
// policy's horizon when it has none) nor than the lease.
func keyClaim(p *policy.Policy, call *callRef, now time.Time) policy.KeyClaim {
	lease := p.AttemptTimeout + leaseSlack(p.AttemptTimeout)
	ttl := p.IdempotencyTTL
	if ttl <= 0 {
		ttl = policy.DefaultIdempotencyTTL
	}
	remaining := fleet.Horizon(p)
	if dl := policy.EffectiveDeadline(p, now, call.origin, call.deadline); !dl.IsZero() {
		remaining = dl.Sub(now) + lease
	}
	return policy.KeyClaim{LeaseUntil: now.Add(lease), Expires: now.Add(max(ttl, remaining, lease)),
		Dedupes: p.UpstreamDedupesByKey}
}

// CompleteKey records how the attempt holding a key's lease ended.
func (d *Decisions) CompleteKey(ctx context.Context, req *pb.CompleteKeyRequest) (*pb.CompleteKeyResponse, error) {
	ref, err := keyRefFromPB(req.GetTenant(), req.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	if req.GetLeaseId() == "" {
		return nil, invalid("lease_id", "is required")
	}
	o, err := enumFromPB[policy.KeyOutcome]("outcome", "", req.GetOutcome(), false)
	if err != nil {
		return nil, err
	}
	if err := checkText("result_ref", req.GetResultRef(), policy.MaxResultRefLen); err != nil {
		return nil, err
	}
	v, err := d.store.CompleteKey(ref, req.GetLeaseId(), o, req.GetResultRef(), time.Time{})
	switch {
	case precondition(err):
		return nil, status.Error(codes.FailedPrecondition, "lease_id: "+strconv.Quote(req.GetLeaseId())+
			" does not hold idempotency key "+strconv.Quote(ref.Key)+": another worker took it over, or it was completed already")
	case notFound(err):
		return nil, keyNotFound(ref)
	case err != nil:
		return nil, storeError(ctx, d.cfg.Logger, "idempotency key", err)
	}
	return &pb.CompleteKeyResponse{Record: keyRecordToPB(&v)}, nil
}

// GetKey returns a key's record.
func (d *Decisions) GetKey(ctx context.Context, req *pb.GetKeyRequest) (*pb.GetKeyResponse, error) {
	ref, err := keyRefFromPB(req.GetTenant(), req.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	v, err := d.store.Key(ref)
	if notFound(err) {
		return nil, keyNotFound(ref)
	}
	if err != nil {
		return nil, storeError(ctx, d.cfg.Logger, "idempotency key", err)
	}
	return &pb.GetKeyResponse{Record: keyRecordToPB(&v)}, nil
}

// keyNotFound is the same answer for a key of the tenant that does not
// exist and for another tenant's.
func keyNotFound(ref policy.KeyRef) error {
	return status.Error(codes.NotFound, "idempotency_key: "+strconv.Quote(ref.Key)+" not found for tenant "+strconv.Quote(ref.Tenant))
}
