package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/redisstore"
	"github.com/policyd/policyd/server"
	"github.com/policyd/policyd/statuspage"
)

// observeConfig is what `policyd serve` is told about the audit trail,
// metrics and tracing.
type observeConfig struct {
	AuditRetention  time.Duration
	AuditMaxRecords int
	MetricsListen   string
	OTLPEndpoint    string
}

func (o *observeConfig) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.DurationVar(&o.AuditRetention, "audit-retention", breakerstore.DefaultAuditRetention,
		"how long audit records are kept (records are written with the counters, every --flush-interval)")
	f.IntVar(&o.AuditMaxRecords, "audit-max-records", breakerstore.DefaultAuditMaxRecords,
		"most audit records kept; the oldest are deleted past it")
	f.StringVar(&o.MetricsListen, "metrics-listen", "",
		"serve Prometheus metrics on http://ADDR/metrics and the live status page on /status (and /status.json), e.g. 127.0.0.1:9464 (empty: off); off loopback the status page needs the admin token")
	f.StringVar(&o.OTLPEndpoint, "otlp-endpoint", "",
		"export OpenTelemetry traces of every RPC over OTLP/gRPC to this collector: host:port (plaintext) or an http:// or https:// URL (empty: off)")
}

// validate checks the flags before anything is opened.
func (o *observeConfig) validate() error {
	if o.AuditRetention <= 0 {
		return fmt.Errorf("--audit-retention: must be > 0, got %s", o.AuditRetention)
	}
	if o.AuditMaxRecords <= 0 {
		return fmt.Errorf("--audit-max-records: must be > 0, got %d", o.AuditMaxRecords)
	}
	return nil
}

// telemetry is the running metrics endpoint and trace exporter; the zero
// value (both off) is ready to use.
type telemetry struct {
	metrics *server.Metrics
	opts    []grpc.ServerOption
	http    *http.Server
	status  *statuspage.Page
	served  chan error
	tracer  *sdktrace.TracerProvider
}

// start opens the metrics listener (with the status page) and the trace
// exporter the flags ask for; loader, when not nil, is the policy file
// whose reloads are reported, and auth says who may read the status page
// off loopback. The caller must call stop.
// start serves the metrics and the status page of store when
// --metrics-listen is set; bolt is the same store when it is the bbolt
// engine (its write statistics), nil otherwise, and stateFile its path.
func (o *observeConfig) start(ctx context.Context, store statuspage.Source, bolt *breakerstore.Store, stateFile string, loader *configLoader, auth *server.Auth, log *slog.Logger) (*telemetry, error) {
	t := &telemetry{}
	if o.MetricsListen != "" {
		reg := prometheus.NewRegistry()
		m, err := server.NewMetrics(reg, server.MetricsOptions{})
		if err != nil {
			return nil, err
		}
		reg.MustRegister(
			// The scheduler's series with the default ones: how long
			// runnable goroutines waited to run (go_sched_latencies_seconds)
			// tells a replica short of a core from one waiting on its
			// engine, and the stop-the-world pauses are the GC's share.
			collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler)),
			collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
			buildInfoCollector(readBuildVersion()),
		)
		if bolt != nil { // the bbolt store's write statistics; a Redis store has none yet
			reg.MustRegister(storeCollector(bolt))
		}
		if e, ok := store.(engineHealth); ok { // the Redis engine's
			reg.MustRegister(engineCollector(e))
		}
		if l, ok := store.(interface{ RoundTripLatency() prometheus.Collector }); ok {
			reg.MustRegister(l.RoundTripLatency())
		}
		if loader != nil {
			reg.MustRegister(reloadCollector(loader))
		}
		lis, err := net.Listen("tcp", o.MetricsListen)
		if err != nil {
			return nil, fmt.Errorf("--metrics-listen: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError),
		}))
		t.status = statuspage.New(statuspage.Config{
			Source: store, Health: storeHealth(store, bolt, stateFile), Replicas: statusReplicas(store, bolt, stateFile), Logger: log,
			Open: statusOpen(o.MetricsListen, auth), Admin: auth.AdminToken,
		})
		t.status.Register(mux)
		t.metrics = m
		t.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		t.served = make(chan error, 1)
		go func() { t.served <- t.http.Serve(lis) }()
		log.Info("metrics serving", "listen", lis.Addr().String(), "path", "/metrics", "status_page", "/status")
	}
	if o.OTLPEndpoint != "" {
		opt := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(o.OTLPEndpoint), otlptracegrpc.WithInsecure()}
		if strings.Contains(o.OTLPEndpoint, "://") {
			opt = []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(o.OTLPEndpoint)}
		}
		exp, err := otlptracegrpc.New(ctx, opt...)
		if err != nil {
			t.stop(log)
			return nil, fmt.Errorf("--otlp-endpoint: %w", err)
		}
		t.tracer = sdktrace.NewTracerProvider(
			sdktrace.WithBatcher(exp),
			sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "policyd"))),
		)
		t.opts = append(t.opts, grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(t.tracer),
			otelgrpc.WithPropagators(propagation.TraceContext{}),
		)))
		log.Info("tracing to OTLP collector", "endpoint", o.OTLPEndpoint)
	}
	return t, nil
}

