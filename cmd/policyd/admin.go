package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// clientFlags are the flags every command that talks to a daemon shares.
type clientFlags struct {
	Addr          string
	JSON          bool
	Timeout       time.Duration
	TokenFile     string
	TLSCA         string
	TLSCert       string
	TLSKey        string
	TLSServerName string
}

func (c *clientFlags) register(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&c.Addr, "addr", "127.0.0.1:50051", "address of the running policyd")
	f.BoolVar(&c.JSON, "json", false, "print the answer as JSON")
	f.DurationVar(&c.Timeout, "timeout", 5*time.Second, "how long to wait for the answer")
	f.StringVar(&c.TokenFile, "token-file", "policyd.db.admin-token", "file holding the admin token (skipped when absent; $POLICYD_TOKEN wins)")
	f.StringVar(&c.TLSCA, "tls-ca", "", "connect with TLS, trusting this CA (PEM)")
	f.StringVar(&c.TLSCert, "tls-cert", "", "client certificate for mutual TLS (PEM)")
	f.StringVar(&c.TLSKey, "tls-key", "", "the private key of --tls-cert (PEM)")
	f.StringVar(&c.TLSServerName, "tls-server-name", "", "the server name to verify (default: the host of --addr)")
}

// dialOptions turns the flags into credentials: TLS when --tls-ca is set,
// and the admin token from $POLICYD_TOKEN or --token-file when there is one
// (a missing file is skipped).
func (c *clientFlags) dialOptions() ([]grpc.DialOption, error) {
	opts, _, err := c.credentials(false)
	return opts, err
}

// credentials is dialOptions for the admin commands. A --token-file given
// on the command line (tokenFileSet) must exist; the default one may be
// missing, and then noToken says where it was looked for, for an
// UNAUTHENTICATED answer to name.
func (c *clientFlags) credentials(tokenFileSet bool) (opts []grpc.DialOption, noToken string, err error) {
	transport := insecure.NewCredentials()
	if c.TLSCA != "" {
		cfg := &tls.Config{ServerName: c.TLSServerName, MinVersion: tls.VersionTLS12}
		pool, err := loadPool(c.TLSCA)
		if err != nil {
			return nil, "", fmt.Errorf("--tls-ca: %w", err)
		}
		cfg.RootCAs = pool
		if c.TLSCert != "" || c.TLSKey != "" {
			cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
			if err != nil {
				return nil, "", fmt.Errorf("--tls-cert/--tls-key: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		transport = credentials.NewTLS(cfg)
	}
	opts = []grpc.DialOption{grpc.WithTransportCredentials(transport)}
	tok := os.Getenv("POLICYD_TOKEN")
	if tok == "" && c.TokenFile != "" {
		t, err := readToken(c.TokenFile)
		switch {
		case err == nil:
			tok = t
		case tokenFileSet || !errors.Is(err, fs.ErrNotExist):
			return nil, "", fmt.Errorf("--token-file %s: %w", c.TokenFile, unwrapPath(err))
		default:
			where, _ := filepath.Abs(c.TokenFile)
			noToken = fmt.Sprintf("no admin token was sent: %s does not exist (the daemon writes <db>.admin-token next to its --db; "+
				"run the command in that directory, or pass --token-file or set $POLICYD_TOKEN)", where)
		}
	}
	if tok != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(policyclient.BearerToken(tok)))
	}
	return opts, noToken, nil
}

// unwrapPath drops the "open PATH:" a *fs.PathError adds, for messages
// that name the path already.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// callError is how a failed call reads on the command line: the status
// message and code the daemon sent, without grpc-go's "rpc error: code =
// ... desc =" framing, and with what the CLI knows that the daemon cannot
// (no token was found; the daemon is not there).
func (c *clientFlags) callError(err error, noToken string) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.Unauthenticated:
		if noToken != "" {
			return fmt.Errorf("%s (%s); %s", st.Message(), st.Code(), noToken)
		}
	case codes.Unavailable:
		return fmt.Errorf("policyd at %s is unavailable (%s): %s", c.Addr, st.Code(), st.Message())
	case codes.DeadlineExceeded:
		return fmt.Errorf("policyd at %s did not answer within --timeout %s (%s)", c.Addr, c.Timeout, st.Code())
	}
	return fmt.Errorf("%s (%s)", st.Message(), st.Code())
}

// call dials the daemon, runs fn with an AdminService client and prints
// the answer with text, or as JSON with --json.
func (c *clientFlags) call(cmd *cobra.Command, fn func(context.Context, pb.AdminServiceClient) (proto.Message, error), text func(io.Writer, proto.Message)) error {
	opts, noToken, err := c.credentials(cmd.Flags().Changed("token-file"))
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(c.Addr, opts...)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), c.Timeout)
	defer cancel()
	msg, err := fn(ctx, pb.NewAdminServiceClient(conn))
	if err != nil {
		return c.callError(err, noToken)
	}
	out := cmd.OutOrStdout()
	if c.JSON || text == nil {
		b, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true}.Marshal(msg)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(out, string(b))
		return err
	}
	text(out, msg)
	return nil
}

