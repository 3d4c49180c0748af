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
// message naming the object, field or limit involved. Their kind is also
// behaviour (NotFound, AlreadyExists, Invalid, OverCapacity, Closed methods
// returning true), so a consumer classifies them by the interface it
// declares, without importing breakerstore; those with a class in package
// policy still wrap it (errors.Is(err, policy.ErrNotFound) holds).
var (
	// ErrNotFound is returned when a breaker, budget, policy or run does not
	// exist.
	ErrNotFound error = &classErr{"breakerstore: not found", kindNotFound, policy.ErrNotFound}
	// ErrLocked is returned by Open when another process holds the database file.
	ErrLocked = errors.New("breakerstore: database is held by another process")
	// ErrSchema is returned by Open when the file has an unknown schema version.
	ErrSchema = errors.New("breakerstore: unsupported schema version")
	// ErrCorrupt is returned by Open when the file is not a bbolt database or a
	// record cannot be decoded.
	ErrCorrupt = errors.New("breakerstore: database is corrupt")
	// ErrTooManyBreakers is returned when creating a breaker would exceed
	// Options.MaxBreakersPerTenant.
	ErrTooManyBreakers error = &classErr{"breakerstore: too many breakers: over capacity", kindCapacity, policy.ErrCapacity}
	// ErrTooManyTenants reports a new tenant beyond Options.MaxTenants.
	ErrTooManyTenants error = &classErr{"breakerstore: too many tenants: over capacity", kindCapacity, policy.ErrCapacity}
	// ErrTooManyAutoTenants reports a new undeclared tenant beyond
	// Options.MaxAutoTenants.
	ErrTooManyAutoTenants error = &classErr{"breakerstore: too many undeclared tenants: over capacity", kindCapacity, policy.ErrCapacity}
	// ErrTooManyRuns reports a run beyond Options.MaxRuns.
	ErrTooManyRuns error = &classErr{"breakerstore: too many runs: over capacity", kindCapacity, policy.ErrCapacity}
	// ErrExists is returned by OpenRun when the run id is taken.
	ErrExists error = &classErr{"breakerstore: already exists", kindExists, policy.ErrExists}
	// ErrClosed is returned by every method after Close.
	ErrClosed error = &classErr{"breakerstore: store is closed", kindClosed, policy.ErrClosed}
	// ErrInvalid is returned for bad arguments, wrapped with a message naming
	// the field and the rule and with a *policy.FieldError.
	ErrInvalid error = &classErr{"breakerstore: invalid argument", kindInvalid, policy.ErrInvalid}
	// ErrDiskFull is returned when a write fails because the disk or the
	// configured Options.MaxSize is full.
	ErrDiskFull error = &classErr{"breakerstore: disk full: over capacity", kindCapacity, policy.ErrCapacity}
)

// errKind is the kind of a classErr.
type errKind uint8

const (
	kindNotFound errKind = iota + 1
	kindExists
	kindInvalid
	kindCapacity
	kindClosed
)

// classErr is a sentinel of a kind; its methods expose the kind.
type classErr struct {
	msg  string
	kind errKind
	base error // the policy class, for errors.Is
}

func (e *classErr) Error() string { return e.msg }
func (e *classErr) Unwrap() error { return e.base }

// NotFound reports whether e says the object does not exist.
func (e *classErr) NotFound() bool { return e.kind == kindNotFound }

// AlreadyExists reports whether e says the object exists already.
func (e *classErr) AlreadyExists() bool { return e.kind == kindExists }

// Invalid reports whether e says an argument is bad.
func (e *classErr) Invalid() bool { return e.kind == kindInvalid }

// OverCapacity reports whether e says a cap was reached.
func (e *classErr) OverCapacity() bool { return e.kind == kindCapacity }

// Closed reports whether e says the store is closing or closed.
func (e *classErr) Closed() bool { return e.kind == kindClosed }

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