// stop shuts the metrics endpoint down and flushes the traces, each within
// a few seconds.
func (t *telemetry) stop(log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if t.http != nil {
		t.status.Close() // ends the event streams, which Shutdown would wait for
		if err := t.http.Shutdown(ctx); err != nil {
			log.Warn("metrics endpoint did not stop cleanly", "err", err)
		}
		if err := <-t.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics endpoint failed", "err", err)
		}
	}
	if t.tracer != nil {
		if err := t.tracer.Shutdown(ctx); err != nil {
			log.Warn("traces not all exported", "err", err)
		}
	}
}

// storeCollector exposes the store's own counters.
func storeCollector(store *breakerstore.Store) prometheus.Collector {
	return collectorFunc{
		descs: []*prometheus.Desc{descAuditRecords, descAuditBuffered, descAuditDropped, descAuditDeleted, descFlushErrors, descCommits, descAuditSinkErrors},
		collect: func(ch chan<- prometheus.Metric) {
			st := store.Stats()
			ch <- prometheus.MustNewConstMetric(descAuditRecords, prometheus.GaugeValue, float64(st.AuditRecords))
			ch <- prometheus.MustNewConstMetric(descAuditBuffered, prometheus.GaugeValue, float64(st.AuditBuffered))
			ch <- prometheus.MustNewConstMetric(descAuditDropped, prometheus.CounterValue, float64(st.AuditDropped))
			ch <- prometheus.MustNewConstMetric(descAuditDeleted, prometheus.CounterValue, float64(st.AuditDeleted))
			ch <- prometheus.MustNewConstMetric(descFlushErrors, prometheus.CounterValue, float64(st.FlushErrors))
			ch <- prometheus.MustNewConstMetric(descCommits, prometheus.CounterValue, float64(st.Commits))
			ch <- prometheus.MustNewConstMetric(descAuditSinkErrors, prometheus.CounterValue, float64(st.AuditSinkErrors))
		},
	}
}

// statusOpen reports whether the status page on the metrics listener
// needs no credential: the listener is on loopback, or admin calls are open
// (--open-admin). Otherwise it needs the admin token.
func statusOpen(metricsListen string, auth *server.Auth) bool {
	return loopback(metricsListen) || auth.OpenAdmin()
}

