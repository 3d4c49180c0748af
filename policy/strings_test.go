package policy_test

import (
	"fmt"
	"testing"

	"github.com/policyd/policyd/policy"
)

func TestStrings(t *testing.T) {
	tests := []struct {
		name string
		v    fmt.Stringer
		want string
	}{
		{"category", policy.CategoryTransient, "TRANSIENT"},
		{"category unclassified", policy.CategoryUnclassified, "UNCLASSIFIED"},
		{"category unknown", policy.Category(9), "Category(9)"},
		{"failure kind", policy.FailureGRPC, "GRPC"},
		{"transport kind", policy.TransportConnectionRefused, "CONNECTION_REFUSED"},
		{"local kind", policy.LocalValidation, "VALIDATION"},
		{"jitter", policy.JitterDecorrelated, "DECORRELATED"},
		{"jitter unknown", policy.Jitter(200), "Jitter(200)"},
		{"pushback mode", policy.RetryAfterOverride, "OVERRIDE"},
		{"breaker mode", policy.BreakerFailureRate, "FAILURE_RATE"},
		{"breaker scope", policy.ScopeTenantTarget, "TENANT_TARGET"},
		{"stop none", policy.StopNone, "NONE"},
		{"stop pushback", policy.StopServerPushback, "SERVER_PUSHBACK"},
		{"disposition", policy.DispositionDeadlineCut, "DEADLINE_CUT"},
		{"disposition unknown", policy.Disposition(6), "Disposition(6)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.v.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}
