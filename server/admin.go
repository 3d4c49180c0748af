package server

import (
	"context"
	"encoding/base64"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// Admin implements AdminService over a Store. Every write is validated here
// and made durable by the store before the answer. It is safe for concurrent
// use.
type Admin struct {
	pb.UnimplementedAdminServiceServer
	store Store
	cfg   Config
}

// NewAdmin returns the operator-facing service.
func NewAdmin(store Store, cfg Config) *Admin {
	return &Admin{store: store, cfg: cfg.withDefaults()}
}

// Page tokens are the last key of the previous page, opaque to clients.

func encodeToken(parts ...string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strings.Join(parts, "\x00")))
}

func decodeToken(tok string, n int) ([]string, error) {
	if tok == "" {
		return make([]string, n), nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return nil, invalid("page_token", "is not a token this server issued")
	}
	parts := strings.Split(string(raw), "\x00")
	if len(parts) != n {
		return nil, invalid("page_token", "is not a token this server issued")
	}
	return parts, nil
}

// pageReq is a validated list request: at most n items after the key the
// page token names.
type pageReq struct {
	n     int
	after []string
}

// pageFromPB validates a page size and token whose key has parts parts.
func pageFromPB(size uint32, token string, parts int) (pageReq, error) {
	n, err := pageSize("page_size", size)
	if err != nil {
		return pageReq{}, err
	}
	after, err := decodeToken(token, parts)
	if err != nil {
		return pageReq{}, err
	}
	return pageReq{n: n, after: after}, nil
}

// paged fetches one page, asking for one item more than the page holds so
// it knows whether another page follows, and converts it; key names an item
// for the next page's token.
func paged[T, R any](ctx context.Context, a *Admin, what string, pr pageReq,
	fetch func(after []string, limit int) ([]T, error), key func(T) []string, conv func(T) R) ([]R, string, error) {
	list, err := fetch(pr.after, pr.n+1)
	if err != nil {
		return nil, "", storeError(ctx, a.cfg.Logger, what, err)
	}
	next := ""
	if len(list) > pr.n {
		list = list[:pr.n]
		next = encodeToken(key(list[pr.n-1])...)
	}
	out := make([]R, len(list))
	for i, v := range list {
		out[i] = conv(v)
	}
	return out, next, nil
}

// SetTenantBudget creates or replaces a tenant's budget.
func (a *Admin) SetTenantBudget(ctx context.Context, req *pb.SetTenantBudgetRequest) (*pb.SetTenantBudgetResponse, error) {
	b, err := budgetFromPB("budget", req.GetBudget())
	if err != nil {
		return nil, err
	}
	stored, err := a.store.SetBudget(b)
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "budget", err)
	}
	return &pb.SetTenantBudgetResponse{Budget: budgetToPB(stored)}, nil
}

// GetTenantBudget returns a tenant's budget and counters.
func (a *Admin) GetTenantBudget(ctx context.Context, req *pb.GetTenantBudgetRequest) (*pb.GetTenantBudgetResponse, error) {
	if err := checkName("tenant", req.GetTenant(), maxTenantLen, true); err != nil {
		return nil, err
	}
	st, err := a.store.Budget(req.GetTenant())
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "tenant "+strconv.Quote(req.GetTenant()), err)
	}
	return &pb.GetTenantBudgetResponse{Status: budgetStatusToPB(st)}, nil
}

// ListTenantBudgets pages through the explicit budgets.
func (a *Admin) ListTenantBudgets(ctx context.Context, req *pb.ListTenantBudgetsRequest) (*pb.ListTenantBudgetsResponse, error) {
	pr, err := pageFromPB(req.GetPageSize(), req.GetPageToken(), 1)
	if err != nil {
		return nil, err
	}
	items, next, err := paged(ctx, a, "budgets", pr,
		func(after []string, limit int) ([]policy.BudgetStatus, error) {
			return a.store.Budgets(after[0], limit)
		},
		func(s policy.BudgetStatus) []string { return []string{s.Budget.Tenant} }, budgetStatusToPB)
	if err != nil {
		return nil, err
	}
	return &pb.ListTenantBudgetsResponse{Budgets: items, NextPageToken: next}, nil
}

// DeleteTenantBudget removes a tenant's explicit budget.
func (a *Admin) DeleteTenantBudget(ctx context.Context, req *pb.DeleteTenantBudgetRequest) (*pb.DeleteTenantBudgetResponse, error) {
	if err := checkName("tenant", req.GetTenant(), maxTenantLen, true); err != nil {
		return nil, err
	}
	if err := a.store.DeleteBudget(req.GetTenant()); err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "tenant "+strconv.Quote(req.GetTenant()), err)
	}
	return &pb.DeleteTenantBudgetResponse{}, nil
}

func scopeFromPB(tenant, target string) error {
	if err := checkName("tenant", tenant, maxTenantLen, false); err != nil {
		return err
	}
	return checkName("target", target, maxTargetLen, false)
}

