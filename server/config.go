package server

import (
	"errors"

	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// PolicyFromProto converts and validates a policy in its API form exactly
// as SetPolicy does, for configuration files. The error names the field,
// prefixed with field, and the rule.
func PolicyFromProto(field string, p *pb.Policy) (policy.Policy, error) {
	out, err := policyFromPB(field, p)
	return out, plain(err)
}

// CheckOwnTarget checks that p, the policy at field for target, names no
// fallback equal to target, as SetPolicy does (the cycles through stored
// policies SetPolicy also refuses need the store).
func CheckOwnTarget(field, target string, p *policy.Policy) error {
	return plain(checkOwnTarget(field, target, p))
}

// BudgetFromProto converts a tenant budget in its API form as
// SetTenantBudget does; the store fills defaults and applies the numeric
// rules when it is written.
func BudgetFromProto(field string, b *pb.TenantBudget) (policy.TenantBudget, error) {
	out, err := budgetFromPB(field, b)
	return out, plain(err)
}

// CheckScope validates a policy scope as SetPolicy does.
func CheckScope(tenant, target string) error { return plain(scopeFromPB(tenant, target)) }

// plain strips the gRPC status from a validation error.
func plain(err error) error {
	if err == nil {
		return nil
	}
	return errors.New(status.Convert(err).Message())
}
