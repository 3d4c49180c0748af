package server

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// domainName returns the name a domain enum gives the number n, keyed by
// the proto enum it mirrors. An API enum missing here fails the test: each
// must have its domain twin.
var domainName = map[protoreflect.FullName]func(n uint8) string{
	"retrypolicy.v1.Category":       func(n uint8) string { return policy.Category(n).String() },
	"retrypolicy.v1.KeyState":       func(n uint8) string { return policy.KeyState(n).String() },
	"retrypolicy.v1.KeyOutcome":     func(n uint8) string { return policy.KeyOutcome(n).String() },
	"retrypolicy.v1.TransportError": func(n uint8) string { return policy.TransportKind(n).String() },
	"retrypolicy.v1.LocalError":     func(n uint8) string { return policy.LocalKind(n).String() },
	"retrypolicy.v1.Jitter":         func(n uint8) string { return policy.Jitter(n).String() },
	"retrypolicy.v1.RetryAfterMode": func(n uint8) string { return policy.RetryAfterMode(n).String() },
	"retrypolicy.v1.Decision":       func(n uint8) string { return policy.Verdict(n).String() },
	"retrypolicy.v1.StopReason":     func(n uint8) string { return policy.StopReason(n).String() },
	"retrypolicy.v1.Disposition":    func(n uint8) string { return policy.Disposition(n).String() },
	"retrypolicy.v1.BreakerState":   func(n uint8) string { return policy.BreakerState(n).String() },
	"retrypolicy.v1.BreakerMode":    func(n uint8) string { return policy.BreakerMode(n).String() },
	"retrypolicy.v1.BreakerScope":   func(n uint8) string { return policy.BreakerScope(n).String() },
	"retrypolicy.v1.AuditEvent":     func(n uint8) string { return policy.AuditEvent(n).String() },
}

// TestEnumsMapByName walks every enum of the API and checks that each value
// converts (by number, as enumToPB and enumFromPB do) to the domain value
// of the same name: BREAKER_STATE_HALF_OPEN to HALF_OPEN and so on.
func TestEnumsMapByName(t *testing.T) {
	files := []protoreflect.FileDescriptor{pb.File_retrypolicy_v1_types_proto,
		pb.File_retrypolicy_v1_retry_policy_service_proto, pb.File_retrypolicy_v1_admin_service_proto}
	seen := 0
	for _, f := range files {
		enums := f.Enums()
		for i := range enums.Len() {
			e := enums.Get(i)
			name, ok := domainName[e.FullName()]
			if !ok {
				t.Errorf("%s has no domain enum in the test's table", e.FullName())
				continue
			}
			seen++
			prefix := upperSnake(string(e.Name())) + "_"
			values := e.Values()
			for j := range values.Len() {
				v := values.Get(j)
				if v.Number() < 0 || v.Number() > 255 {
					t.Errorf("%s = %d does not fit a domain enum", v.FullName(), v.Number())
					continue
				}
				want := strings.TrimPrefix(string(v.Name()), prefix)
				got := name(uint8(v.Number()))
				if v.Number() == 0 && got == "NONE" {
					got = "UNSPECIFIED" // the zero value: NONE in some domain enums
				}
				if got != want {
					t.Errorf("%s = %d: the domain value of that number is %q, want %q", v.FullName(), v.Number(), got, want)
				}
			}
		}
	}
	if seen != len(domainName) {
		t.Errorf("walked %d enums, the table has %d: a stale entry", seen, len(domainName))
	}
}

// TestEnumFromPBRefusesUnknownNumbers: a number the API does not declare,
// and UNSPECIFIED where it is not allowed, name the field.
func TestEnumFromPBRefusesUnknownNumbers(t *testing.T) {
	if _, err := enumFromPB[policy.BreakerState]("state", "", pb.BreakerState(99), true); err == nil ||
		!strings.Contains(err.Error(), "state: must be a known BreakerState value") {
		t.Errorf("99: %v", err)
	}
	if _, err := enumFromPB[policy.TransportKind]("failure", ".transport_error", pb.TransportError(0), false); err == nil ||
		!strings.Contains(err.Error(), "failure.transport_error: must be a known TransportError other than UNSPECIFIED") {
		t.Errorf("UNSPECIFIED: %v", err)
	}
	if got, err := enumFromPB[policy.BreakerState]("state", "", pb.BreakerState_BREAKER_STATE_HALF_OPEN, false); err != nil || got != policy.BreakerHalfOpen {
		t.Errorf("HALF_OPEN: %v, %v", got, err)
	}
}

// upperSnake turns "BreakerState" into "BREAKER_STATE".
func upperSnake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}

// TestMaxAttemptsMessageMatchesTheCheck: 101 is refused with the rule it
// breaks, "must be 1 to 100"; the check used to let up to 10000 through
// that message, leaving the refusal to another with other words.
func TestMaxAttemptsMessageMatchesTheCheck(t *testing.T) {
	for _, n := range []uint32{101, 10000} {
		_, err := policyFromPB("policy", &pb.Policy{MaxAttempts: &n})
		if err == nil || !strings.Contains(err.Error(), "policy.max_attempts: must be 1 to 100") {
			t.Errorf("max_attempts %d: %v, want policy.max_attempts: must be 1 to 100", n, err)
		}
	}
	ok := uint32(100)
	if _, err := policyFromPB("policy", &pb.Policy{MaxAttempts: &ok}); err != nil {
		t.Errorf("max_attempts 100: %v", err)
	}
}
