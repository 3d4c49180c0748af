package server

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// Metric names, all under the policyd_ namespace.
const (
	metricDecisions    = "policyd_decisions_total"
	metricAttempts     = "policyd_attempts_per_success"
	metricBreakers     = "policyd_breakers"
	metricBreakerState = "policyd_breaker_state"
	metricTransitions  = "policyd_breaker_transitions_total"
	metricWatchResets  = "policyd_breaker_watch_resets_total"
	metricBudgetTokens = "policyd_budget_tokens"
	metricRPCDuration  = "policyd_rpc_duration_seconds"
	metricLeases       = "policyd_leases_total"
	metricFallbacks    = "policyd_fallbacks_total"
	metricCeiling      = "policyd_flow_ceiling"
	metricDecreases    = "policyd_flow_ceiling_decreases_total"
)

// otherLabel replaces a target or tenant label past the cardinality cap.
const otherLabel = "other"

// Defaults of MetricsOptions.
const (
	DefaultMetricsMaxTargets = 200
	DefaultMetricsMaxTenants = 200
	// DefaultMetricsWatchBuffer is the breaker changes that may queue
	// between two scrapes before the transition count resubscribes.
	DefaultMetricsWatchBuffer = 8192
)

// MetricsOptions bound what Metrics keeps. Zero fields take the defaults.
type MetricsOptions struct {
	// MaxTargets is how many distinct targets get their own label (on
	// decisions, attempts, breaker states and transitions); later ones
	// share the label "other".
	MaxTargets int
	// MaxTenants is the same cap for tenant labels (budget tokens, breaker
	// states).
	MaxTenants int
	// WatchBuffer is how many breaker changes may queue between scrapes.
	WatchBuffer int
}

// Metrics are policyd's Prometheus metrics:
//
//	policyd_decisions_total{decision,stop_reason,disposition,target}
//	                                                            counter of NextDelay answers
//	policyd_attempts_per_success{target}                        histogram of the attempt number of each
//	                                                            reported success, buckets 1 to 10
//	policyd_breakers{state}                                     gauge: breakers in each state, read at scrape
//	policyd_breaker_state{tenant,target,state}                  gauge per breaker, read at scrape: 1 for its
//	                                                            current state, 0 for the other three (past
//	                                                            the label caps: how many breakers of
//	                                                            "other" are in each state); tenant is empty
//	                                                            for a breaker shared by every tenant
//	policyd_breaker_transitions_total{to,target}                counter of breaker state changes by new state
//	policyd_breaker_watch_resets_total                          counter of times the transition watch fell
//	                                                            behind and resubscribed (changes may be missed)
//	policyd_budget_tokens{tenant}                               gauge: tokens left in a tenant's budget,
//	                                                            updated on decisions that spend one
//	policyd_fallbacks_total{from,to}                            counter of attempts moved to another target of
//	                                                            the call's chain (after_attempts, or an open
//	                                                            breaker or full ceiling with on_circuit_open)
//	policyd_flow_ceiling{tenant,target}                         gauge per breaker whose policy has a
//	                                                            concurrency ceiling, read at scrape: the
//	                                                            ceiling in force (max_in_flight, or the
//	                                                            adaptive ceiling's current value); past the
//	                                                            label caps, the sum over "other"
//	policyd_flow_ceiling_decreases_total{target}                counter of the adaptive ceilings' decreases,
//	                                                            read at scrape from the engine (so every
//	                                                            replica reports the fleet's count)
//	policyd_rpc_duration_seconds{service,method,code}           histogram of RPC latency (streams: duration)
//	grpc_server_started_total, grpc_server_handled_total,
//	grpc_server_msg_received_total, grpc_server_msg_sent_total,
//	grpc_server_handling_seconds{grpc_type,grpc_service,grpc_method[,grpc_code]}
//	                                                            the standard gRPC server series of
//	                                                            go-grpc-middleware's Prometheus provider, so
//	                                                            stock gRPC dashboards work
//
// The RPC series are recorded by the outermost interceptors server.New
// installs, so calls refused by load shedding or authentication count too.
//
// Target and tenant labels are capped (MetricsOptions); past the cap they
// read "other". A nil *Metrics records nothing, so handlers call it
// unconditionally. Metrics is safe for concurrent use.
type Metrics struct {
	decisions    *prometheus.CounterVec
	attempts     *prometheus.HistogramVec
	budgetTokens *prometheus.GaugeVec
	rpcDuration  *prometheus.HistogramVec
	leases       *prometheus.CounterVec
	fallbacks    *prometheus.CounterVec
	grpc         *grpcprom.ServerMetrics
	breakers     *breakerCollector
	targets      *labelCap
	tenants      *labelCap
}

