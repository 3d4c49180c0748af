package policyotel_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/policyd/policyd/clients/go/policyclient"
	"github.com/policyd/policyd/clients/go/policyotel"
)

// clock is the client's Sleep and Now: Sleep moves the time on at once.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	return ctx.Err()
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// TestMetricsOfACallDecidedLocally: a real client, with policyd away (a
// closed loopback port), runs a call that fails with 503 then 404; the
// events it emits land in a real SDK meter provider.
func TestMetricsOfACallDecidedLocally(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	onEvent, err := policyotel.Metrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	clk := &clock{now: time.Now()}
	c, err := policyclient.Dial(addr, policyclient.Config{Tenant: "acme", NoWatch: true, Sleep: clk.Sleep, Now: clk.Now,
		OnEvent: onEvent, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // nobody would take the outcomes: drop them at once
		c.Close(ctx)
	})
	errs := []error{policyclient.HTTPError(503, nil), policyclient.HTTPError(404, nil)}
	res, _ := c.Do(context.Background(), policyclient.Call{Target: "portal", Idempotent: true},
		func(_ context.Context, a policyclient.Attempt) error { return errs[a.Number-1] })
	if res.Disposition != policyclient.FailedTerminal {
		t.Fatalf("got %v, want failed_terminal", res.Disposition)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	var delays uint64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					if v, _ := p.Attributes.Value("policyd.target"); v.AsString() != "portal" {
						t.Errorf("%s: target %q, want portal", m.Name, v.AsString())
					}
					sums[m.Name+attrs(p.Attributes)] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					delays += p.Count
				}
			}
		}
	}
	want := map[string]int64{
		"policyd.client.attempts":        2,
		"policyd.client.local_decisions": 2,
		"policyd.client.retries{policyd.local=true,policyd.reason=transient:503}":                1,
		"policyd.client.calls{policyd.disposition=failed_terminal,policyd.stop_reason=TERMINAL}": 1,
	}
	for k, v := range want {
		if sums[k] != v {
			t.Errorf("%s: got %d, want %d (all: %v)", k, sums[k], v, sums)
		}
	}
	if len(sums) != len(want) {
		t.Errorf("series: got %v, want %v", sums, want)
	}
	if delays != 1 {
		t.Errorf("retry delays recorded: got %d, want 1", delays)
	}
}

// attrs spells a point's attributes other than the target, sorted.
func attrs(s attribute.Set) string {
	out := ""
	for _, kv := range s.ToSlice() {
		if kv.Key == "policyd.target" {
			continue
		}
		if out != "" {
			out += ","
		}
		out += string(kv.Key) + "=" + kv.Value.Emit()
	}
	if out == "" {
		return ""
	}
	return "{" + out + "}"
}

// TestMetricsOfAFallbackTaken: EventFallbackTaken counts in
// policyd.client.fallbacks under the target taken and the one left.
func TestMetricsOfAFallbackTaken(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	onEvent, err := policyotel.Metrics(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		onEvent(policyclient.Event{Kind: policyclient.EventFallbackTaken, Target: "geo-b", From: "geo-a", Attempt: 2})
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if data, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, p := range data.DataPoints {
					v, _ := p.Attributes.Value("policyd.target")
					got[m.Name+"/"+v.AsString()+attrs(p.Attributes)] += p.Value
				}
			}
		}
	}
	if want := "map[policyd.client.fallbacks/geo-b{policyd.from_target=geo-a}:2]"; fmt.Sprint(got) != want {
		t.Fatalf("got %v, want %s", got, want)
	}
}
