package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/redisstore"
	"github.com/policyd/policyd/server"
)

// storeURL is a parsed --store: a bbolt file, or a Redis the replicas
// share.
type storeURL struct {
	bboltPath string                // bbolt:PATH (or --db)
	redis     redis.UniversalClient // redis://, rediss://, redis+sentinel://, redis+cluster://
	shown     string                // the URL without its password, for the logs
}

// parseStore reads --store; empty means the bbolt file --db. The Redis
// forms are
//
//	redis://[user:pass@]host:port[/db]          one server (rediss:// with TLS)
//	redis+sentinel://[user:pass@]master@h1:p1,h2:p2[/db]  a Sentinel-managed primary
//	redis+cluster://[user:pass@]h1:p1,h2:p2     a Redis Cluster (seed nodes)
//
// A bad value is an error naming --store and the rule.
func parseStore(s, db string) (storeURL, error) {
	scheme, rest, ok := strings.Cut(s, ":")
	switch {
	case s == "":
		return storeURL{bboltPath: db, shown: "bbolt:" + db}, nil
	case ok && scheme == "bbolt":
		if rest == "" {
			return storeURL{}, fmt.Errorf("--store: bbolt:PATH needs a path")
		}
		return storeURL{bboltPath: rest, shown: s}, nil
	case ok && (scheme == "redis" || scheme == "rediss"):
		opts, err := redis.ParseURL(s)
		if err != nil {
			return storeURL{}, fmt.Errorf("--store: %w", err)
		}
		opts.ContextTimeoutEnabled = true                      // so --store-timeout bounds every call
		opts.Dialer = redisstore.Dialer(redis.NewDialer(opts)) // back at once after a restart of Redis
		return storeURL{redis: redis.NewClient(opts), shown: redact(s)}, nil
	case ok && (scheme == "redis+sentinel" || scheme == "redis+cluster"):
		return parseMultiHost(scheme, s)
	}
	return storeURL{}, fmt.Errorf("--store: must be bbolt:PATH, redis://, rediss://, redis+sentinel:// or redis+cluster://, got %q", redact(s))
}

// parseMultiHost reads the Sentinel and Cluster forms, whose host part is
// a comma-separated list net/url does not parse.
func parseMultiHost(scheme, s string) (storeURL, error) {
	body := strings.TrimPrefix(s, scheme+"://")
	if body == s {
		return storeURL{}, fmt.Errorf("--store: %s needs %s://", scheme, scheme)
	}
	body, path, _ := strings.Cut(body, "/")
	var user, pass, master string
	if at := strings.LastIndex(body, "@"); at >= 0 {
		head := body[:at]
		body = body[at+1:]
		if scheme == "redis+sentinel" {
			if i := strings.LastIndex(head, "@"); i >= 0 {
				head, master = head[:i], head[i+1:]
			} else {
				head, master = "", head
			}
		}
		if head != "" {
			u, err := url.Parse("redis://" + head + "@x")
			if err != nil {
				return storeURL{}, fmt.Errorf("--store: user and password: %w", err)
			}
			user = u.User.Username()
			pass, _ = u.User.Password()
		}
	}
	var addrs []string
	for _, a := range strings.Split(body, ",") {
		if _, port, ok := strings.Cut(a, ":"); !ok || port == "" {
			return storeURL{}, fmt.Errorf("--store: %s: every address must be host:port, got %q", scheme, a)
		}
		addrs = append(addrs, a)
	}
	u := storeURL{shown: redact(s)}
	switch scheme {
	case "redis+sentinel":
		if master == "" {
			return storeURL{}, fmt.Errorf("--store: redis+sentinel:// needs the master's name: redis+sentinel://master@h1:p1,h2:p2")
		}
		db := 0
		if path != "" {
			n, err := strconv.Atoi(path)
			if err != nil || n < 0 {
				return storeURL{}, fmt.Errorf("--store: the database must be a number >= 0, got %q", path)
			}
			db = n
		}
		u.redis = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: addrs,
			Username: user, Password: pass, DB: db, ContextTimeoutEnabled: true, Dialer: nodeDialer()})
	default:
		if path != "" {
			return storeURL{}, fmt.Errorf("--store: redis+cluster:// takes no database (Cluster has only 0), got /%s", path)
		}
		u.redis = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Username: user, Password: pass,
			ContextTimeoutEnabled: true, Dialer: nodeDialer()})
	}
	return u, nil
}

