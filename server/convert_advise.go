package server

import (
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// adviceToPB is the AdviseTargets response of advice.
func adviceToPB(advice []targetAdvice) *pb.AdviseTargetsResponse {
	resp := &pb.AdviseTargetsResponse{Advice: make([]*pb.TargetAdvice, 0, len(advice))}
	for i := range advice {
		ad := &advice[i]
		out := &pb.TargetAdvice{
			Tenant: ad.stats.Tenant, Target: ad.stats.Target,
			StartTime: timePB(ad.stats.Start), EndTime: timePB(ad.stats.End),
			SuccessesByAttempt: ad.stats.Successes[:], FailuresByAttempt: ad.stats.Failures[:],
			Summary: ad.summary, Recommendation: ad.recommendation, Changes: ad.changes,
		}
		if ad.proposed != nil {
			out.ProposedPolicy = policyToPB(*ad.proposed)
		}
		resp.Advice = append(resp.Advice, out)
	}
	return resp
}