func adminCmds() []*cobra.Command {
	var c clientFlags
	cmds := []*cobra.Command{tenantCmd(&c), policyCmd(&c), breakersCmd(&c), breakerCmd(&c), runCmd(&c), auditCmd(&c), adviseCmd(&c)}
	for _, cmd := range cmds {
		c.register(cmd)
	}
	return cmds
}

// table prints rows under header, aligned; a cell that is not printable
// text is shown escaped (shown).
func table(w io.Writer, header string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		cells := make([]string, len(r))
		for i, c := range r {
			cells[i] = shown(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	tw.Flush()
}

// shown returns s as printed: unchanged when it is valid UTF-8 of printable
// characters only, else quoted in Go syntax (strconv.Quote), so that a
// control, bidi or invisible character in a name stored before policyd
// refused them can neither hide nor rearrange what the terminal shows.
func shown(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !strconv.IsPrint(r) }) < 0 {
		return s
	}
	return strconv.Quote(s)
}

func fnum(v float64) string { return fmt.Sprintf("%g", v) }

func tsText(t *timestamppb.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.AsTime().UTC().Format(time.RFC3339)
}

func trimEnum(s, prefix string) string { return strings.TrimPrefix(s, prefix) }

func tenantCmd(c *clientFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "tenant", Short: "Manage tenant retry budgets"}
	var b pb.TenantBudget
	set := &cobra.Command{
		Use:   "set TENANT",
		Short: "Create or replace a tenant's retry budget (zero values take the defaults)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b.Tenant = args[0]
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &b})
			}, func(w io.Writer, m proto.Message) {
				// The answer is the stored budget, not its bucket: print no
				// counters (policyd tenant get shows them).
				printBudget(w, m.(*pb.SetTenantBudgetResponse).GetBudget())
			})
		},
	}
	f := set.Flags()
	f.Float64Var(&b.Capacity, "capacity", 0, "most tokens the bucket holds (default 100)")
	f.Float64Var(&b.DepositRatio, "ratio", 0, "tokens one success deposits, 0 to 1 (default 0.2)")
	f.Float64Var(&b.MinRetriesPerSecond, "floor", 0, "retries per second always allowed (default 5)")
	f.Float64Var(&b.RetryCost, "retry-cost", 0, "tokens one retry costs (default 1)")
	f.Float64Var(&b.TimeoutCost, "timeout-cost", 0, "tokens a retry after a timeout costs (default 2)")
	f.BoolVar(&b.DryRun, "dry-run", false, "record refusals without refusing")

	get := &cobra.Command{
		Use: "get TENANT", Short: "Show a tenant's budget and counters", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: args[0]})
			}, func(w io.Writer, m proto.Message) {
				printBudgets(w, []*pb.TenantBudgetStatus{m.(*pb.GetTenantBudgetResponse).GetStatus()})
			})
		},
	}
	list := &cobra.Command{
		Use: "list", Short: "List tenant budgets", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.ListTenantBudgets(ctx, &pb.ListTenantBudgetsRequest{PageSize: 1000})
			}, func(w io.Writer, m proto.Message) { printBudgets(w, m.(*pb.ListTenantBudgetsResponse).GetBudgets()) })
		},
	}
	del := &cobra.Command{
		Use: "delete TENANT", Short: "Delete a tenant's budget (the default applies)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.DeleteTenantBudget(ctx, &pb.DeleteTenantBudgetRequest{Tenant: args[0]})
			}, func(w io.Writer, _ proto.Message) { fmt.Fprintf(w, "deleted budget of %s\n", args[0]) })
		},
	}
	cmd.AddCommand(set, get, list, del)
	return cmd
}

// printBudget prints a budget's configuration.
func printBudget(w io.Writer, b *pb.TenantBudget) {
	table(w, "TENANT\tCAPACITY\tRATIO\tFLOOR/S\tRETRY COST\tTIMEOUT COST\tDRY RUN", [][]string{{
		b.GetTenant(), fnum(b.GetCapacity()), fnum(b.GetDepositRatio()), fnum(b.GetMinRetriesPerSecond()),
		fnum(b.GetRetryCost()), fnum(b.GetTimeoutCost()), fmt.Sprint(b.GetDryRun())}})
}

func printBudgets(w io.Writer, list []*pb.TenantBudgetStatus) {
	rows := make([][]string, 0, len(list))
	for _, s := range list {
		b := s.GetBudget()
		rows = append(rows, []string{b.GetTenant(), fnum(b.GetCapacity()), fnum(b.GetDepositRatio()),
			fnum(b.GetMinRetriesPerSecond()), fnum(b.GetRetryCost()), fnum(b.GetTimeoutCost()),
			fmt.Sprint(b.GetDryRun()), fmt.Sprintf("%.2f", s.GetTokens()),
			fmt.Sprint(s.GetRetriesGranted()), fmt.Sprint(s.GetRetriesRefused())})
	}
	table(w, "TENANT\tCAPACITY\tRATIO\tFLOOR/S\tRETRY COST\tTIMEOUT COST\tDRY RUN\tTOKENS\tGRANTED\tREFUSED", rows)
}

