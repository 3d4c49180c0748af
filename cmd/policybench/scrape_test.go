package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
)

// exposition is a metrics page as client_golang writes one: a histogram
// over two label sets and a counter.
const exposition = `# HELP go_sched_latencies_seconds Distribution of the time goroutines have spent in the scheduler in a runnable state before actually running.
# TYPE go_sched_latencies_seconds histogram
go_sched_latencies_seconds_bucket{le="0.0009175039999999999"} 90
go_sched_latencies_seconds_bucket{le="0.010485759999999998"} 97
go_sched_latencies_seconds_bucket{le="0.11744051199999998"} 100
go_sched_latencies_seconds_bucket{le="+Inf"} 100
go_sched_latencies_seconds_sum 0.5
go_sched_latencies_seconds_count 100
policyd_rpc_duration_seconds_bucket{method="Admit",le="0.05"} 7
policyd_rpc_duration_seconds_count{method="Admit"} 8
policyd_rpc_duration_seconds_bucket{method="NextDelay",le="0.05"} 3
policyd_rpc_duration_seconds_count{method="NextDelay"} 5
grpc_server_handled_total{grpc_code="OK",grpc_method="Admit"} 40
grpc_server_handled_total{grpc_code="OK",grpc_method="NextDelay"} 2
`

func servePage(t *testing.T, page string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, page) }))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

func TestScrapeSumsOverLabelSets(t *testing.T) {
	m, err := scrape(context.Background(), servePage(t, exposition), "grpc_server_handled_total", "absent_total")
	if err != nil {
		t.Fatal(err)
	}
	if m["grpc_server_handled_total"] != 42 || len(m) != 1 {
		t.Errorf("got %v, want grpc_server_handled_total 42 and nothing else", m)
	}
}

func TestScrapeBucketsCountsWhatLiesOverABound(t *testing.T) {
	url := servePage(t, exposition)
	le, count, err := scrapeBuckets(context.Background(), url, "go_sched_latencies_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if count != 100 || len(le) != 3 {
		t.Fatalf("got %v buckets and count %v, want 3 finite bounds and 100", le, count)
	}
	if over, bound := bucketsOver(le, count, 0.02); over != 3 || bound != 0.010485759999999998 {
		t.Errorf("over 20ms: got %v above %v, want 3 above the 10.5 ms bound", over, bound)
	}
	if over, bound := bucketsOver(le, count, 0.0001); over != 100 || bound != 0 {
		t.Errorf("under every bound: got %v above %v, want all 100 above 0", over, bound)
	}
	le, count, err = scrapeBuckets(context.Background(), url, "policyd_rpc_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if over, _ := bucketsOver(le, count, 0.05); count != 13 || over != 3 {
		t.Errorf("summed over methods: got count %v, %v over 50ms; want 13 and 3", count, over)
	}
}
