package breakerstore

import (
	"fmt"
	"strings"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// keyLess reports whether k sorts before o: by Tenant, then Target, which
// is the byte order of their on-disk form tenant 0x00 target.
func keyLess(k, o policy.BreakerKey) bool { return keyCompare(k, o) < 0 }

// keyCompare orders keys as keyLess does: -1, 0 or +1.
func keyCompare(k, o policy.BreakerKey) int {
	if c := strings.Compare(k.Tenant, o.Tenant); c != 0 {
		return c
	}
	return strings.Compare(k.Target, o.Target)
}

// checkName validates a tenant, target or id by fleet.CheckName's rule;
// empty reports whether "" is allowed.
func checkName(field, v string, empty bool) error { return fieldErr(fleet.CheckName(field, v, empty)) }

// checkBreakerKey validates a breaker key by fleet.CheckBreakerKey's rule.
func checkBreakerKey(k policy.BreakerKey) error { return fieldErr(fleet.CheckBreakerKey(k)) }

// fieldErr is fe as this package's ErrInvalid, nil for none.
func fieldErr(fe *policy.FieldError) error {
	if fe == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalid, fe)
}

// joinKey returns a 0x00 b as a fresh byte slice.
func joinKey(a, b string) []byte {
	k := make([]byte, 0, len(a)+1+len(b))
	k = append(k, a...)
	k = append(k, 0)
	return append(k, b...)
}

// splitKey splits a key written by joinKey; ok is false without a 0x00.
func splitKey(k []byte) (a, b string, ok bool) {
	i := strings.IndexByte(string(k), 0)
	if i < 0 {
		return "", "", false
	}
	return string(k[:i]), string(k[i+1:]), true
}