func policyCmd(c *clientFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Manage retry policies per tenant and target"}
	var tenant, target, file string
	var effective bool
	scope := func(cmd *cobra.Command) {
		cmd.Flags().StringVar(&tenant, "tenant", "", "tenant scope (empty: every tenant)")
		cmd.Flags().StringVar(&target, "target", "", "target scope (empty: every target)")
	}
	var (
		maxAttempts, threshold, probes   uint32
		maxInFlight, burst               uint32
		maxRate                          float64
		countPushback                    bool
		fallbacks                        []string
		fallbackAfter                    uint32
		fallbackOnOpen                   bool
		adaptive                         bool
		minInFlight                      uint32
		adaptiveDec, adaptiveInc         float64
		adaptiveHold                     time.Duration
		base, maxDelay, attemptTO, dline time.Duration
		cooldown                         time.Duration
		factor                           float64
		jitter, mode, bscope             string
	)
	set := &cobra.Command{
		Use:   "set",
		Short: "Create or replace the policy of a scope (unset flags take the defaults)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p := &pb.Policy{}
			if file != "" {
				raw, err := os.ReadFile(file)
				if err != nil {
					return fmt.Errorf("--file: %w", err)
				}
				if err := protojson.Unmarshal(raw, p); err != nil {
					return fmt.Errorf("--file: %w", err)
				}
			}
			fl := cmd.Flags()
			if p.Backoff == nil {
				p.Backoff = &pb.BackoffSettings{}
			}
			if p.Breaker == nil {
				p.Breaker = &pb.BreakerSettings{}
			}
			if fl.Changed("max-attempts") {
				p.MaxAttempts = &maxAttempts
			}
			if fl.Changed("base") {
				p.Backoff.BaseDelay = durationpb.New(base)
			}
			if fl.Changed("cap") {
				p.Backoff.MaxDelay = durationpb.New(maxDelay)
			}
			if fl.Changed("factor") {
				p.Backoff.Factor = &factor
			}
			if fl.Changed("jitter") {
				v, ok := pb.Jitter_value["JITTER_"+strings.ToUpper(jitter)]
				if !ok {
					return fmt.Errorf("--jitter: must be none, full, equal or decorrelated, got %q", jitter)
				}
				p.Backoff.Jitter = pb.Jitter(v)
			}
			if fl.Changed("attempt-timeout") {
				p.AttemptTimeout = durationpb.New(attemptTO)
			}
			if fl.Changed("deadline") {
				p.CallDeadline = durationpb.New(dline)
			}
			if fl.Changed("breaker-threshold") {
				p.Breaker.ConsecutiveFailures = &threshold
			}
			if fl.Changed("cooldown") {
				p.Breaker.Cooldown = durationpb.New(cooldown)
			}
			if fl.Changed("probes") {
				p.Breaker.HalfOpenProbes = &probes
			}
			if fl.Changed("count-pushback") {
				p.Breaker.CountPushback = countPushback
			}
			if fl.Changed("max-in-flight") || fl.Changed("max-rate") || fl.Changed("burst") {
				if p.Flow == nil {
					p.Flow = &pb.FlowSettings{}
				}
				if fl.Changed("max-in-flight") {
					p.Flow.MaxInFlight = &maxInFlight
				}
				if fl.Changed("max-rate") {
					p.Flow.MaxRate = &maxRate
				}
				if fl.Changed("burst") {
					p.Flow.Burst = &burst
				}
			}
			if fl.Changed("fallback") || fl.Changed("fallback-after") || fl.Changed("fallback-on-circuit-open") {
				if p.Fallback == nil {
					p.Fallback = &pb.FallbackSettings{}
				}
				if fl.Changed("fallback") {
					p.Fallback.Targets = fallbacks
				}
				if fl.Changed("fallback-after") {
					p.Fallback.AfterAttempts = fallbackAfter
				}
				if fl.Changed("fallback-on-circuit-open") {
					p.Fallback.OnCircuitOpen = fallbackOnOpen
				}
			}
			if adaptive || fl.Changed("min-in-flight") || fl.Changed("adaptive-decrease") ||
				fl.Changed("adaptive-increase") || fl.Changed("adaptive-hold") {
				if p.Flow == nil {
					p.Flow = &pb.FlowSettings{}
				}
				if p.Flow.Adaptive == nil {
					p.Flow.Adaptive = &pb.AdaptiveCeiling{}
				}
				a := p.Flow.Adaptive
				if fl.Changed("min-in-flight") {
					a.MinInFlight = &minInFlight
				}
				if fl.Changed("adaptive-decrease") {
					a.Decrease = &adaptiveDec
				}
				if fl.Changed("adaptive-increase") {
					a.Increase = &adaptiveInc
				}
				if fl.Changed("adaptive-hold") {
					a.Hold = durationpb.New(adaptiveHold)
				}
			}
			if fl.Changed("breaker-mode") {
				v, ok := pb.BreakerMode_value["BREAKER_MODE_"+strings.ToUpper(strings.ReplaceAll(mode, "-", "_"))]
				if !ok {
					return fmt.Errorf("--breaker-mode: must be consecutive or failure-rate, got %q", mode)
				}
				p.Breaker.Mode = pb.BreakerMode(v)
			}
			if fl.Changed("breaker-scope") {
				v, ok := pb.BreakerScope_value["BREAKER_SCOPE_"+strings.ToUpper(strings.ReplaceAll(bscope, "-", "_"))]
				if !ok {
					return fmt.Errorf("--breaker-scope: must be tenant-target or target, got %q", bscope)
				}
				p.Breaker.Scope = pb.BreakerScope(v)
			}
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: tenant, Target: target, Policy: p})
			}, func(w io.Writer, m proto.Message) { printPolicy(w, m.(*pb.SetPolicyResponse).GetEntry()) })
		},
	}
	scope(set)
	f := set.Flags()
	f.StringVar(&file, "file", "", "read the policy from a JSON file (retrypolicy.v1.Policy); flags override it")
	f.Uint32Var(&maxAttempts, "max-attempts", 3, "attempts, counting the first")
	f.DurationVar(&base, "base", 500*time.Millisecond, "nominal delay before the first retry")
	f.DurationVar(&maxDelay, "cap", 30*time.Second, "largest nominal delay")
	f.Float64Var(&factor, "factor", 2, "delay multiplier per retry")
	f.StringVar(&jitter, "jitter", "full", "none, full, equal or decorrelated")
	f.DurationVar(&attemptTO, "attempt-timeout", 10*time.Second, "per-attempt timeout reserved before each retry")
	f.DurationVar(&dline, "deadline", 0, "default call deadline from the call's origin (0: none)")
	f.Uint32Var(&threshold, "breaker-threshold", 5, "consecutive transient failures that open the breaker")
	f.DurationVar(&cooldown, "cooldown", time.Minute, "how long an open breaker stays open")
	f.Uint32Var(&probes, "probes", 1, "HALF_OPEN probe permits handed out fleet-wide")
	f.StringVar(&mode, "breaker-mode", "consecutive", "consecutive or failure-rate")
	f.StringVar(&bscope, "breaker-scope", "tenant-target", "tenant-target or target")
	f.BoolVar(&countPushback, "count-pushback", false, "count failures that carried a pushback hint toward the breaker")
	f.Uint32Var(&maxInFlight, "max-in-flight", 0, "fleet-wide concurrency ceiling, in attempts (unset: none)")
	f.Float64Var(&maxRate, "max-rate", 0, "fleet-wide rate ceiling, in attempts per second (unset: none)")
	f.Uint32Var(&burst, "burst", 1, "attempts the rate ceiling admits at once")
	f.StringSliceVar(&fallbacks, "fallback", nil, "fallback targets a call escalates to, in order (comma-separated, at most 4)")
	f.Uint32Var(&fallbackAfter, "fallback-after", 0, "attempts each target of the chain gets before the next (0: only on an open circuit)")
	f.BoolVar(&fallbackOnOpen, "fallback-on-circuit-open", false, "send an attempt whose target's breaker is open to the next target of the chain")
	f.BoolVar(&adaptive, "adaptive", false, "let the concurrency ceiling learn from 429s and pushback-bearing 503s (AIMD, up to --max-in-flight); implied by the --adaptive-* and --min-in-flight flags")
	f.Uint32Var(&minInFlight, "min-in-flight", 1, "the adaptive ceiling's floor")
	f.Float64Var(&adaptiveDec, "adaptive-decrease", policy.DefaultAdaptiveDecrease, "factor the adaptive ceiling is multiplied by on a congestion signal, above 0 and below 1")
	f.Float64Var(&adaptiveInc, "adaptive-increase", policy.DefaultAdaptiveIncrease, "added to the adaptive ceiling per ceiling's worth of successes")
	f.DurationVar(&adaptiveHold, "adaptive-hold", 0, "least time between two decreases of the adaptive ceiling (besides a window of outcomes)")

	get := &cobra.Command{
		Use: "get", Short: "Show the policy of a scope (--effective: the one that applies)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.GetPolicy(ctx, &pb.GetPolicyRequest{Tenant: tenant, Target: target, Effective: effective})
			}, func(w io.Writer, m proto.Message) { printPolicy(w, m.(*pb.GetPolicyResponse).GetEntry()) })
		},
	}
	scope(get)
	get.Flags().BoolVar(&effective, "effective", false, "resolve precedence: the policy that applies to tenant and target")
	list := &cobra.Command{
		Use: "list", Short: "List stored policies", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.ListPolicies(ctx, &pb.ListPoliciesRequest{PageSize: 1000})
			}, func(w io.Writer, m proto.Message) {
				var rows [][]string
				for _, e := range m.(*pb.ListPoliciesResponse).GetEntries() {
					p := e.GetPolicy()
					rows = append(rows, []string{orAny(e.GetTenant()), orAny(e.GetTarget()), fmt.Sprint(p.GetMaxAttempts()),
						p.GetBackoff().GetBaseDelay().AsDuration().String(), p.GetBackoff().GetMaxDelay().AsDuration().String(),
						trimEnum(p.GetBackoff().GetJitter().String(), "JITTER_"),
						trimEnum(p.GetBreaker().GetMode().String(), "BREAKER_MODE_"), tsText(e.GetUpdateTime())})
				}
				table(w, "TENANT\tTARGET\tMAX ATTEMPTS\tBASE\tCAP\tJITTER\tBREAKER\tUPDATED", rows)
			})
		},
	}
	del := &cobra.Command{
		Use: "delete", Short: "Delete the policy of a scope", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.DeletePolicy(ctx, &pb.DeletePolicyRequest{Tenant: tenant, Target: target})
			}, func(w io.Writer, _ proto.Message) { fmt.Fprintln(w, "deleted") })
		},
	}
	scope(del)
	cmd.AddCommand(set, get, list, del)
	return cmd
}

