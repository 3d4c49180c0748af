package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/server"
)

// serveConfig is everything `policyd serve` is told by its flags.
type serveConfig struct {
	Listen        string
	DB            string
	Store         string
	StoreTimeout  time.Duration
	WaitReplicas  int
	FlushInterval time.Duration
	Sync          string
	SyncDelay     time.Duration
	Grace         time.Duration
	LogLevel      string
	SlowRequest   time.Duration
	Security      securityConfig
	Limits        limitsConfig
	Config        string
	Observe       observeConfig
	AuditSink     auditSinkConfig
	MaxDBBytes    int
	GCPercent     int
}

func serveCmd() *cobra.Command {
	var cfg serveConfig
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon",
		Long: `Run the daemon on --listen with its state in --db (created on first start).

Durability: admin writes and breaker state transitions are fsync'd before they
are answered. Counters (breaker windows, budget tokens, run ledgers) are
written in group commits, one starting every --flush-interval: a crash loses
at most --flush-interval plus one commit of counting. --sync=always makes
every decision durable before it is answered, at a cost in throughput.

A damaged, empty or foreign --db file is refused with one line naming it;
only a path that does not exist is created.

SIGINT or SIGTERM drains: health turns NOT_SERVING, every open stream
(WatchBreakers included) ends at once with UNAVAILABLE, in-flight calls finish
(for at most --grace), then the state is flushed and the file closed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serve(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:50051", "address to serve gRPC on")
	f.StringVar(&cfg.DB, "db", "policyd.db", "bbolt database file holding the shared state")
	f.StringVar(&cfg.Store, "store", "", "where the shared state lives: bbolt:PATH (the default, --db), or a Redis that many replicas share: redis://[user:pass@]host:port[/db], rediss://... (TLS), redis+sentinel://master@h1:p1,h2:p2, redis+cluster://h1:p1,h2:p2")
	f.DurationVar(&cfg.StoreTimeout, "store-timeout", 50*time.Millisecond, "with a Redis --store: the bound of every call to Redis")
	f.IntVar(&cfg.WaitReplicas, "redis-wait-replicas", 0, "with a Redis --store: every admin write waits (WAIT, up to 1s) until this many replicas of its primary have it, so a failover cannot lose it")
	f.DurationVar(&cfg.FlushInterval, "flush-interval", 100*time.Millisecond, "group-commit interval for counters; a crash loses at most this plus one commit of counting")
	f.StringVar(&cfg.Sync, "sync", "group", "durability of decisions: group (counters flushed every --flush-interval) or always (every decision durable before its answer)")
	f.DurationVar(&cfg.SyncDelay, "sync-batch-delay", 2*time.Millisecond, "with --sync=always: how long a commit waits for concurrent decisions to share its fsync")
	f.DurationVar(&cfg.Grace, "grace", 10*time.Second, "how long a shutdown waits for in-flight calls before cutting them")
	f.StringVar(&cfg.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.DurationVar(&cfg.SlowRequest, "slow-request", server.DefaultSlowRequest, "log the calls that take longer than this to answer, as policyd's handler measures them: at most one WARN line \"slow requests\" a second, with how many and the slowest (0: off)")
	cfg.Security.register(cmd)
	cfg.Limits.register(cmd)
	cfg.Observe.register(cmd)
	cfg.AuditSink.register(cmd)
	f.StringVar(&cfg.Config, "config", "", "policy file (YAML or JSON) of tenant budgets and policies, loaded at start and on SIGHUP, all or nothing")
	f.IntVar(&cfg.GCPercent, "gc-percent", defaultGCPercent, "the Go garbage collector's target (GOGC), unless the GOGC environment variable is set: policyd's live heap is a few MB and every request allocates, so Go's default of 100 collects many times a second; 400 spends a few tens of MB to save CPU on every decision")
	f.IntVar(&cfg.MaxDBBytes, "max-db-bytes", 0, "cap the state file at this many bytes (0: no cap); past it admin writes fail with RESOURCE_EXHAUSTED while decisions are still served from memory. For tests of a full disk (policybench diskfull)")
	return cmd
}

func serve(ctx context.Context, cfg serveConfig) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := newLogger(os.Stderr, level)
	var sync breakerstore.SyncMode
	switch cfg.Sync {
	case "group":
		sync = breakerstore.SyncGroup
	case "always":
		sync = breakerstore.SyncAlways
	default:
		return fmt.Errorf("--sync: must be group or always, got %q", cfg.Sync)
	}
	if cfg.SyncDelay <= 0 || cfg.SyncDelay > time.Second {
		return fmt.Errorf("--sync-batch-delay: must be in (0, 1s], got %s", cfg.SyncDelay)
	}
	if cfg.FlushInterval <= 0 {
		return fmt.Errorf("--flush-interval: must be > 0, got %s", cfg.FlushInterval)
	}
	if cfg.Grace <= 0 {
		return fmt.Errorf("--grace: must be > 0, got %s", cfg.Grace)
	}
	if cfg.SlowRequest < 0 {
		return fmt.Errorf("--slow-request: must be >= 0 (0: off), got %s", cfg.SlowRequest)
	}
	slowRequest := cfg.SlowRequest
	if slowRequest == 0 {
		slowRequest = -1 // server.Config's off
	}

	if cfg.GCPercent < 10 {
		return fmt.Errorf("--gc-percent: must be >= 10, got %d", cfg.GCPercent)
	}
	tuneGC(cfg.GCPercent, log)
	if err := cfg.Limits.validate(); err != nil {
		return err
	}
	if err := cfg.Observe.validate(); err != nil {
		return err
	}
	if err := cfg.Security.checkExposure(cfg.Listen, cfg.Observe.MetricsListen, log); err != nil {
		return err
	}
	tlsOpts, err := cfg.Security.serverOptions()
	if err != nil {
		return err
	}

	sink, closeSink, err := cfg.AuditSink.open(log)
	if err != nil {
		return err
	}
	defer closeSink() // after the store's last commit
	su, err := parseStore(cfg.Store, cfg.DB)
	if err != nil {
		return err
	}
	store, bolt, err := openStore(ctx, su, cfg, breakerstore.Options{
		Path: su.bboltPath, FlushInterval: cfg.FlushInterval, Sync: sync, MaxBatchDelay: cfg.SyncDelay, Logger: log, MaxSize: cfg.MaxDBBytes,
		MaxBreakersPerTenant: cfg.Limits.MaxBreakersPerTenant,
		MaxTenants:           cfg.Limits.MaxTenants,
		MaxAutoTenants:       cfg.Limits.MaxAutoTenants,
		MaxRuns:              cfg.Limits.MaxRuns,
		MaxAttemptRecords:    cfg.Limits.MaxAttemptRecords,
		RunRetention:         cfg.Limits.RunRetention,
		AuditRetention:       cfg.Observe.AuditRetention, AuditMaxRecords: cfg.Observe.AuditMaxRecords,
		AuditSink: sink,
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := store.Close(); err != nil {
			log.Error("closing the state file", "err", err)
		}
	}()
	// The credentials load after the store opened, so a refused state file
	// leaves no new admin token file behind; a token made here is removed
	// again if the daemon fails to start.
	auth, newToken, err := cfg.Security.auth(cfg.DB, log)
	if err != nil {
		return err
	}
	started := false
	defer func() {
		if !started && newToken != "" {
			os.Remove(newToken)
		}
	}()

	var loader *configLoader
	if cfg.Config != "" {
		loader = &configLoader{path: cfg.Config, store: bolt}
		nb, np, err := loader.load()
		if err != nil {
			return err
		}
		log.Info("config loaded", "file", cfg.Config, "tenants", nb, "policies", np)
	}

	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	tel, err := cfg.Observe.start(ctx, store, bolt, su.bboltPath, loader, auth, log)
	if err != nil {
		return err
	}
	defer tel.stop(log)
	srv := server.New(store, server.Config{Logger: log, Auth: auth, Shedder: cfg.Limits.shedder(), Metrics: tel.metrics,
		StreamWorkers: cfg.Limits.streamWorkers(), MaxClockSkew: cfg.Limits.MaxClockSkew,
		DeclaredTenants: cfg.Limits.declaredTenants(bolt), SlowRequest: slowRequest},
		append(append(tlsOpts, cfg.Limits.serverOptions()...), tel.opts...)...)

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	log.Info("policyd serving", "listen", lis.Addr().String(), "store", su.shown,
		"sync", cfg.Sync, "flush_interval", cfg.FlushInterval.String())

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var changed <-chan struct{} // nil without --config: never ready
	if loader != nil {
		var stopWatch func()
		if changed, stopWatch, err = loader.watch(log); err != nil {
			return err
		}
		defer stopWatch()
	}
	started = true
	if newToken != "" {
		log.Info("created the admin token", "file", newToken)
	}
wait:
	for {
		select {
		case err := <-served:
			return err
		case <-hup:
			if loader == nil {
				log.Warn("SIGHUP ignored: no --config file")
				continue
			}
			loader.reload(log, "SIGHUP", false)
		case <-changed:
			loader.reload(log, "file changed", true)
		case <-ctx.Done():
			break wait
		}
	}
	log.Info("draining", "grace", cfg.Grace.String())
	drainCtx, cancel := context.WithTimeout(context.Background(), cfg.Grace)
	defer cancel()
	if err := srv.Shutdown(drainCtx); err != nil {
		log.Warn("grace period over; remaining calls cut")
	}
	if err := <-served; err != nil {
		return err
	}
	log.Info("policyd stopped")
	return nil
}

// defaultGCPercent is --gc-percent's default.
const defaultGCPercent = 400

// tuneGC sets the garbage collector's target to percent unless the GOGC
// environment variable has set it already.
func tuneGC(percent int, log *slog.Logger) {
	if v, ok := os.LookupEnv("GOGC"); ok {
		log.Info("GOGC set by the environment; --gc-percent ignored", "GOGC", v)
		return
	}
	debug.SetGCPercent(percent)
}