// NewMetrics creates policyd's metrics and registers them on reg. The
// breaker gauges stay empty until the metrics are given to server.New (through
// Config.Metrics), which connects them to the store. It fails when reg
// already holds metrics of the same names.
func NewMetrics(reg prometheus.Registerer, opts MetricsOptions) (*Metrics, error) {
	if opts.MaxTargets <= 0 {
		opts.MaxTargets = DefaultMetricsMaxTargets
	}
	if opts.MaxTenants <= 0 {
		opts.MaxTenants = DefaultMetricsMaxTenants
	}
	if opts.WatchBuffer <= 0 {
		opts.WatchBuffer = DefaultMetricsWatchBuffer
	}
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricDecisions,
			Help: "NextDelay answers by decision (RETRY or STOP), stop reason, disposition and target.",
		}, []string{"decision", "stop_reason", "disposition", "target"}),
		attempts: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricAttempts,
			Help:    "Attempt number of each reported success, counting the first attempt as 1, by target.",
			Buckets: prometheus.LinearBuckets(1, 1, 10),
		}, []string{"target"}),
		budgetTokens: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: metricBudgetTokens,
			Help: "Retry tokens left in a tenant's budget, as of its last spending decision.",
		}, []string{"tenant"}),
		rpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricRPCDuration,
			Help:    "Time to answer an RPC (for streams: how long the stream lasted), by service, method and status code.",
			Buckets: rpcBuckets,
		}, []string{"service", "method", "code"}),
		leases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricLeases,
			Help: "Concurrency leases by target and result: granted, full (the concurrency ceiling refused), rate_limited (the rate ceiling did), refused (the breaker did), stray_release (a release of a lease not held, ignored).",
		}, []string{"target", "result"}),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricFallbacks,
			Help: "Attempts moved from one target of a call's escalation chain to another, by the target they left and the one they went to.",
		}, []string{"from", "to"}),
		grpc: grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
			grpcprom.WithHistogramBuckets(rpcBuckets))),
		targets: newLabelCap(opts.MaxTargets),
		tenants: newLabelCap(opts.MaxTenants),
	}
	m.breakers = newBreakerCollector(opts.WatchBuffer, m.tenants, m.targets)
	for _, c := range []prometheus.Collector{m.decisions, m.attempts, m.budgetTokens, m.rpcDuration, m.leases, m.fallbacks, m.grpc, m.breakers} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// attach connects the breaker gauges to the store and starts counting its
// breaker transitions; the first call wins.
func (m *Metrics) attach(b Breakers, f flowStore) {
	if m == nil {
		return
	}
	c := m.breakers
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.store.CompareAndSwap(nil, &b) {
		c.flow = f
		c.events, c.cancel = b.Subscribe("", c.buffer)
	}
}

// decision counts a NextDelay answer about target. It does not allocate
// once the series exists.
func (m *Metrics) decision(target string, retry bool, stop policy.StopReason, disp policy.Disposition) {
	if m == nil {
		return
	}
	verdict := policy.VerdictStop
	if retry {
		verdict = policy.VerdictRetry
	}
	m.decisions.WithLabelValues(verdict.String(), stop.String(), disp.String(), m.targets.label(target)).Inc()
}