// nodeDialer is the dialer of the Sentinel and Cluster clients: go-redis's
// default (no TLS in these forms), through redisstore.Dialer.
func nodeDialer() func(ctx context.Context, network, addr string) (net.Conn, error) {
	return redisstore.Dialer(redis.NewDialer(&redis.Options{DialTimeout: 5 * time.Second}))
}

// redact replaces the password of a URL with xxxxx, for logs and errors.
func redact(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	at := strings.Index(rest, "@")
	if at < 0 {
		return s
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return s
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}

// stateStore is the store serve hands the server, with its Close.
type stateStore interface {
	server.Store
	Close() error
}

// openStore opens the store su names: the bbolt file with opts (bolt is
// then that store), or a redisstore.Store over su's client, bounded by
// --store-timeout, with bolt nil. The policy file (--config) and
// --tenants=declared need the bbolt store for now, and are refused with a
// Redis one.
func openStore(ctx context.Context, su storeURL, cfg serveConfig, opts breakerstore.Options) (st stateStore, bolt *breakerstore.Store, err error) {
	if su.redis == nil {
		bolt, err := breakerstore.Open(opts)
		if err != nil {
			return nil, nil, err
		}
		return bolt, bolt, nil
	}
	switch {
	case cfg.Config != "":
		return nil, nil, fmt.Errorf("--config: not supported yet with a Redis --store (set policies and budgets with the admin API)")
	case cfg.Limits.Tenants == "declared":
		return nil, nil, fmt.Errorf("--tenants=declared: not supported yet with a Redis --store")
	case cfg.StoreTimeout <= 0:
		return nil, nil, fmt.Errorf("--store-timeout: must be > 0, got %s", cfg.StoreTimeout)
	case cfg.WaitReplicas < 0:
		return nil, nil, fmt.Errorf("--redis-wait-replicas: must be >= 0, got %d", cfg.WaitReplicas)
	}
	ropts := redisstore.Options{Client: su.redis, Timeout: cfg.StoreTimeout, Log: opts.Logger,
		FlushInterval: opts.FlushInterval, AuditRetention: opts.AuditRetention, AuditMaxRecords: opts.AuditMaxRecords,
		WaitReplicas: cfg.WaitReplicas, MaxBreakersPerTenant: opts.MaxBreakersPerTenant,
		MaxKeysPerTenant: opts.MaxKeysPerTenant, MaxRunCalls: opts.MaxRunCalls,
		// Outcomes per tenant per --flush-interval, as bbolt's group
		// commit; --sync=always sends each batch before its answer.
		BatchOutcomes: opts.Sync != breakerstore.SyncAlways}
	latency := newRoundTripHistogram()
	ropts.RoundTripObserver = latency
	// A replica started while Redis is down (or failing over) waits for
	// it, with backoff, instead of exiting; a Redis of another schema is
	// final.
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		rs, err := redisstore.Open(ctx, ropts)
		if err == nil {
			return redisState{rs, su.redis, latency}, nil, nil
		}
		if errors.Is(err, redisstore.ErrSchema) {
			_ = su.redis.Close()
			return nil, nil, fmt.Errorf("--store %s: %w", su.shown, err)
		}
		opts.Logger.Warn("Redis not ready; retrying", "store", su.shown, "in", backoff.String(), "err", err)
		select {
		case <-ctx.Done():
			_ = su.redis.Close()
			return nil, nil, fmt.Errorf("--store %s: %w", su.shown, err)
		case <-time.After(backoff):
		}
	}
}

// redisState closes the Redis client after the store; latency is the
// histogram of its round trips (policyd_store_round_trip_seconds).
type redisState struct {
	*redisstore.Store
	client  redis.UniversalClient
	latency prometheus.Histogram
}

// newRoundTripHistogram is policyd_store_round_trip_seconds, its buckets
// around --store-timeout's default of 50ms: a replica on a Redis of its
// own network answers in well under a millisecond, one whose calls near
// the timeout is about to decide in degraded mode.
func newRoundTripHistogram() prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "policyd_store_round_trip_seconds",
		Help:    "Round trips this replica made to the shared store, from the write of a command or pipeline to its reply (the feeds' blocking reads left out).",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
	})
}

// RoundTripLatency is the histogram of the store's round trips, for the
// metrics endpoint.
func (r redisState) RoundTripLatency() prometheus.Collector { return r.latency }

func (r redisState) Close() error {
	err := r.Store.Close()
	if cerr := r.client.Close(); err == nil {
		err = cerr
	}
	return err
}
