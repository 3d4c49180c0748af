// Package policyclient runs retry loops for Go workers with policyd's
// fleet-wide decisions.
//
// A worker hands Do one function; Do admits each attempt through the shared
// circuit breaker (at no RPC cost while the breaker is CLOSED, thanks to a
// cache fed by WatchBreakers), applies the per-attempt timeout, classifies
// the error, asks policyd how long to wait or why to stop, waits without
// ignoring ctx, and reports outcomes asynchronously in batches. When policyd
// cannot be reached, or does not answer within the decision timeout, the
// client decides with a local copy of the default policy and a local retry
// budget, and goes back to policyd once it answers again: the decision
// service never stalls a worker.
//
// This package imports only the generated stubs and gRPC.
package policyclient
