package policy

import "errors"

// Classes of errors a state store reports. A store wraps them in sentinels
// named after itself (breakerstore.ErrNotFound wraps ErrNotFound), so callers
// match the class with errors.Is without importing the store.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
	ErrInvalid  = errors.New("invalid argument")
	// ErrCapacity reports a cap reached: too many breakers, a full disk.
	ErrCapacity = errors.New("over capacity")
	// ErrClosed reports a store that is closing or closed.
	ErrClosed = errors.New("closed")
)
