package fleet

import (
	"strings"
	"time"

	"github.com/policyd/policyd/policy"
)

// MaxNameLen is the longest tenant, target, run or call id an engine
// stores, in bytes; MaxDescriptionLen the longest run description.
const (
	MaxNameLen        = 1024
	MaxDescriptionLen = 4096
)

// CheckName checks a tenant, target or id as every engine stores it: at
// most MaxNameLen bytes, no NUL byte, and not empty unless empty is
// allowed. It returns the broken rule naming field, nil when v is good.
func CheckName(field, v string, empty bool) *policy.FieldError {
	switch {
	case v == "" && !empty:
		return &policy.FieldError{Field: field, Rule: "must not be empty"}
	case len(v) > MaxNameLen:
		return &policy.FieldError{Field: field, Rule: "must be at most 1024 bytes"}
	case strings.IndexByte(v, 0) >= 0:
		return &policy.FieldError{Field: field, Rule: "must not contain a NUL (0x00) byte"}
	}
	return nil
}

// CheckBreakerKey checks a breaker key: any tenant (including ""), a
// non-empty target.
func CheckBreakerKey(k policy.BreakerKey) *policy.FieldError {
	if fe := CheckName("tenant", k.Tenant, true); fe != nil {
		return fe
	}
	return CheckName("target", k.Target, false)
}

// CheckScope checks a policy scope: tenant, target or both.
func CheckScope(tenant, target string) *policy.FieldError {
	if tenant == "" && target == "" {
		return &policy.FieldError{Field: "tenant, target", Rule: "at least one must be set"}
	}
	if fe := CheckName("tenant", tenant, true); fe != nil {
		return fe
	}
	return CheckName("target", target, true)
}

// CheckRun checks a run to open at now: its id (which the engine made when
// the caller gave none), its tenant, the description's length, a pool of
// at least one retry and a cut-off in the future.
func CheckRun(r *policy.Run, now time.Time) *policy.FieldError {
	if fe := CheckName("run_id", r.ID, false); fe != nil {
		return fe
	}
	if fe := CheckName("tenant", r.Tenant, false); fe != nil {
		return fe
	}
	switch {
	case len(r.Description) > MaxDescriptionLen:
		return &policy.FieldError{Field: "description", Rule: "must be at most 4096 bytes"}
	case r.Pool == 0:
		return &policy.FieldError{Field: "retry_pool", Rule: "must be > 0"}
	case !r.Cutoff.After(now):
		return &policy.FieldError{Field: "cutoff_time", Rule: "must be in the future"}
	}
	return nil
}
