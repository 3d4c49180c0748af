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
	case errors.Is(err, policy.ErrNotFound):
		return status.Error(codes.NotFound, what+": "+policy.ErrNotFound.Error())
	case errors.Is(err, policy.ErrExists):
		return status.Error(codes.AlreadyExists, what+": "+policy.ErrExists.Error())
	case errors.Is(err, policy.ErrInvalid):
		return status.Error(codes.InvalidArgument, fromClass(err, policy.ErrInvalid))
	case errors.Is(err, policy.ErrCapacity):
		return status.Error(codes.ResourceExhausted, fromClass(err, policy.ErrCapacity))
	case errors.Is(err, policy.ErrClosed):
		return status.Error(codes.Unavailable, "policyd is shutting down")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	log.ErrorContext(ctx, "store failure", "op", what, "err", err)
	return status.Error(codes.Internal, what+": internal error (logged by policyd)")
}