// SetPolicy stores a policy at a scope.
func (a *Admin) SetPolicy(ctx context.Context, req *pb.SetPolicyRequest) (*pb.SetPolicyResponse, error) {
	if err := scopeFromPB(req.GetTenant(), req.GetTarget()); err != nil {
		return nil, err
	}
	if req.GetPolicy() == nil {
		return nil, invalid("policy", "is required")
	}
	p, err := policyFromPB("policy", req.GetPolicy())
	if err != nil {
		return nil, err
	}
	if err := checkFallbacks(a.store, req.GetTenant(), req.GetTarget(), &p); err != nil {
		return nil, err
	}
	e, err := a.store.SetPolicy(req.GetTenant(), req.GetTarget(), p)
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "policy", err)
	}
	return &pb.SetPolicyResponse{Entry: policyEntryToPB(e)}, nil
}

// GetPolicy returns the policy at a scope, or the effective one.
func (a *Admin) GetPolicy(ctx context.Context, req *pb.GetPolicyRequest) (*pb.GetPolicyResponse, error) {
	if err := scopeFromPB(req.GetTenant(), req.GetTarget()); err != nil {
		return nil, err
	}
	if req.GetEffective() {
		p, e := a.store.Resolve(req.GetTenant(), req.GetTarget())
		e.Policy = p
		return &pb.GetPolicyResponse{Entry: policyEntryToPB(e)}, nil
	}
	e, err := a.store.Policy(req.GetTenant(), req.GetTarget())
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "policy", err)
	}
	return &pb.GetPolicyResponse{Entry: policyEntryToPB(e)}, nil
}

// ListPolicies pages through the stored policies.
func (a *Admin) ListPolicies(ctx context.Context, req *pb.ListPoliciesRequest) (*pb.ListPoliciesResponse, error) {
	pr, err := pageFromPB(req.GetPageSize(), req.GetPageToken(), 2)
	if err != nil {
		return nil, err
	}
	items, next, err := paged(ctx, a, "policies", pr,
		func(after []string, limit int) ([]policy.PolicyEntry, error) {
			return a.store.Policies(policy.PolicyScope{Tenant: after[0], Target: after[1]}, limit)
		},
		func(e policy.PolicyEntry) []string { return []string{e.Tenant, e.Target} }, policyEntryToPB)
	if err != nil {
		return nil, err
	}
	return &pb.ListPoliciesResponse{Entries: items, NextPageToken: next}, nil
}

// DeletePolicy removes the policy at a scope.
func (a *Admin) DeletePolicy(ctx context.Context, req *pb.DeletePolicyRequest) (*pb.DeletePolicyResponse, error) {
	if err := scopeFromPB(req.GetTenant(), req.GetTarget()); err != nil {
		return nil, err
	}
	if err := a.store.DeletePolicy(req.GetTenant(), req.GetTarget()); err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "policy", err)
	}
	return &pb.DeletePolicyResponse{}, nil
}

// ListBreakers pages through breakers.
func (a *Admin) ListBreakers(ctx context.Context, req *pb.ListBreakersRequest) (*pb.ListBreakersResponse, error) {
	if err := checkName("tenant", req.GetTenant(), maxTenantLen, false); err != nil {
		return nil, err
	}
	st, err := enumFromPB[policy.BreakerState]("state", "", req.GetState(), true)
	if err != nil {
		return nil, err
	}
	pr, err := pageFromPB(req.GetPageSize(), req.GetPageToken(), 2)
	if err != nil {
		return nil, err
	}
	items, next, err := paged(ctx, a, "breakers", pr,
		func(after []string, limit int) ([]policy.BreakerSnapshot, error) {
			return a.store.Breakers(req.GetTenant(), st, policy.BreakerKey{Tenant: after[0], Target: after[1]}, limit)
		},
		func(b policy.BreakerSnapshot) []string { return []string{b.Key.Tenant, b.Key.Target} },
		func(b policy.BreakerSnapshot) *pb.Breaker { return breakerWithPool(a.store, b) })
	if err != nil {
		return nil, err
	}
	return &pb.ListBreakersResponse{Breakers: items, NextPageToken: next}, nil
}

// GetBreaker returns one breaker.
func (a *Admin) GetBreaker(ctx context.Context, req *pb.GetBreakerRequest) (*pb.GetBreakerResponse, error) {
	key, err := breakerKeyFromPB("key", req.GetKey())
	if err != nil {
		return nil, err
	}
	s, err := a.store.Breaker(key)
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "breaker", err)
	}
	pool, err := a.store.Pool(key)
	if err != nil {
		if s.Degraded {
			// The replica's last-known state, its store silent: the leases
			// are the store's to count, so the breaker comes without them.
			return &pb.GetBreakerResponse{Breaker: breakerToPB(s)}, nil
		}
		return nil, storeError(ctx, a.cfg.Logger, "breaker", err)
	}
	p, _ := a.store.Resolve(key.Tenant, key.Target)
	return &pb.GetBreakerResponse{Breaker: withPool(breakerToPB(s), &p, pool)}, nil
}