// storeHealth reports the store's counters to the status page: the bbolt
// store's (bolt, on stateFile), or whether a shared engine answers and
// this replica's id in its replica set.
func storeHealth(store statuspage.Source, bolt *breakerstore.Store, stateFile string) func() statuspage.StoreHealth {
	if bolt == nil {
		return func() statuspage.StoreHealth {
			h := statuspage.StoreHealth{Engine: "redis"}
			if e, ok := store.(engineHealth); ok {
				h.Degraded = !e.Up()
				h.AuditBuffered, h.AuditDropped = e.AuditBuffered(), e.AuditDropped()
			}
			if rs, ok := store.(replicaSet); ok {
				h.Replica = rs.ReplicaID()
			}
			return h
		}
	}
	return func() statuspage.StoreHealth {
		st := bolt.Stats()
		return statuspage.StoreHealth{Engine: "bbolt", File: filepath.Base(stateFile), Breakers: st.Breakers, Tenants: st.Tenants, Runs: st.Runs,
			Commits: st.Commits, FlushErrors: st.FlushErrors,
			AuditRecords: st.AuditRecords, AuditBuffered: st.AuditBuffered, AuditDropped: st.AuditDropped}
	}
}

// replicaSet is a shared engine's replica set (redisstore.Store).
type replicaSet interface {
	ReplicaID() string
	Replicas() ([]redisstore.Replica, error)
}

// statusReplicas is what the status page lists as replicas: a shared
// engine's replica set, or the bbolt file's sole daemon, named after the
// file.
func statusReplicas(store statuspage.Source, bolt *breakerstore.Store, stateFile string) statuspage.Replicas {
	if rs, ok := store.(replicaSet); ok && bolt == nil {
		return pageReplicas{rs}
	}
	return statuspage.Sole(filepath.Base(stateFile))
}

// pageReplicas adapts a replicaSet to statuspage.Replicas.
type pageReplicas struct{ rs replicaSet }

func (p pageReplicas) Replicas() ([]statuspage.Replica, error) {
	rs, err := p.rs.Replicas()
	self := p.rs.ReplicaID()
	out := make([]statuspage.Replica, 0, len(rs))
	for _, r := range rs {
		out = append(out, statuspage.Replica{ID: r.ID, LastSeen: r.LastSeen, Self: r.ID == self})
	}
	return out, err
}

// reloadCollector reports the policy file's last load:
// policyd_config_last_reload_successful (1 or 0) and
// policyd_config_last_reload_success_timestamp_seconds.
func reloadCollector(l *configLoader) prometheus.Collector {
	return collectorFunc{
		descs: []*prometheus.Desc{descReloadOK, descReloadTime},
		collect: func(ch chan<- prometheus.Metric) {
			ok, at := l.lastLoad()
			v := 0.0
			if ok {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(descReloadOK, prometheus.GaugeValue, v)
			ch <- prometheus.MustNewConstMetric(descReloadTime, prometheus.GaugeValue, float64(at.UnixNano())/1e9)
		},
	}
}

// buildInfoCollector is policyd_build_info: always 1, with the binary's
// version, VCS revision and Go release as labels.
func buildInfoCollector(v buildVersion) prometheus.Collector {
	rev := v.Revision
	if v.Modified {
		rev += "-dirty"
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "policyd_build_info",
		Help:        "Always 1; the labels say which build of policyd is running.",
		ConstLabels: prometheus.Labels{"version": v.Version, "revision": rev, "goversion": v.GoVersion},
	}, func() float64 { return 1 })
}

var (
	descAuditRecords  = prometheus.NewDesc("policyd_audit_records", "Audit records on disk.", nil, nil)
	descAuditBuffered = prometheus.NewDesc("policyd_audit_buffered", "Audit records waiting to be written: for the next group commit, or a replica's next flush.", nil, nil)
	descAuditDropped  = prometheus.NewDesc("policyd_audit_dropped_total", "Audit records dropped because the buffer was full: appended faster than written, or while a shared store did not answer.", nil, nil)
	descAuditDeleted  = prometheus.NewDesc("policyd_audit_deleted_total", "Audit records deleted by retention (age or count).", nil, nil)
	descFlushErrors   = prometheus.NewDesc("policyd_store_flush_errors_total", "Failed group commits (retried at the next interval).", nil, nil)
	descCommits       = prometheus.NewDesc("policyd_store_commits_total", "Write transactions committed to the state file.", nil, nil)
	descReloadOK      = prometheus.NewDesc("policyd_config_last_reload_successful",
		"1 if the last load of the policy file (--config) was applied, 0 if it was refused and nothing changed.", nil, nil)
	descReloadTime = prometheus.NewDesc("policyd_config_last_reload_success_timestamp_seconds",
		"When the policy file was last applied, in seconds since the Unix epoch.", nil, nil)
)

