// Package server implements policyd's gRPC services, RetryPolicyService for
// workers and AdminService for operators, over a Store it declares itself.
//
// This package is the only place where protobuf types meet domain types
// (convert.go) and where gRPC status codes are chosen: INVALID_ARGUMENT for a
// bad field, with a message naming the field and the rule; NOT_FOUND,
// ALREADY_EXISTS and FAILED_PRECONDITION for state; RESOURCE_EXHAUSTED for
// caps; UNAVAILABLE while draining; INTERNAL only for real bugs, with the cause
// logged and not sent. A decision not to retry is an OK answer with a reason,
// never an error.
package server