// ResetBreaker closes a breaker and clears its counters and pin.
func (a *Admin) ResetBreaker(ctx context.Context, req *pb.ResetBreakerRequest) (*pb.ResetBreakerResponse, error) {
	key, err := breakerKeyFromPB("key", req.GetKey())
	if err != nil {
		return nil, err
	}
	s, err := a.store.ResetBreaker(key)
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "breaker", err)
	}
	return &pb.ResetBreakerResponse{Breaker: breakerToPB(s)}, nil
}

// ForceBreaker pins a breaker OPEN, CLOSED or DISABLED.
func (a *Admin) ForceBreaker(ctx context.Context, req *pb.ForceBreakerRequest) (*pb.ForceBreakerResponse, error) {
	key, err := breakerKeyFromPB("key", req.GetKey())
	if err != nil {
		return nil, err
	}
	st, err := forcedStateFromPB("state", req.GetState())
	if err != nil {
		return nil, err
	}
	s, err := a.store.ForceBreaker(key, st)
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "breaker", err)
	}
	return &pb.ForceBreakerResponse{Breaker: breakerToPB(s)}, nil
}

// OpenRun opens a batch run.
func (a *Admin) OpenRun(ctx context.Context, req *pb.OpenRunRequest) (*pb.OpenRunResponse, error) {
	if err := checkName("run_id", req.GetRunId(), maxRunIDLen, false); err != nil {
		return nil, err
	}
	if err := checkName("tenant", req.GetTenant(), maxTenantLen, true); err != nil {
		return nil, err
	}
	if err := checkText("description", req.GetDescription(), maxDescLen); err != nil {
		return nil, err
	}
	if err := checkName("redrive_of", req.GetRedriveOf(), maxRunIDLen, false); err != nil {
		return nil, err
	}
	if req.GetRetryPool() == 0 {
		return nil, invalid("retry_pool", "must be > 0")
	}
	if req.GetCutoffTime() == nil {
		return nil, invalid("cutoff_time", "is required")
	}
	cutoff, err := timestamp("cutoff_time", req.GetCutoffTime())
	if err != nil {
		return nil, err
	}
	if !cutoff.After(a.cfg.Clock.Now()) {
		return nil, invalid("cutoff_time", "must be in the future")
	}
	if id := req.GetRedriveOf(); id != "" {
		if old, err := a.store.Run(id); notFound(err) || (err == nil && old.Tenant != req.GetTenant()) {
			return nil, status.Error(codes.NotFound, "redrive_of: run "+strconv.Quote(id)+" not found for tenant "+strconv.Quote(req.GetTenant()))
		} else if err != nil {
			return nil, storeError(ctx, a.cfg.Logger, "run", err)
		}
	}
	r, err := a.store.OpenRun(policy.Run{
		ID: req.GetRunId(), Tenant: req.GetTenant(), Description: req.GetDescription(),
		Pool: req.GetRetryPool(), Cutoff: cutoff, RedriveOf: req.GetRedriveOf(),
	})
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "run", err)
	}
	return &pb.OpenRunResponse{Run: runToPB(r)}, nil
}

// GetRun returns a run and its reconciliation.
func (a *Admin) GetRun(ctx context.Context, req *pb.GetRunRequest) (*pb.GetRunResponse, error) {
	if err := checkName("run_id", req.GetRunId(), maxRunIDLen, true); err != nil {
		return nil, err
	}
	r, err := a.store.Run(req.GetRunId())
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "run "+strconv.Quote(req.GetRunId()), err)
	}
	return &pb.GetRunResponse{Run: runToPB(r)}, nil
}

// ListRuns pages through runs.
func (a *Admin) ListRuns(ctx context.Context, req *pb.ListRunsRequest) (*pb.ListRunsResponse, error) {
	if err := checkName("tenant", req.GetTenant(), maxTenantLen, false); err != nil {
		return nil, err
	}
	pr, err := pageFromPB(req.GetPageSize(), req.GetPageToken(), 1)
	if err != nil {
		return nil, err
	}
	items, next, err := paged(ctx, a, "runs", pr,
		func(after []string, limit int) ([]policy.Run, error) {
			return a.store.Runs(req.GetTenant(), after[0], limit)
		},
		func(r policy.Run) []string { return []string{r.ID} }, runToPB)
	if err != nil {
		return nil, err
	}
	return &pb.ListRunsResponse{Runs: items, NextPageToken: next}, nil
}

// QueryAudit pages through the audit trail of a call, a tenant or both, in
// the order the records were made.
func (a *Admin) QueryAudit(ctx context.Context, req *pb.QueryAuditRequest) (*pb.QueryAuditResponse, error) {
	q, err := auditQueryFromPB(req)
	if err != nil {
		return nil, err
	}
	recs, next, err := a.store.QueryAudit(q)
	if err != nil {
		return nil, storeError(ctx, a.cfg.Logger, "audit", err)
	}
	resp := &pb.QueryAuditResponse{Records: make([]*pb.AuditRecord, 0, len(recs))}
	for _, r := range recs {
		resp.Records = append(resp.Records, auditRecordToPB(r))
	}
	if !next.IsZero() {
		resp.NextPageToken = encodeToken(strconv.FormatInt(next.Time.UnixNano(), 10), strconv.FormatUint(next.Seq, 10))
	}
	return resp, nil
}
