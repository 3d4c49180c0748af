package server

import (
	"context"
	"errors"
	"log/slog"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/policy"
)

// invalid returns INVALID_ARGUMENT naming the field and the rule it broke,
// with the same pair as a BadRequest detail for programs.
func invalid(field, rule string) error {
	st := status.New(codes.InvalidArgument, field+": "+rule)
	if d, err := st.WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: rule}},
	}); err == nil {
		st = d
	}
	return st.Err()
}

// invalidFrom turns a *policy.FieldError into INVALID_ARGUMENT, prefixing its
// field with the request path it came from (e.g. "policy.").
func invalidFrom(prefix string, err error) error {
	var fe *policy.FieldError
	if errors.As(err, &fe) {
		return invalid(prefix+fe.Field, fe.Rule)
	}
	return invalid(prefix, err.Error())
}

// fromClass is err's message from its class on ("over capacity: ..."):
// what an engine puts before the class (its package name, "breakerstore:")
// is the engine's business, not the client's.
func fromClass(err, class error) string {
	msg := err.Error()
	if i := strings.Index(msg, class.Error()); i >= 0 {
		return msg[i:]
	}
	return msg
}

// storeError maps a store error to a status. Only errors of unknown class
// become INTERNAL, and their cause is logged, not sent.
func storeError(ctx context.Context, log *slog.Logger, what string, err error) error {
	switch {
	case err == nil:
		return nil
	case precondition(err):
		return status.Error(codes.FailedPrecondition, err.Error())
	case notFound(err):
		return status.Error(codes.NotFound, what+": "+policy.ErrNotFound.Error())
	case has(err, alreadyExister.AlreadyExists):
		return status.Error(codes.AlreadyExists, what+": "+policy.ErrExists.Error())
	case has(err, invalider.Invalid):
		return status.Error(codes.InvalidArgument, fromClass(err, policy.ErrInvalid))
	case overCapacity(err):
		return status.Error(codes.ResourceExhausted, fromClass(err, policy.ErrCapacity))
	case has(err, closer.Closed):
		return status.Error(codes.Unavailable, "policyd is shutting down")
	case has(err, unsupporter.Unsupported):
		return status.Error(codes.Unimplemented, what+": "+err.Error())
	case unavailable(err):
		return status.Error(codes.Unavailable, what+": the store is unavailable, try again later")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	log.ErrorContext(ctx, "store failure", "op", what, "err", err)
	return status.Error(codes.Internal, what+": internal error (logged by policyd)")
}

// The classes of store errors the handlers tell apart, as behaviour the
// errors implement (breakerstore's sentinels, fleet.Refusal): the handlers
// declare what they need to know, and no package of errors is shared.
type (
	preconditioner interface{ FailedPrecondition() bool } // the request conflicts with the state
	notFounder     interface{ NotFound() bool }           // the object does not exist
	alreadyExister interface{ AlreadyExists() bool }      // the object exists already
	invalider      interface{ Invalid() bool }            // an argument is bad
	overCapacityer interface{ OverCapacity() bool }       // a cap is reached: too many, disk full
	closer         interface{ Closed() bool }             // the store is closing or closed
	unsupporter    interface{ Unsupported() bool }        // the engine does not offer the operation
	unavailabler   interface{ Unavailable() bool }        // the store's engine did not answer or is down
)

// has reports whether err, or an error it wraps, has the behaviour B and
// says so through is.
func has[B any](err error, is func(B) bool) bool {
	if err == nil {
		return false // and b, which errors.As makes escape, is not allocated
	}
	var b B
	return errors.As(err, &b) && is(b)
}

// precondition reports whether err conflicts with the state.
func precondition(err error) bool { return has(err, preconditioner.FailedPrecondition) }

// notFound reports whether err says the object does not exist.
func notFound(err error) bool { return has(err, notFounder.NotFound) }

// overCapacity reports whether err says a cap is reached.
func overCapacity(err error) bool { return has(err, overCapacityer.OverCapacity) }

// unavailable reports whether err says the store's engine is out of reach.
func unavailable(err error) bool { return has(err, unavailabler.Unavailable) }
