package server

import (
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// planRemaining adds PlanBudget's origin_time and reserve to in, planning at
// the daemon's clock: an origin_time more than MaxClockSkew after it, or a
// reserve outside [0, 1), is INVALID_ARGUMENT naming the field.
func (d *Decisions) planRemaining(req *pb.PlanBudgetRequest, in policy.PlanInput) (policy.PlanInput, error) {
	origin, err := timestamp("origin_time", req.GetOriginTime())
	if err != nil {
		return in, err
	}
	in.Now = d.cfg.Clock.Now()
	if err := checkOrigin("origin_time", origin, in.Now, d.cfg.MaxClockSkew); err != nil {
		return in, err
	}
	in.Origin, in.Reserve = origin, req.GetReserve()
	if err := in.Validate(); err != nil {
		return in, invalidFrom("", err)
	}
	return in, nil
}
