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
// service never stalls a worker. The one exception is a target the client
// knows has a fleet-wide ceiling (a policy's flow.max_in_flight or
// flow.max_rate), which only policyd can keep: no attempt goes to it
// without policyd's lease or rate slot, so while policyd is silent the call
// waits and asks Admit again, and ends a dead letter (StopDeadline, reason
// flow:unavailable) when its deadline leaves no room for an attempt.
//
// Workers that already speak to their upstream through net/http or grpc-go
// plug in there instead: Transport is an http.RoundTripper, and
// UnaryClientInterceptor and StreamClientInterceptor wrap a grpc-go
// connection; each runs the upstream's calls through Do, and sends an
// attempt policyd escalated to a fallback target where the worker says:
// Transport.Hosts, WithFallbackConns. DoValue returns the
// function's value; Config.OnEvent reports the loop's events (the module
// clients/go/policyotel records them as OpenTelemetry metrics).
//
// This package imports only the generated stubs and gRPC; it is a module of
// its own (github.com/policyd/policyd/clients/go/policyclient), so a worker's
// build never meets the daemon's dependencies.
package policyclient
