// Package policyotel records the Go client's events (policyclient.Event) as
// OpenTelemetry metrics. It is a module of its own, so that the client
// itself imports no OpenTelemetry; a worker that wants the metrics adds
// this module and sets
//
//	onEvent, err := policyotel.Metrics(otel.GetMeterProvider())
//	cfg := policyclient.Config{Tenant: "acme", OnEvent: onEvent}
//
// The instruments, all with the attribute policyd.target:
//
//	policyd.client.attempts         counter   attempts started
//	policyd.client.retries          counter   retries scheduled (policyd.reason, policyd.local)
//	policyd.client.retry.delay      histogram waits before a retry, in seconds
//	policyd.client.calls            counter   calls ended (policyd.disposition, policyd.stop_reason)
//	policyd.client.local_decisions  counter   decisions the local policy made (policyd did not answer)
//	policyd.client.breaker.changes  counter   breaker changes seen (policyd.breaker_state)
//	policyd.client.fallbacks        counter   attempts sent on to a fallback target, policyd.target being
//	                                          the target taken (policyd.from_target)
package policyotel