// printPolicy prints a policy entry as FIELD VALUE rows: durations as
// durations, enums and gRPC codes by name.
func printPolicy(w io.Writer, e *pb.PolicyEntry) {
	p := e.GetPolicy()
	bo, pu, br := p.GetBackoff(), p.GetPushback(), p.GetBreaker()
	dur := func(d interface{ AsDuration() time.Duration }) string { return d.AsDuration().String() }
	scope := orAny(e.GetTenant()) + " / " + orAny(e.GetTarget())
	if e.GetTenant() == "" && e.GetTarget() == "" && e.GetUpdateTime() == nil {
		scope = "built-in default"
	}
	rows := [][]string{
		{"scope (tenant / target)", scope},
		{"updated", tsText(e.GetUpdateTime())},
		{"max attempts", fmt.Sprint(p.GetMaxAttempts())},
		{"attempt timeout", dur(p.GetAttemptTimeout())},
		{"call deadline", dur(p.GetCallDeadline())},
		{"backoff", fmt.Sprintf("base %s, factor %g, cap %s, jitter %s", dur(bo.GetBaseDelay()), bo.GetFactor(),
			dur(bo.GetMaxDelay()), trimEnum(bo.GetJitter().String(), "JITTER_"))},
		{"retry-after", fmt.Sprintf("%s, spread %g (at least %s), hints up to %s", trimEnum(pu.GetMode().String(), "RETRY_AFTER_MODE_"),
			pu.GetSpreadRatio(), dur(pu.GetMinSpread()), dur(pu.GetMaxHint()))},
		{"transient HTTP", joinCodes(p.GetTransientHttpStatuses(), func(c uint32) string { return fmt.Sprint(c) })},
		{"terminal HTTP", joinCodes(p.GetTerminalHttpStatuses(), func(c uint32) string { return fmt.Sprint(c) })},
		{"transient gRPC", joinCodes(p.GetTransientGrpcCodes(), grpcCodeName)},
		{"breaker", fmt.Sprintf("%s, scope %s", trimEnum(br.GetMode().String(), "BREAKER_MODE_"), trimEnum(br.GetScope().String(), "BREAKER_SCOPE_"))},
		{"breaker opens after", fmt.Sprintf("%d failures in a row, or a %g failure rate over %s (at least %d calls)",
			br.GetConsecutiveFailures(), br.GetFailureRate(), dur(br.GetWindow()), br.GetMinCalls())},
		{"breaker cool-down", fmt.Sprintf("%s, then %d probe permits (each within %s)", dur(br.GetCooldown()), br.GetHalfOpenProbes(), dur(br.GetProbeTimeout()))},
		{"flow ceilings", flowText(p.GetFlow())},
		{"fallback", fallbackText(p.GetFallback())},
	}
	table(w, "FIELD\tVALUE", rows)
}

