package server

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// A run's call table (the dead-letter list): fed by NextDelay's decisions
// and by final dispositions, listed by ListRunCalls.

// ListRunCalls pages through a run's calls, filtered by disposition and
// stop reason. With tenant set (a tenant token must set it to its own), a
// run of another tenant is NOT_FOUND, the same answer as an unknown run.
func (a *Admin) ListRunCalls(ctx context.Context, req *pb.ListRunCallsRequest) (*pb.ListRunCallsResponse, error) {
	if err := checkName("run_id", req.GetRunId(), maxRunIDLen, true); err != nil {
		return nil, err
	}
	if err := checkName("tenant", req.GetTenant(), maxTenantLen, false); err != nil {
		return nil, err
	}
	f, err := runCallFilterFromPB(req)
	if err != nil {
		return nil, err
	}
	pr, err := pageFromPB(req.GetPageSize(), req.GetPageToken(), 1)
	if err != nil {
		return nil, err
	}
	run, err := a.store.Run(req.GetRunId())
	if (err == nil && req.GetTenant() != "" && run.Tenant != req.GetTenant()) || notFound(err) {
		return nil, status.Error(codes.NotFound, "run_id: run "+strconv.Quote(req.GetRunId())+" not found"+forTenant(req.GetTenant()))
	}
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "run", err)
	}
	var untracked uint64
	calls, next, err := paged(ctx, a, "run calls", pr,
		func(after []string, limit int) ([]policy.RunCall, error) {
			list, n, err := a.store.RunCalls(req.GetRunId(), f, after[0], limit)
			untracked = n
			return list, err
		},
		func(c policy.RunCall) []string { return []string{c.CallID} }, runCallToPB)
	if err != nil {
		return nil, err
	}
	return &pb.ListRunCallsResponse{Calls: calls, NextPageToken: next, Untracked: untracked}, nil
}

func forTenant(tenant string) string {
	if tenant == "" {
		return ""
	}
	return " for tenant " + strconv.Quote(tenant)
}

// decisionNote is what a NextDelay decision of the attempt sent to target
// tells the call's run's call table.
func decisionNote(call *callRef, target string, attempt uint32, class, why string, now time.Time) policy.CallNote {
	return policy.CallNote{Target: target, PrimaryTarget: primaryOf(call, target), TriageRef: call.triageRef,
		Attempt: attempt, Classification: class, Detail: why, Time: now}
}

// outcomeNote is what an outcome of a call of a run tells the run's call
// table: the attempt, its failure's classification when classified here,
// and the final disposition it carries.
func outcomeNote(it *outcomeItem, class string, now time.Time) policy.CallNote {
	n := policy.CallNote{Target: it.target, PrimaryTarget: primaryOf(&it.call, it.target), TriageRef: it.call.triageRef,
		Attempt: it.attempt, Time: now,
		Classification: class, Disposition: it.final.Disposition, Stop: it.final.Stop}
	switch {
	case it.success:
		n.Detail = "attempt succeeded"
	case n.Disposition != policy.DispositionNone:
		n.Detail = finalDetail(n.Disposition, n.Stop)
	}
	return n
}