// engineHealth is a shared engine's health: whether it answers, and the
// outcome batches waiting for it (redisstore.Store).
type engineHealth interface {
	Up() bool
	Queued() int
	Dropped() uint64
	DegradedAttempts() int
	DegradedAttemptsNotKept() uint64
	RoundTrips() map[string]uint64
	AuditBuffered() int
	AuditDropped() uint64
	Downs() uint64
}

var (
	descStoreUp      = prometheus.NewDesc("policyd_store_up", "1 while the shared store answers, 0 while decisions run in degraded mode.", nil, nil)
	descStoreDowns   = prometheus.NewDesc("policyd_store_down_total", "Times the shared store stopped answering and decisions went into degraded mode.", nil, nil)
	descQueued       = prometheus.NewDesc("policyd_store_queued_batches", "Outcome batches waiting for the shared store to answer again.", nil, nil)
	descQueueDropped = prometheus.NewDesc("policyd_store_dropped_batches_total", "Outcome batches dropped because the queue was full while the shared store was down.", nil, nil)
	descDownAttempts = prometheus.NewDesc("policyd_store_degraded_attempts",
		"Attempt records this replica decided while the shared store was down, not written to it yet.", nil, nil)
	descDownNotKept = prometheus.NewDesc("policyd_store_degraded_attempts_not_kept_total",
		"Attempt records decided while the shared store was down that this replica could not keep (too many kept): their NextDelays asked again are decided afresh.", nil, nil)
	descRoundTrips = prometheus.NewDesc("policyd_store_round_trips_total",
		"Round trips this replica made to the shared store, by call: a library function's name, another command's, or pipeline.", []string{"call"}, nil)
)

// engineCollector is policyd_store_up and _down_total, the outcome queue's gauge and
// counter, the degraded attempt records' gauge and counter, the round
// trips by call and the audit buffer's gauge and counter of a shared
// engine, read at scrape.
func engineCollector(e engineHealth) prometheus.Collector {
	return collectorFunc{
		descs: []*prometheus.Desc{descStoreUp, descStoreDowns, descQueued, descQueueDropped, descDownAttempts, descDownNotKept, descRoundTrips,
			descAuditBuffered, descAuditDropped},
		collect: func(ch chan<- prometheus.Metric) {
			up := 0.0
			if e.Up() {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(descStoreUp, prometheus.GaugeValue, up)
			ch <- prometheus.MustNewConstMetric(descStoreDowns, prometheus.CounterValue, float64(e.Downs()))
			ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(e.Queued()))
			ch <- prometheus.MustNewConstMetric(descQueueDropped, prometheus.CounterValue, float64(e.Dropped()))
			ch <- prometheus.MustNewConstMetric(descDownAttempts, prometheus.GaugeValue, float64(e.DegradedAttempts()))
			ch <- prometheus.MustNewConstMetric(descDownNotKept, prometheus.CounterValue, float64(e.DegradedAttemptsNotKept()))
			for call, n := range e.RoundTrips() {
				ch <- prometheus.MustNewConstMetric(descRoundTrips, prometheus.CounterValue, float64(n), call)
			}
			ch <- prometheus.MustNewConstMetric(descAuditBuffered, prometheus.GaugeValue, float64(e.AuditBuffered()))
			ch <- prometheus.MustNewConstMetric(descAuditDropped, prometheus.CounterValue, float64(e.AuditDropped()))
		},
	}
}

// collectorFunc is a prometheus.Collector made of its descriptions and a
// function.
type collectorFunc struct {
	descs   []*prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }
