package policyotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/policyd/policyd/clients/go/policyclient"
)

// scope names the instrumentation scope of the instruments.
const scope = "github.com/policyd/policyd/clients/go/policyotel"

// Metrics returns a function for policyclient.Config.OnEvent that records
// each event with instruments of mp (see the package documentation). The
// function is safe for concurrent use and does not block.
func Metrics(mp metric.MeterProvider) (func(policyclient.Event), error) {
	m := mp.Meter(scope)
	var r recorder
	var err error
	if r.attempts, err = m.Int64Counter("policyd.client.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts the client started.")); err != nil {
		return nil, err
	}
	if r.retries, err = m.Int64Counter("policyd.client.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("Retries the client scheduled.")); err != nil {
		return nil, err
	}
	if r.delay, err = m.Float64Histogram("policyd.client.retry.delay", metric.WithUnit("s"),
		metric.WithDescription("Waits before a retry.")); err != nil {
		return nil, err
	}
	if r.calls, err = m.Int64Counter("policyd.client.calls", metric.WithUnit("{call}"),
		metric.WithDescription("Calls that ended, by disposition and stop reason.")); err != nil {
		return nil, err
	}
	if r.local, err = m.Int64Counter("policyd.client.local_decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions the local policy made because policyd did not answer in time.")); err != nil {
		return nil, err
	}
	if r.breakers, err = m.Int64Counter("policyd.client.breaker.changes", metric.WithUnit("{change}"),
		metric.WithDescription("Breaker state changes the client saw.")); err != nil {
		return nil, err
	}
	if r.fallbacks, err = m.Int64Counter("policyd.client.fallbacks", metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts sent to another target of the call's escalation chain.")); err != nil {
		return nil, err
	}
	return r.record, nil
}

type recorder struct {
	attempts, retries, calls, local, breakers, fallbacks metric.Int64Counter
	delay                                                metric.Float64Histogram
}

func (r *recorder) record(e policyclient.Event) {
	ctx := context.Background()
	target := attribute.String("policyd.target", e.Target)
	switch e.Kind {
	case policyclient.EventAttemptStarted:
		r.attempts.Add(ctx, 1, metric.WithAttributes(target))
	case policyclient.EventRetryScheduled:
		r.retries.Add(ctx, 1, metric.WithAttributes(target, attribute.String("policyd.reason", e.Reason),
			attribute.Bool("policyd.local", e.Local)))
		r.delay.Record(ctx, e.Delay.Seconds(), metric.WithAttributes(target))
	case policyclient.EventCallEnded:
		r.calls.Add(ctx, 1, metric.WithAttributes(target, attribute.String("policyd.disposition", e.Disposition.String()),
			attribute.String("policyd.stop_reason", e.StopReason.String())))
	case policyclient.EventLocalDecision:
		r.local.Add(ctx, 1, metric.WithAttributes(target))
	case policyclient.EventBreakerChanged:
		r.breakers.Add(ctx, 1, metric.WithAttributes(target, attribute.String("policyd.breaker_state", e.Breaker.String())))
	case policyclient.EventFallbackTaken:
		r.fallbacks.Add(ctx, 1, metric.WithAttributes(target, attribute.String("policyd.from_target", e.From)))
	}
}
