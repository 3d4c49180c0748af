package breakerstore

import (
	"strings"

	"github.com/policyd/policyd/policy"
)

// maxNameLen is the longest tenant, target, run id or call id accepted, in bytes.
const maxNameLen = 1024

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

// checkName validates a tenant, target or id; empty reports whether "" is allowed.
func checkName(field, v string, empty bool) error {
	switch {
	case v == "" && !empty:
		return invalid(field, "must not be empty")
	case len(v) > maxNameLen:
		return invalid(field, "must be at most 1024 bytes")
	case strings.IndexByte(v, 0) >= 0:
		return invalid(field, "must not contain a NUL (0x00) byte")
	}
	return nil
}

// checkBreakerKey validates a breaker key: any tenant (including ""), a
// non-empty target.
func checkBreakerKey(k policy.BreakerKey) error {
	if err := checkName("tenant", k.Tenant, true); err != nil {
		return err
	}
	return checkName("target", k.Target, false)
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