// flowText describes a policy's fleet-wide ceilings, or "none".
func flowText(f *pb.FlowSettings) string {
	if f == nil {
		return "none"
	}
	var parts []string
	if f.MaxInFlight != nil {
		parts = append(parts, fmt.Sprintf("at most %d in flight (lease slack %s)", f.GetMaxInFlight(), f.GetLeaseSlack().AsDuration()))
	}
	if a := f.GetAdaptive(); a != nil {
		parts = append(parts, fmt.Sprintf("adaptive from %d to %d in flight: x%g on a 429 or a 503 with pushback (once per window, hold %s), +%g per window of successes",
			a.GetMinInFlight(), f.GetMaxInFlight(), a.GetDecrease(), a.GetHold().AsDuration(), a.GetIncrease()))
	}
	if f.MaxRate != nil {
		parts = append(parts, fmt.Sprintf("at most %g per second, burst %d", f.GetMaxRate(), max(f.GetBurst(), 1)))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}

// fallbackText describes a policy's escalation chain, or "none".
func fallbackText(f *pb.FallbackSettings) string {
	if len(f.GetTargets()) == 0 {
		return "none"
	}
	s := strings.Join(f.GetTargets(), ", ")
	if n := f.GetAfterAttempts(); n > 0 {
		s += fmt.Sprintf(", after %d attempts per target", n)
	}
	if f.GetOnCircuitOpen() {
		s += ", on an open circuit"
	}
	return s
}

// joinCodes lists codes by name, or "-" for none.
func joinCodes(codes []uint32, name func(uint32) string) string {
	if len(codes) == 0 {
		return "-"
	}
	names := make([]string, len(codes))
	for i, c := range codes {
		names[i] = name(c)
	}
	return strings.Join(names, ", ")
}

// grpcCodeName is a gRPC code's name as the API's enums read: UNAVAILABLE.
func grpcCodeName(c uint32) string {
	if c > uint32(codes.Unauthenticated) {
		return fmt.Sprint(c)
	}
	return strings.ToUpper(strings.Join(splitCamel(codes.Code(c).String()), "_"))
}

// splitCamel splits "ResourceExhausted" into "Resource" and "Exhausted".
func splitCamel(s string) []string {
	var words []string
	start := 0
	for i := 1; i < len(s); i++ {
		if s[i] >= 'A' && s[i] <= 'Z' && s[i-1] >= 'a' && s[i-1] <= 'z' {
			words = append(words, s[start:i])
			start = i
		}
	}
	return append(words, s[start:])
}

func orAny(s string) string {
	if s == "" {
		return "*"
	}
	return s
}

func breakersCmd(c *clientFlags) *cobra.Command {
	var tenant, state string
	cmd := &cobra.Command{
		Use: "breakers", Short: "List the fleet's circuit breakers", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := parseState("--state", state, true)
			if err != nil {
				return err
			}
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.ListBreakers(ctx, &pb.ListBreakersRequest{Tenant: tenant, State: st, PageSize: 1000})
			}, func(w io.Writer, m proto.Message) { printBreakers(w, m.(*pb.ListBreakersResponse).GetBreakers()) })
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant's breakers")
	cmd.Flags().StringVar(&state, "state", "", "only breakers in this state: closed, open, half-open or disabled")
	return cmd
}

