package server

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/fleet"
)

// engineErr is an error of another engine, which knows nothing of
// breakerstore or policy: only the behaviour the handlers declare.
type engineErr struct{ notFound, full, down bool }

func (e engineErr) Error() string      { return "redis: something" }
func (e engineErr) NotFound() bool     { return e.notFound }
func (e engineErr) OverCapacity() bool { return e.full }
func (e engineErr) Unavailable() bool  { return e.down }

// TestStoreErrorsClassifiedByBehaviour: the status of a store error comes
// from the behaviour it implements, whichever engine made it, through
// wrapping; an error of no class is INTERNAL.
func TestStoreErrorsClassifiedByBehaviour(t *testing.T) {
	tests := []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("lookup: %w", engineErr{notFound: true}), codes.NotFound},
		{engineErr{full: true}, codes.ResourceExhausted},
		{engineErr{}, codes.Internal},
		// An engine that did not answer in time is UNAVAILABLE, not the
		// deadline its error wraps.
		{fmt.Errorf("%w: %w", engineErr{down: true}, context.DeadlineExceeded), codes.Unavailable},
		{fmt.Errorf("%w: run %q", breakerstore.ErrNotFound, "r"), codes.NotFound},
		{breakerstore.ErrExists, codes.AlreadyExists},
		{breakerstore.ErrInvalid, codes.InvalidArgument},
		{breakerstore.ErrDiskFull, codes.ResourceExhausted},
		{breakerstore.ErrClosed, codes.Unavailable},
		{fleet.ErrPermit, codes.FailedPrecondition},
	}
	log := slog.New(slog.DiscardHandler)
	for _, tt := range tests {
		if got := status.Code(storeError(context.Background(), log, "op", tt.err)); got != tt.code {
			t.Errorf("%v: %v, want %v", tt.err, got, tt.code)
		}
	}
}
