package redisstore

import (
	"errors"
	"fmt"

	"github.com/policyd/policyd/policy"
)

// Sentinel errors, matched with errors.Is and most wrapped with a message
// naming the object or field. Their class is also behaviour (NotFound,
// AlreadyExists, Invalid, Closed methods returning true), so the server
// classifies them by the interfaces it declares without importing this
// package; each still wraps its class in package policy.
var (
	// ErrNotFound: no breaker, budget, policy or run under that name.
	ErrNotFound error = &classErr{"redisstore: not found", kindNotFound, policy.ErrNotFound}
	// ErrExists: OpenRun with a run id that is taken.
	ErrExists error = &classErr{"redisstore: already exists", kindExists, policy.ErrExists}
	// ErrInvalid: a bad argument; the message names the field and the rule.
	ErrInvalid error = &classErr{"redisstore: invalid argument", kindInvalid, policy.ErrInvalid}
	// ErrTooManyBreakers: a new breaker past Options.MaxBreakersPerTenant.
	ErrTooManyBreakers error = &classErr{"redisstore: too many breakers: over capacity", kindCapacity, policy.ErrCapacity}
	// ErrTooManyKeys: a new idempotency record past
	// Options.MaxKeysPerTenant live ones of its tenant.
	ErrTooManyKeys error = &classErr{"redisstore: too many idempotency keys: over capacity", kindCapacity, policy.ErrCapacity}
	// ErrClosed: every method after Close.
	ErrClosed error = &classErr{"redisstore: store is closed", kindClosed, policy.ErrClosed}
	// ErrUnavailable: Redis did not answer within Options.Timeout, or the
	// Store considers it down (after Options.DownAfter failures in a row,
	// for Options.DownFor between probes). Decisions then go on in
	// degraded mode; admin writes and reads fail with it.
	ErrUnavailable error = &classErr{"redisstore: engine unavailable", kindUnavailable, nil}
	// ErrNotReplicated: an admin write is on the primary but fewer than
	// Options.WaitReplicas replicas acknowledged it in time.
	ErrNotReplicated = errors.New("redisstore: admin write not replicated")
	// ErrSchema: the server holds policyd keys of another schema version.
	ErrSchema = errors.New("redisstore: unsupported schema version")
)

type errKind uint8

const (
	kindNotFound errKind = iota + 1
	kindExists
	kindInvalid
	kindClosed
	kindCapacity
	kindUnavailable
)

// classErr is a sentinel of a kind; its methods expose the kind.
type classErr struct {
	msg  string
	kind errKind
	base error
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

// Unavailable reports whether e says the engine did not answer.
func (e *classErr) Unavailable() bool { return e.kind == kindUnavailable }

// Closed reports whether e says the store is closed.
func (e *classErr) Closed() bool { return e.kind == kindClosed }

// invalid returns ErrInvalid naming field and rule, wrapping a
// *policy.FieldError as breakerstore's do.
func invalid(field, rule string) error {
	return fmt.Errorf("%w: %w", ErrInvalid, &policy.FieldError{Field: field, Rule: rule})
}
