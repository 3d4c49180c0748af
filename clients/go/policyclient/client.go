package policyclient

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// Config configures a Client. Tenant is required; zero durations and sizes
// take the defaults named.
type Config struct {
	// Tenant is the tenant every call of this client belongs to.
	Tenant string
	// Token is the tenant's worker token, when policyd requires one. Dial
	// sends it with every RPC; with New, dial with
	// grpc.WithPerRPCCredentials(BearerToken(token)) instead.
	Token string
	// TLS, when set, makes Dial use TLS (mutual TLS when it carries a
	// client certificate) instead of a plaintext connection.
	TLS *tls.Config
	// DecisionTimeout bounds every decision RPC; past it the client decides
	// locally. Default 250ms. An Admit about a target with a fleet-wide
	// ceiling waits up to max(DecisionTimeout, RetryUnreachableAfter), and
	// is never decided locally (see Do).
	DecisionTimeout time.Duration
	// AttemptTimeout is the per-attempt timeout applied to fn's context
	// until policyd says otherwise. Default 10s (policyd's default).
	AttemptTimeout time.Duration
	// RetryUnreachableAfter is how long the client keeps deciding locally
	// after policyd failed to answer, before it asks policyd again.
	// Default 1s. It also caps the wait between two Admits about a target
	// with a fleet-wide ceiling while policyd is silent.
	RetryUnreachableAfter time.Duration
	// LocalBudget and LocalBudgetPerSecond size the token bucket for
	// retries decided locally. Defaults 20 and 2 per second.
	LocalBudget          float64
	LocalBudgetPerSecond float64
	// BatchSize, FlushInterval and QueueSize shape outcome reporting:
	// outcomes are sent in batches of up to BatchSize, at least every
	// FlushInterval, from a queue of QueueSize (an outcome that finds the
	// queue full is dropped and counted in Stats). Defaults 256, 100ms,
	// 65536.
	BatchSize     int
	FlushInterval time.Duration
	QueueSize     int
	// NoWatch turns off the WatchBreakers cache: every attempt then asks
	// Admit.
	NoWatch bool
	// RequireClaim makes a call that uses the idempotency ledger make no
	// attempt without a claim: when policyd (or its store) cannot answer
	// one, the call ends a dead letter (NOT_IDEMPOTENT,
	// idempotency:unavailable) instead of going on without the ledger. It
	// trades the fallback's availability for exactly once across workers
	// that may submit one document twice. Default false.
	RequireClaim bool
	// Sleep waits d or until ctx is done. Default: a timer. Tests inject
	// a fake so no test sleeps.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now tells the time. Default time.Now.
	Now func() time.Time
	// wallClock is set when Now is time.Now, so its readings can stand in
	// for the wall clock's.
	wallClock bool
	Logger    *slog.Logger
	// OnEvent, if set, is called with each Event (see EventKind) on the
	// goroutine where it happens; it must return quickly and not call the
	// Client.
	OnEvent func(Event)
}