func parseState(flag, s string, allowEmpty bool) (pb.BreakerState, error) {
	if s == "" && allowEmpty {
		return pb.BreakerState_BREAKER_STATE_UNSPECIFIED, nil
	}
	v, ok := pb.BreakerState_value["BREAKER_STATE_"+strings.ToUpper(strings.ReplaceAll(s, "-", "_"))]
	if !ok || v == 0 {
		return 0, fmt.Errorf("%s: must be closed, open, half-open or disabled, got %q", flag, s)
	}
	return pb.BreakerState(v), nil
}

func printBreakers(w io.Writer, list []*pb.Breaker) {
	rows := make([][]string, 0, len(list))
	for _, b := range list {
		st := trimEnum(b.GetState().String(), "BREAKER_STATE_")
		if b.GetForced() {
			st += " (forced)"
		}
		rows = append(rows, []string{orAny(b.GetKey().GetTenant()), b.GetKey().GetTarget(), st,
			fmt.Sprint(b.GetConsecutiveFailures()), fmt.Sprintf("%d/%d", b.GetWindowFailures(), b.GetWindowCalls()),
			tsText(b.GetOpenUntilTime()), tsText(b.GetCooldownUntilTime()), tsText(b.GetChangeTime()), ceilingText(b)})
	}
	table(w, "TENANT\tTARGET\tSTATE\tCONSECUTIVE\tWINDOW FAIL/CALLS\tOPEN UNTIL\tCOOL-DOWN UNTIL\tCHANGED\tCEILING", rows)
	if slices.ContainsFunc(list, (*pb.Breaker).GetDegraded) {
		fmt.Fprintln(w, "degraded: the replica's store did not answer; these are the replica's last-known states, the ones it decides from meanwhile (breakers it never met are not listed)")
	}
}

// ceilingText is a breaker's concurrency ceiling: "-" for none, the
// number, and for an adaptive ceiling its exact value beside it.
func ceilingText(b *pb.Breaker) string {
	switch {
	case b.GetCeiling() == 0:
		return "-"
	case b.GetAdaptiveLimit() > 0:
		return fmt.Sprintf("%d (adaptive %.2f)", b.GetCeiling(), b.GetAdaptiveLimit())
	}
	return fmt.Sprint(b.GetCeiling())
}

