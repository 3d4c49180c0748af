package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

	"github.com/policyd/policyd/breakerstore"
	"github.com/policyd/policyd/server"
)

// limitsConfig is what the limit flags of `policyd serve` say. Every cap
// has a default, documented in the flag's help and the README.
type limitsConfig struct {
	MaxInFlight          int
	ShedRetryAfter       time.Duration
	MaxMessageBytes      int
	MaxConcurrentStreams uint32
	KeepaliveMinTime     time.Duration
	KeepaliveTime        time.Duration
	MaxBreakersPerTenant int
	MaxTenants           int
	MaxAutoTenants       int
	Tenants              string
	MaxRuns              int
	MaxAttemptRecords    int
	RunRetention         time.Duration
	StreamWorkers        int
	MaxClockSkew         time.Duration
	MaxHeaderListBytes   uint32
}

func (c *limitsConfig) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.IntVar(&c.MaxInFlight, "max-in-flight", 4096, "unary calls handled at once; beyond it calls are shed with RESOURCE_EXHAUSTED and a RetryInfo")
	f.DurationVar(&c.ShedRetryAfter, "shed-retry-after", 100*time.Millisecond, "the RetryInfo delay a shed call is given")
	f.IntVar(&c.MaxMessageBytes, "max-message-bytes", 1<<20, "largest request accepted, in bytes")
	f.Uint32Var(&c.MaxConcurrentStreams, "max-concurrent-streams", 1024, "concurrent calls per client connection")
	f.DurationVar(&c.KeepaliveMinTime, "keepalive-min-time", 10*time.Second, "clients pinging more often than this are disconnected")
	f.DurationVar(&c.KeepaliveTime, "keepalive-time", time.Minute, "ping an idle connection after this long, to find dead watchers")
	f.IntVar(&c.MaxBreakersPerTenant, "max-breakers-per-tenant", 10000, "breakers one tenant may have; beyond it calls get RESOURCE_EXHAUSTED")
	f.IntVar(&c.MaxTenants, "max-tenants", 100000, "tenants with state; a new tenant beyond it gets RESOURCE_EXHAUSTED (explicit budgets are always admitted)")
	f.IntVar(&c.MaxAutoTenants, "max-auto-tenants", breakerstore.DefaultMaxAutoTenants, "undeclared tenants that worker calls may give state (tenants without a budget from the admin API or --config); a new one beyond it gets RESOURCE_EXHAUSTED, declared tenants are always admitted")
	f.StringVar(&c.Tenants, "tenants", "auto", "which tenants worker calls may name: auto (any, undeclared ones capped by --max-auto-tenants) or declared (only tenants with a budget; others get PERMISSION_DENIED)")
	f.IntVar(&c.MaxRuns, "max-runs", 10000, "runs kept; OpenRun beyond it gets RESOURCE_EXHAUSTED")
	f.IntVar(&c.MaxAttemptRecords, "max-attempt-records", breakerstore.DefaultMaxAttemptRecords, "calls whose last decided attempt is remembered (so an attempt is never rewound); beyond it the oldest record is forgotten")
	f.IntVar(&c.StreamWorkers, "stream-workers", server.DefaultStreamWorkers, "goroutines kept to serve calls, reused so a handler's grown stack is not grown again on every call; a call finding them all busy gets its own goroutine (0: a goroutine per call)")
	f.DurationVar(&c.RunRetention, "run-retention", 30*24*time.Hour, "how long a run and its ledger are kept after its cut-off")
	f.DurationVar(&c.MaxClockSkew, "max-clock-skew", server.DefaultMaxClockSkew, "how far after the daemon's clock a call's origin_time may lie; beyond it NextDelay answers INVALID_ARGUMENT")
	f.Uint32Var(&c.MaxHeaderListBytes, "max-header-list-bytes", 16<<10, "largest header list (metadata, including authorization) a call may send, in bytes; a larger one is refused by the transport")
}

func (c *limitsConfig) validate() error {
	switch {
	case c.MaxInFlight < 1:
		return fmt.Errorf("--max-in-flight: must be >= 1, got %d", c.MaxInFlight)
	case c.ShedRetryAfter <= 0:
		return fmt.Errorf("--shed-retry-after: must be > 0, got %s", c.ShedRetryAfter)
	case c.MaxMessageBytes < 1024:
		return fmt.Errorf("--max-message-bytes: must be >= 1024, got %d", c.MaxMessageBytes)
	case c.MaxConcurrentStreams < 1:
		return fmt.Errorf("--max-concurrent-streams: must be >= 1, got %d", c.MaxConcurrentStreams)
	case c.KeepaliveMinTime <= 0 || c.KeepaliveTime <= 0:
		return fmt.Errorf("--keepalive-min-time and --keepalive-time: must be > 0")
	case c.MaxBreakersPerTenant < 1:
		return fmt.Errorf("--max-breakers-per-tenant: must be >= 1, got %d", c.MaxBreakersPerTenant)
	case c.MaxTenants < 1:
		return fmt.Errorf("--max-tenants: must be >= 1, got %d", c.MaxTenants)
	case c.MaxAutoTenants < 1:
		return fmt.Errorf("--max-auto-tenants: must be >= 1, got %d", c.MaxAutoTenants)
	case c.Tenants != "auto" && c.Tenants != "declared":
		return fmt.Errorf("--tenants: must be auto or declared, got %q", c.Tenants)
	case c.MaxRuns < 1:
		return fmt.Errorf("--max-runs: must be >= 1, got %d", c.MaxRuns)
	case c.MaxAttemptRecords < 1:
		return fmt.Errorf("--max-attempt-records: must be >= 1, got %d", c.MaxAttemptRecords)
	case c.StreamWorkers < 0 || c.StreamWorkers > 4096:
		return fmt.Errorf("--stream-workers: must be 0 to 4096, got %d", c.StreamWorkers)
	case c.RunRetention <= 0:
		return fmt.Errorf("--run-retention: must be > 0, got %s", c.RunRetention)
	case c.MaxClockSkew <= 0:
		return fmt.Errorf("--max-clock-skew: must be > 0, got %s", c.MaxClockSkew)
	case c.MaxHeaderListBytes < 1024:
		return fmt.Errorf("--max-header-list-bytes: must be >= 1024, got %d", c.MaxHeaderListBytes)
	}
	return nil
}

// serverOptions returns the gRPC options the caps ask for.
func (c *limitsConfig) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(c.MaxMessageBytes),
		grpc.MaxConcurrentStreams(c.MaxConcurrentStreams),
		grpc.MaxHeaderListSize(c.MaxHeaderListBytes),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: c.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: c.KeepaliveTime, Timeout: 20 * time.Second}),
	}
}

func (c *limitsConfig) shedder() *server.Shedder {
	return server.NewShedder(c.MaxInFlight, c.ShedRetryAfter)
}

// declaredTenants is server.Config.DeclaredTenants for --tenants: the
// store's declarations with --tenants=declared, else nil (any tenant).
func (c *limitsConfig) declaredTenants(store *breakerstore.Store) func(string) bool {
	if c.Tenants != "declared" {
		return nil
	}
	return store.Declared
}

// streamWorkers is --stream-workers as server.Config spells it.
func (c *limitsConfig) streamWorkers() int {
	if c.StreamWorkers == 0 {
		return -1 // a goroutine per call
	}
	return c.StreamWorkers
}