func (c Config) withDefaults() (Config, error) {
	if c.Tenant == "" {
		return c, errors.New("policyclient: Config.Tenant is required")
	}
	if c.DecisionTimeout < 0 || c.AttemptTimeout < 0 || c.FlushInterval < 0 || c.RetryUnreachableAfter < 0 {
		return c, errors.New("policyclient: Config durations must not be negative")
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.DecisionTimeout, 250*time.Millisecond)
	def(&c.AttemptTimeout, 10*time.Second)
	def(&c.RetryUnreachableAfter, time.Second)
	def(&c.FlushInterval, 100*time.Millisecond)
	if c.LocalBudget <= 0 {
		c.LocalBudget = 20
	}
	if c.LocalBudgetPerSecond <= 0 {
		c.LocalBudgetPerSecond = 2
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 256
	}
	if c.BatchSize > 1000 {
		c.BatchSize = 1000 // policyd's cap per ReportOutcome
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 65536
	}
	if c.Sleep == nil {
		c.Sleep = Sleep
	}
	if c.Now == nil {
		c.Now, c.wallClock = time.Now, true
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// Sleep waits d or until ctx is done, returning ctx's error then: the
// default Config.Sleep. A Config.Sleep that observes waits can call it to
// do the waiting.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Client runs retry loops with policyd's decisions. It is safe for
// concurrent use by many goroutines; Close it to flush outcomes.
type Client struct {
	cfg      Config
	conn     *grpc.ClientConn // owned when the client dialled it
	workers  pb.RetryPolicyServiceClient
	local    *localPolicy
	breakers *breakerCache
	flow     *flowCache
	chains   chainCache
	runs     runCutoffs
	out      *outcomes

	// downUntil (unix nanos) is when to try policyd again after it failed
	// to answer; until then decisions are local.
	downUntil atomic.Int64
	stats     counters

	stop    context.CancelFunc
	wg      sync.WaitGroup
	closing sync.Once
}

// Dial connects to policyd at addr and returns a Client that owns the
// connection: over TLS when cfg.TLS is set, else plaintext (policyd's
// loopback default), sending cfg.Token when set, with ServiceConfig (so
// "dns:///name:port" spreads calls over every replica the name resolves to;
// DialReplicas takes a list). opts are added last.
func Dial(addr string, cfg Config, opts ...grpc.DialOption) (*Client, error) {
	transport := insecure.NewCredentials()
	if cfg.TLS != nil {
		transport = credentials.NewTLS(cfg.TLS)
	}
	base := []grpc.DialOption{grpc.WithTransportCredentials(transport), grpc.WithDefaultServiceConfig(ServiceConfig)}
	if cfg.Token != "" {
		base = append(base, grpc.WithPerRPCCredentials(BearerToken(cfg.Token)))
	}
	opts = append(base, opts...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	c, err := New(conn, cfg)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.conn = conn
	return c, nil
}

// New returns a Client over an existing connection, which the caller keeps
// owning.
func New(conn grpc.ClientConnInterface, cfg Config) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	c := &Client{
		cfg:      cfg,
		workers:  pb.NewRetryPolicyServiceClient(conn),
		local:    newLocalPolicy(cfg),
		breakers: newBreakerCache(cfg.Tenant),
		flow:     newFlowCache(),
		stop:     stop,
	}
	c.out = newOutcomes(c, cfg)
	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.out.run(ctx) }()
	if !cfg.NoWatch {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.breakers.watch(ctx, c, Sleep, rand.Float64) }()
	}
	return c, nil
}

// Close stops watching breakers and flushes every queued outcome (giving
// policyd until ctx's deadline, or 10s when ctx has none), then closes the
// connection if the client dialled it. A report batch already in flight is
// let finish first, within its own bound (4 × DecisionTimeout), so it is
// never sent twice. Calls running concurrently with Close may lose their
// reports.
func (c *Client) Close(ctx context.Context) error {
	var err error
	c.closing.Do(func() {
		c.stop()
		c.wg.Wait()
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
		}
		err = c.out.drain(ctx)
		if c.conn != nil {
			if cerr := c.conn.Close(); err == nil {
				err = cerr
			}
		}
	})
	return err
}

// Stats are the client's counters.
type Stats struct {
	Calls             uint64 // Do calls
	Attempts          uint64 // calls of fn
	AdmitRPCs         uint64 // Admit RPCs sent (the CLOSED fast path sends none)
	FastFails         uint64 // attempts refused locally from the breaker cache
	LocalDecisions    uint64 // decisions made locally because policyd did not answer in time
	OutcomesSent      uint64
	OutcomesDropped   uint64 // queue full, or policyd unreachable at Close
	ReportBatchesSent uint64
	Deduplicated      uint64 // calls the idempotency ledger answered with an earlier success, without fn
}

type counters struct {
	calls, attempts, admits, fastFails, local atomic.Uint64
	deduplicated                              atomic.Uint64
	sent, dropped, batches                    atomic.Uint64
}

// Stats returns a snapshot of the client's counters.
func (c *Client) Stats() Stats {
	s := &c.stats
	return Stats{
		Calls: s.calls.Load(), Attempts: s.attempts.Load(), AdmitRPCs: s.admits.Load(),
		FastFails: s.fastFails.Load(), LocalDecisions: s.local.Load(), Deduplicated: s.deduplicated.Load(),
		OutcomesSent: s.sent.Load(), OutcomesDropped: s.dropped.Load(), ReportBatchesSent: s.batches.Load(),
	}
}

// wall returns t, a reading of Config.Now, when Now is the wall clock, and
// the wall clock's time otherwise: deadlines of contexts run on it.
func (c *Client) wall(t time.Time) time.Time {
	if c.cfg.wallClock {
		return t
	}
	return time.Now()
}

// reachable says whether to ask policyd now.
func (c *Client) reachable() bool {
	return c.cfg.Now().UnixNano() >= c.downUntil.Load()
}

// unreachable records that policyd failed to answer in time.
func (c *Client) unreachable(err error) {
	c.downUntil.Store(c.cfg.Now().Add(c.cfg.RetryUnreachableAfter).UnixNano())
	c.cfg.Logger.Warn("policyd did not answer; deciding locally", "err", err, "for", c.cfg.RetryUnreachableAfter)
}