func breakerCmd(c *clientFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "breaker", Short: "Inspect, reset or force one breaker"}
	var tenant string
	key := func(target string) *pb.BreakerKey { return &pb.BreakerKey{Tenant: tenant, Target: target} }
	one := func(w io.Writer, b *pb.Breaker) {
		printBreakers(w, []*pb.Breaker{b})
		if b.GetLeasesInFlight() > 0 || b.GetStrayReleases() > 0 {
			fmt.Fprintf(w, "concurrency leases in flight: %d; releases of leases not held: %d\n", b.GetLeasesInFlight(), b.GetStrayReleases())
		}
	}
	get := &cobra.Command{
		Use: "get TARGET", Short: "Show one breaker", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.GetBreaker(ctx, &pb.GetBreakerRequest{Key: key(args[0])})
			}, func(w io.Writer, m proto.Message) { one(w, m.(*pb.GetBreakerResponse).GetBreaker()) })
		},
	}
	reset := &cobra.Command{
		Use: "reset TARGET", Short: "Close a breaker and clear its counters and pin", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.ResetBreaker(ctx, &pb.ResetBreakerRequest{Key: key(args[0])})
			}, func(w io.Writer, m proto.Message) { one(w, m.(*pb.ResetBreakerResponse).GetBreaker()) })
		},
	}
	force := &cobra.Command{
		Use: "force TARGET open|closed|disabled", Short: "Pin a breaker's state until reset", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := parseState("state", args[1], false)
			if err != nil {
				return err
			}
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: key(args[0]), State: st})
			}, func(w io.Writer, m proto.Message) { one(w, m.(*pb.ForceBreakerResponse).GetBreaker()) })
		},
	}
	cmd.PersistentFlags().StringVar(&tenant, "tenant", "", "the breaker's tenant (empty for a target-scoped breaker)")
	cmd.AddCommand(get, reset, force)
	return cmd
}

func runCmd(c *clientFlags) *cobra.Command {
	cmd := &cobra.Command{Use: "run", Short: "Open and reconcile batch runs"}
	var (
		tenant, id, desc string
		pool             uint64
		cutoff           string
	)
	open := &cobra.Command{
		Use: "open", Short: "Open a run with a retry pool and a cut-off", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			at, err := parseCutoff(cutoff, time.Now())
			if err != nil {
				return err
			}
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.OpenRun(ctx, &pb.OpenRunRequest{RunId: id, Tenant: tenant, RetryPool: pool,
					CutoffTime: timestamppb.New(at), Description: desc})
			}, func(w io.Writer, m proto.Message) { printRun(w, m.(*pb.OpenRunResponse).GetRun()) })
		},
	}
	f := open.Flags()
	f.StringVar(&tenant, "tenant", "", "tenant owning the run (required)")
	f.StringVar(&id, "id", "", "run id (default: chosen by policyd)")
	f.Uint64Var(&pool, "pool", 0, "total retries the run's calls may spend (required, > 0)")
	f.StringVar(&cutoff, "cutoff", "", "cut-off: a duration from now (8h) or an RFC 3339 time (required)")
	f.StringVar(&desc, "description", "", "free text for operators")
	_ = open.MarkFlagRequired("tenant")
	_ = open.MarkFlagRequired("pool")
	_ = open.MarkFlagRequired("cutoff")
	get := &cobra.Command{
		Use: "get RUN_ID", Short: "Show a run's reconciliation", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.GetRun(ctx, &pb.GetRunRequest{RunId: args[0]})
			}, func(w io.Writer, m proto.Message) { printRun(w, m.(*pb.GetRunResponse).GetRun()) })
		},
	}
	var listTenant string
	list := &cobra.Command{
		Use: "list", Short: "List runs", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return a.ListRuns(ctx, &pb.ListRunsRequest{Tenant: listTenant, PageSize: 1000})
			}, func(w io.Writer, m proto.Message) {
				var rows [][]string
				for _, r := range m.(*pb.ListRunsResponse).GetRuns() {
					rows = append(rows, []string{r.GetRunId(), r.GetTenant(), fmt.Sprintf("%d/%d", r.GetRetriesSpent(), r.GetRetryPool()),
						tsText(r.GetCutoffTime()), fmt.Sprint(r.GetLedger().GetSucceeded())})
				}
				table(w, "RUN\tTENANT\tRETRIES SPENT/POOL\tCUT-OFF\tSUCCEEDED", rows)
			})
		},
	}
	list.Flags().StringVar(&listTenant, "tenant", "", "only this tenant's runs")
	cmd.AddCommand(open, get, list)
	cmd.AddCommand(runCallsCmds(c)...)
	return cmd
}

// parseCutoff reads a cut-off as a duration from now or an RFC 3339 time.
func parseCutoff(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--cutoff: must be a duration (8h) or an RFC 3339 time, got %q", s)
	}
	return t, nil
}

func printRun(w io.Writer, r *pb.Run) {
	l := r.GetLedger()
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "run\t%s\n", shown(r.GetRunId()))
	fmt.Fprintf(tw, "tenant\t%s\n", shown(r.GetTenant()))
	fmt.Fprintf(tw, "cut-off\t%s\n", tsText(r.GetCutoffTime()))
	fmt.Fprintf(tw, "retries spent\t%d of %d\n", r.GetRetriesSpent(), r.GetRetryPool())
	fmt.Fprintf(tw, "succeeded\t%d (%d deduplicated by the idempotency ledger)\n", l.GetSucceeded(), l.GetDeduplicated())
	fmt.Fprintf(tw, "failed terminal\t%d\n", l.GetFailedTerminal())
	fmt.Fprintf(tw, "dead letter: attempts exhausted\t%d\n", l.GetDeadLetterExhausted())
	fmt.Fprintf(tw, "dead letter: budget\t%d\n", l.GetDeadLetterBudget())
	fmt.Fprintf(tw, "dead letter: not idempotent\t%d\n", l.GetDeadLetterNotIdempotent())
	fmt.Fprintf(tw, "dead letter: server pushback\t%d\n", l.GetDeadLetterPushback())
	fmt.Fprintf(tw, "dead letter: deadline\t%d\n", l.GetDeadLetterDeadline())
	fmt.Fprintf(tw, "circuit open\t%d\n", l.GetCircuitOpen())
	fmt.Fprintf(tw, "deadline cut\t%d\n", l.GetDeadlineCut())
	tw.Flush()
}