// successes observes the attempt numbers of the successful outcomes among
// outs, by target. A batch names few targets, so each target's histogram is
// looked up once, not once an outcome.
func (m *Metrics) successes(items []outcomeItem) {
	if m == nil {
		return
	}
	var byTarget map[string]prometheus.Observer
	for i := range items {
		it := &items[i]
		if !it.success {
			continue
		}
		target := it.target // the attempt's: the call's, or a fallback
		obs, seen := byTarget[target]
		if !seen {
			if byTarget == nil {
				byTarget = make(map[string]prometheus.Observer, 8)
			}
			obs = m.attempts.WithLabelValues(m.targets.label(target))
			byTarget[target] = obs
		}
		obs.Observe(float64(it.attempt))
	}
}

// lease counts an admission under a concurrency ceiling.
func (m *Metrics) lease(target string, granted bool, reason string) {
	if m == nil {
		return
	}
	result := "refused"
	switch {
	case granted:
		result = "granted"
	case reason == fleet.ReasonFull:
		result = "full"
	case reason == fleet.ReasonRate:
		result = "rate_limited"
	}
	m.leases.WithLabelValues(m.targets.label(target), result).Inc()
}

// fallback counts an attempt moved from target from to target to.
func (m *Metrics) fallback(from, to string) {
	if m == nil {
		return
	}
	m.fallbacks.WithLabelValues(m.targets.label(from), m.targets.label(to)).Inc()
}

// strayRelease counts a release of a lease not held.
func (m *Metrics) strayRelease(target string) {
	if m == nil {
		return
	}
	m.leases.WithLabelValues(m.targets.label(target), "stray_release").Inc()
}

// tokens sets the tokens left in tenant's budget.
func (m *Metrics) tokens(tenant string, tokens float64) {
	if m == nil {
		return
	}
	m.budgetTokens.WithLabelValues(m.tenants.label(tenant)).Set(tokens)
}

// observeRPC records the latency of the RPC fullMethod ("/service/method").
func (m *Metrics) observeRPC(fullMethod string, start time.Time, err error) {
	service, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok {
		service, method = "unknown", fullMethod
	}
	m.rpcDuration.WithLabelValues(service, method, status.Code(err).String()).Observe(time.Since(start).Seconds())
}

// rpcBuckets are the buckets of the RPC latency histograms, in seconds:
// policyd answers in tens of microseconds to milliseconds, below the gRPC
// provider's default buckets.
var rpcBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// unary times unary RPCs and counts them in the grpc_server_* series.
func (m *Metrics) unary() grpc.UnaryServerInterceptor {
	std := m.grpc.UnaryServerInterceptor()
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		start := time.Now()
		resp, err := std(ctx, req, info, handler)
		m.observeRPC(info.FullMethod, start, err)
		return resp, err
	}
}

// stream times streaming RPCs from start to end and counts them in the
// grpc_server_* series.
func (m *Metrics) stream() grpc.StreamServerInterceptor {
	std := m.grpc.StreamServerInterceptor()
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		start := time.Now()
		err := std(srv, ss, info, handler)
		m.observeRPC(info.FullMethod, start, err)
		return err
	}
}

// InitializeMethods gives the grpc_server_* series of every method s
// serves a zero, so dashboards and rates see them before the first call.
// server.New calls it once; a nil *Metrics does nothing.
func (m *Metrics) InitializeMethods(s reflection.ServiceInfoProvider) {
	if m == nil {
		return
	}
	m.grpc.InitializeMetrics(s)
}

// breakerStates are the states a breaker series is reported for, in order.
var breakerStates = [...]policy.BreakerState{policy.BreakerClosed, policy.BreakerOpen, policy.BreakerHalfOpen, policy.BreakerDisabled}

