package breakerstore

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	berrors "go.etcd.io/bbolt/errors"

	"github.com/policyd/policyd/policy"
)

// Sentinel errors. Callers test them with errors.Is; most are wrapped with a
// message naming the object, field or limit involved. Those with a class in
// package policy wrap it, so errors.Is(err, policy.ErrNotFound) holds for
// ErrNotFound and so on, without importing breakerstore.
var (
	// ErrNotFound is returned when a breaker, budget, policy or run does not
	// exist; it wraps policy.ErrNotFound.
	ErrNotFound = fmt.Errorf("breakerstore: %w", policy.ErrNotFound)
	// ErrLocked is returned by Open when another process holds the database file.
	ErrLocked = errors.New("breakerstore: database is held by another process")
	// ErrSchema is returned by Open when the file has an unknown schema version.
	ErrSchema = errors.New("breakerstore: unsupported schema version")
	// ErrCorrupt is returned by Open when the file is not a bbolt database or a
	// record cannot be decoded.
	ErrCorrupt = errors.New("breakerstore: database is corrupt")
	// ErrTooManyBreakers is returned when creating a breaker would exceed
	// Options.MaxBreakersPerTenant; it wraps policy.ErrCapacity.
	ErrTooManyBreakers = fmt.Errorf("breakerstore: too many breakers: %w", policy.ErrCapacity)
	// ErrTooManyTenants reports a new tenant beyond Options.MaxTenants; it
	// wraps policy.ErrCapacity.
	ErrTooManyTenants = fmt.Errorf("breakerstore: too many tenants: %w", policy.ErrCapacity)
	// ErrTooManyAutoTenants reports a new undeclared tenant beyond
	// Options.MaxAutoTenants; it wraps policy.ErrCapacity.
	ErrTooManyAutoTenants = fmt.Errorf("breakerstore: too many undeclared tenants: %w", policy.ErrCapacity)
	// ErrTooManyRuns reports a run beyond Options.MaxRuns; it wraps
	// policy.ErrCapacity.
	ErrTooManyRuns = fmt.Errorf("breakerstore: too many runs: %w", policy.ErrCapacity)
	// ErrExists is returned by OpenRun when the run id is taken; it wraps
	// policy.ErrExists.
	ErrExists = fmt.Errorf("breakerstore: %w", policy.ErrExists)
	// ErrClosed is returned by every method after Close; it wraps
	// policy.ErrClosed.
	ErrClosed = fmt.Errorf("breakerstore: store is %w", policy.ErrClosed)
	// ErrInvalid is returned for bad arguments, wrapped with a message naming
	// the field and the rule and with a *policy.FieldError; it wraps
	// policy.ErrInvalid.
	ErrInvalid = fmt.Errorf("breakerstore: %w", policy.ErrInvalid)
	// ErrDiskFull is returned when a write fails because the disk or the
	// configured Options.MaxSize is full; it wraps policy.ErrCapacity.
	ErrDiskFull = fmt.Errorf("breakerstore: disk full: %w", policy.ErrCapacity)
)

// invalid wraps ErrInvalid and a *policy.FieldError naming the field and the
// rule it breaks: "breakerstore: invalid argument: field: rule".
func invalid(field, rule string) error {
	return fmt.Errorf("%w: %w", ErrInvalid, &policy.FieldError{Field: field, Rule: rule})
}

// storageErr classifies an error from a bbolt write: out-of-space conditions
// become ErrDiskFull, a closed database ErrClosed. bbolt formats some growth
// errors with %s, so the message is checked as well as the chain.
func storageErr(op string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT),
		errors.Is(err, berrors.ErrMaxSizeReached),
		strings.Contains(msg, berrors.ErrMaxSizeReached.Error()),
		strings.Contains(msg, syscall.ENOSPC.Error()):
		return fmt.Errorf("%w: %s: %v", ErrDiskFull, op, err)
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return ErrClosed
	}
	return fmt.Errorf("breakerstore: %s: %w", op, err)
}
