package redisstore

import (
	"errors"
	"fmt"

	"github.com/policyd/policyd/policy"
)

// Errors, matched with errors.Is. Each wraps the class of policy the server
// maps to a gRPC code.
var (
	// ErrNotFound: no breaker, run or budget under that name.
	ErrNotFound = fmt.Errorf("redisstore: %w", policy.ErrNotFound)
	// ErrSchema: the server holds another schema version of policyd's keys.
	ErrSchema = errors.New("redisstore: unknown schema version")
)

// ErrInvalid: a request field breaks a rule; the message names both.
var ErrInvalid = fmt.Errorf("redisstore: %w", policy.ErrInvalid)