// labelCap hands out at most max distinct label values, then otherLabel.
type labelCap struct {
	mu   sync.RWMutex
	seen map[string]struct{}
	max  int
}

func newLabelCap(max int) *labelCap { return &labelCap{seen: map[string]struct{}{}, max: max} }

// label returns v while v is one of the first max values seen, else
// otherLabel.
func (c *labelCap) label(v string) string {
	c.mu.RLock()
	_, ok := c.seen[v]
	full := len(c.seen) >= c.max
	c.mu.RUnlock()
	switch {
	case ok:
		return v
	case full:
		return otherLabel
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.seen[v]; !ok {
		if len(c.seen) >= c.max {
			return otherLabel
		}
		c.seen[strings.Clone(v)] = struct{}{}
	}
	return v
}

// breakerCollector reports breaker states and counts transitions. At each
// scrape it reads the states from the store and drains a subscription to the
// store's breaker changes: no goroutine runs between scrapes. A subscription
// that overflowed between scrapes is replaced, and the fresh snapshot counts
// the state changes it reveals.
type breakerCollector struct {
	store            atomic.Pointer[Breakers]
	buffer           int
	tenants, targets *labelCap

	statesDesc  *prometheus.Desc
	stateDesc   *prometheus.Desc
	transitions *prometheus.CounterVec
	resets      prometheus.Counter

	ceilingDesc   *prometheus.Desc
	decreasesDesc *prometheus.Desc

	mu     sync.Mutex // guards the fields below and serialises collection
	flow   flowStore  // the policies and pools of the ceilings; set with store
	events <-chan policy.BreakerEvent
	cancel func()
	last   map[policy.BreakerKey]policy.BreakerState
}

func newBreakerCollector(buffer int, tenants, targets *labelCap) *breakerCollector {
	return &breakerCollector{
		buffer:  buffer,
		tenants: tenants,
		targets: targets,
		stateDesc: prometheus.NewDesc(metricBreakerState,
			"1 for the state a breaker is in, 0 for the others; past the label caps, the breakers of \"other\" in each state.",
			[]string{"tenant", "target", "state"}, nil),
		statesDesc: prometheus.NewDesc(metricBreakers,
			"Breakers in each state (CLOSED, OPEN, HALF_OPEN, DISABLED).", []string{"state"}, nil),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricTransitions,
			Help: "Breaker state changes, by the state entered and the target.",
		}, []string{"to", "target"}),
		resets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricWatchResets,
			Help: "Times the breaker transition watch fell behind and took a fresh snapshot; changes in between may be uncounted.",
		}),
		ceilingDesc: prometheus.NewDesc(metricCeiling,
			"The concurrency ceiling in force under a breaker's key: the policy's max_in_flight, or the adaptive ceiling's current value; past the label caps, the sum over \"other\".",
			[]string{"tenant", "target"}, nil),
		decreasesDesc: prometheus.NewDesc(metricDecreases,
			"Decreases of the adaptive concurrency ceilings (on 429s and pushback-bearing 503s), by target, as the engine counts them.",
			[]string{"target"}, nil),
		last: map[policy.BreakerKey]policy.BreakerState{},
	}
}