func auditCmd(c *clientFlags) *cobra.Command {
	var callID, tenant, since, until string
	var limit int
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show the audit trail of a call (--call-id) or of a tenant (--tenant, --since, --until)",
		Long: `Show the audit trail, oldest first: every decision (classification, wait or
stop reason), reported outcome, refused admission and final disposition.

  policyd audit --call-id doc-17
  policyd audit --tenant acme --since 1h
  policyd audit --tenant acme --since 2026-11-29T08:00:00Z --until 2026-11-29T09:00:00Z --json

Records not yet written to disk are included. They are kept for the daemon's
--audit-retention and at most --audit-max-records of them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if callID == "" && tenant == "" {
				return fmt.Errorf("--call-id or --tenant is required")
			}
			if limit <= 0 {
				return fmt.Errorf("--limit: must be > 0, got %d", limit)
			}
			req := &pb.QueryAuditRequest{CallId: callID, Tenant: tenant}
			now := time.Now()
			for _, b := range []struct {
				flag, v string
				dst     **timestamppb.Timestamp
			}{{"--since", since, &req.StartTime}, {"--until", until, &req.EndTime}} {
				if b.v == "" {
					continue
				}
				at, err := parseAgo(b.flag, b.v, now)
				if err != nil {
					return err
				}
				*b.dst = timestamppb.New(at)
			}
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				all := &pb.QueryAuditResponse{}
				for {
					req.PageSize = uint32(min(1000, limit-len(all.Records)))
					resp, err := a.QueryAudit(ctx, req)
					if err != nil {
						return nil, err
					}
					all.Records = append(all.Records, resp.GetRecords()...)
					all.NextPageToken = resp.GetNextPageToken()
					if all.NextPageToken == "" || len(all.Records) >= limit {
						return all, nil
					}
					req.PageToken = all.NextPageToken
				}
			}, printAudit)
		},
	}
	f := cmd.Flags()
	f.StringVar(&callID, "call-id", "", "the call whose records to show")
	f.StringVar(&tenant, "tenant", "", "the tenant whose records to show")
	f.StringVar(&since, "since", "", "only records from this time on: a duration ago (1h) or an RFC 3339 time")
	f.StringVar(&until, "until", "", "only records before this time: a duration ago (10m) or an RFC 3339 time")
	f.IntVar(&limit, "limit", 1000, "most records to show")
	cmd.AddCommand(auditVerifyCmd(), auditExportCmd(c))
	return cmd
}

// parseAgo reads a time as a duration before now or an RFC 3339 time.
func parseAgo(flag, s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: must be a duration ago (1h) or an RFC 3339 time, got %q", flag, s)
	}
	return t, nil
}

func printAudit(w io.Writer, m proto.Message) {
	resp := m.(*pb.QueryAuditResponse)
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	var rows [][]string
	for _, r := range resp.GetRecords() {
		decision, delay, stop, disp := "-", "-", "-", "-"
		if r.GetDecision() != pb.Decision_DECISION_UNSPECIFIED {
			decision = trimEnum(r.GetDecision().String(), "DECISION_")
		}
		if r.GetDelay() != nil {
			delay = r.GetDelay().AsDuration().Round(time.Millisecond).String()
		}
		if r.GetStopReason() != pb.StopReason_STOP_REASON_UNSPECIFIED {
			stop = trimEnum(r.GetStopReason().String(), "STOP_REASON_")
		}
		if r.GetDisposition() != pb.Disposition_DISPOSITION_UNSPECIFIED {
			disp = trimEnum(r.GetDisposition().String(), "DISPOSITION_")
		}
		rows = append(rows, []string{r.GetRecordTime().AsTime().UTC().Format("2006-01-02T15:04:05.000Z"),
			trimEnum(r.GetEvent().String(), "AUDIT_EVENT_"), r.GetTenant(), r.GetTarget(), dash(r.GetCallId()),
			dash(r.GetRunId()), fmt.Sprint(r.GetAttempt()), dash(r.GetClassification()), decision, delay, stop, disp,
			dash(r.GetDetail())})
	}
	table(w, "TIME\tEVENT\tTENANT\tTARGET\tCALL\tRUN\tATTEMPT\tCLASSIFICATION\tDECISION\tDELAY\tSTOP\tDISPOSITION\tDETAIL", rows)
	if resp.GetNextPageToken() != "" {
		fmt.Fprintf(w, "(more records: raise --limit or narrow --since/--until)\n")
	}
}