// Describe implements prometheus.Collector.
func (c *breakerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.statesDesc
	ch <- c.stateDesc
	ch <- c.ceilingDesc
	ch <- c.decreasesDesc
	c.transitions.Describe(ch)
	c.resets.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *breakerCollector) Collect(ch chan<- prometheus.Metric) {
	if p := c.store.Load(); p != nil {
		list, _ := (*p).Breakers("", policy.BreakerStateUnspecified, policy.BreakerKey{}, 0)
		counts := map[policy.BreakerState]int{}
		perKey := make(map[policy.BreakerKey]*[len(breakerStates)]int, len(list))
		for _, b := range list {
			counts[b.State]++
			k := policy.BreakerKey{Target: c.targets.label(b.Key.Target)}
			if b.Key.Tenant != "" {
				k.Tenant = c.tenants.label(b.Key.Tenant)
			}
			row := perKey[k]
			if row == nil {
				row = new([len(breakerStates)]int)
				perKey[k] = row
			}
			for i, st := range breakerStates {
				if b.State == st {
					row[i]++
				}
			}
		}
		c.mu.Lock()
		flow := c.flow
		c.drain(*p)
		if len(c.last) > 2*len(list)+1024 {
			// Forget breakers the store has dropped since.
			keep := make(map[policy.BreakerKey]policy.BreakerState, len(list))
			for _, b := range list {
				if st, ok := c.last[b.Key]; ok {
					keep[b.Key] = st
				}
			}
			c.last = keep
		}
		c.mu.Unlock()
		for _, st := range breakerStates {
			ch <- prometheus.MustNewConstMetric(c.statesDesc, prometheus.GaugeValue, float64(counts[st]), st.String())
		}
		for k, row := range perKey {
			for i, st := range breakerStates {
				ch <- prometheus.MustNewConstMetric(c.stateDesc, prometheus.GaugeValue, float64(row[i]), k.Tenant, k.Target, st.String())
			}
		}
		if flow != nil {
			c.collectCeilings(ch, flow, list)
		}
	}
	c.transitions.Collect(ch)
	c.resets.Collect(ch)
}

// collectCeilings reports the ceiling in force under each breaker of list
// whose policy has a concurrency ceiling, and the adaptive ceilings'
// decreases by target. It resolves a policy and reads a pool per such
// breaker, at scrape and never on a decision's path.
func (c *breakerCollector) collectCeilings(ch chan<- prometheus.Metric, flow flowStore, list []policy.BreakerSnapshot) {
	ceilings := map[policy.BreakerKey]int{}
	decreases := map[string]uint64{}
	for _, b := range list {
		p, _ := flow.Resolve(b.Key.Tenant, b.Key.Target)
		if p.Flow.MaxInFlight == 0 {
			continue
		}
		pool, err := flow.Pool(b.Key)
		if err != nil {
			continue
		}
		n, _ := ceilingOf(&p, pool)
		target := c.targets.label(b.Key.Target)
		k := policy.BreakerKey{Target: target}
		if b.Key.Tenant != "" {
			k.Tenant = c.tenants.label(b.Key.Tenant)
		}
		ceilings[k] += n
		if p.Flow.Adaptive.Enabled {
			decreases[target] += pool.Decreases
		}
	}
	for k, n := range ceilings {
		ch <- prometheus.MustNewConstMetric(c.ceilingDesc, prometheus.GaugeValue, float64(n), k.Tenant, k.Target)
	}
	for target, n := range decreases {
		ch <- prometheus.MustNewConstMetric(c.decreasesDesc, prometheus.CounterValue, float64(n), target)
	}
}

// drain counts the transitions queued since the last scrape; c.mu must be
// held.
func (c *breakerCollector) drain(store Breakers) {
	retried := false
	for c.events != nil {
		select {
		case ev, ok := <-c.events:
			if !ok {
				// Fell behind (or the store closed): take a fresh snapshot
				// once; its differences from c.last count as transitions.
				c.cancel()
				c.events = nil
				if retried {
					return
				}
				retried = true
				c.resets.Inc()
				c.events, c.cancel = store.Subscribe("", c.buffer)
				continue
			}
			if ev.SnapshotDone {
				continue
			}
			s := ev.Snapshot
			prev, seen := c.last[s.Key]
			if (seen && prev != s.State) || (!seen && !ev.Initial && s.State != policy.BreakerClosed) {
				// A breaker first seen after the snapshot was born CLOSED.
				c.transitions.WithLabelValues(s.State.String(), c.targets.label(s.Key.Target)).Inc()
			}
			c.last[s.Key] = s.State
		default:
			return
		}
	}
}
