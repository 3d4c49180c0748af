package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/auditsink"
	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
)

// descAuditSinkErrors counts breakerstore's Stats.AuditSinkErrors.
var descAuditSinkErrors = prometheus.NewDesc("policyd_audit_sink_errors_total",
	"Commits refused because the --audit-sink write failed (the records stay pending and are retried).", nil, nil)

// auditSinkConfig is what `policyd serve` is told about the write-once
// audit tier.
type auditSinkConfig struct {
	Spec     string // file:PATH, or empty for none
	MaxBytes int64
}

func (a *auditSinkConfig) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&a.Spec, "audit-sink", "",
		"also append every audit record, within its commit and fsync'd, to hash-chained JSON Lines files: file:PATH writes PATH-000001.jsonl, "+
			"PATH-000002.jsonl, ... (check them with `policyd audit verify`); when a write fails the commit is refused and retried (empty: off)")
	f.Int64Var(&a.MaxBytes, "audit-sink-max-bytes", auditsink.DefaultMaxBytes, "with --audit-sink: start the next file past this size")
}

// open opens the sink --audit-sink names; without one it returns a nil
// AuditSink. The caller must call close once the store is closed.
func (a *auditSinkConfig) open(log *slog.Logger) (sink breakerstore.AuditSink, closeSink func(), err error) {
	if a.Spec == "" {
		return nil, func() {}, nil
	}
	path, ok := strings.CutPrefix(a.Spec, "file:")
	if !ok || path == "" {
		return nil, nil, fmt.Errorf("--audit-sink: must be file:PATH, got %q", a.Spec)
	}
	if a.MaxBytes <= 0 {
		return nil, nil, fmt.Errorf("--audit-sink-max-bytes: must be > 0, got %d", a.MaxBytes)
	}
	s, err := auditsink.Open(path, auditsink.Options{MaxBytes: a.MaxBytes, Logger: log})
	if err != nil {
		return nil, nil, fmt.Errorf("--audit-sink: %w", err)
	}
	log.Info("audit sink open", "path", path, "max_bytes", a.MaxBytes)
	return s, func() {
		if err := s.Close(); err != nil {
			log.Error("closing the audit sink", "err", err)
		}
	}, nil
}

func auditVerifyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "verify PATH...",
		Short: "Check the hash chain of audit sink files (offline)",
		Long: `Check that audit sink files (--audit-sink, or an audit export) form one
unbroken chain, in the order given: each line is an audit line whose prev is
the SHA-256 of the line before, the first chaining from the genesis value. A
PATH that is not a file but a sink's --audit-sink path stands for all its
files, in order. Prints the lines checked and the hash of the last one (record
it elsewhere: a truncated tail leaves no break). Exits 1 naming the file and
line of the first break.

  policyd audit verify audit.jsonl
  policyd audit verify audit-000001.jsonl audit-000002.jsonl`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var files []string
			for _, a := range args {
				if _, err := os.Stat(a); err == nil {
					files = append(files, a)
					continue
				}
				sunk, err := auditsink.Files(a)
				if err != nil || len(sunk) == 0 {
					return fmt.Errorf("%s: no such file, nor the files of a sink at that path", a)
				}
				files = append(files, sunk...)
			}
			v, err := auditsink.Verify(files)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "ok: %d lines in %d file(s), chain unbroken; head %s\n", v.Lines, v.Files, v.Head)
			return nil
		},
	}
}

func auditExportCmd(c *clientFlags) *cobra.Command {
	var since, until, tenant, output string
	cmd := &cobra.Command{
		Use:   "export --since TIME [--until TIME]",
		Short: "Write the retained audit trail as a hash-chained JSON Lines file",
		Long: `Write the audit records the daemon still keeps (--audit-retention) from
--since on, of every tenant or of --tenant, oldest first, in the --audit-sink
line format, chained from the genesis value, to stdout or --output; check it
with 'policyd audit verify'. An export carries what QueryAudit answers: no
sequence numbers, and an outcome's latency in its detail.

  policyd audit export --since 24h --output audit-export.jsonl
  policyd audit export --since 2026-11-29T00:00:00Z --until 2026-11-30T00:00:00Z --tenant acme`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if since == "" {
				return fmt.Errorf("--since is required")
			}
			now := time.Now()
			req := &pb.QueryAuditRequest{Tenant: tenant, PageSize: 1000}
			at, err := parseAgo("--since", since, now)
			if err != nil {
				return err
			}
			req.StartTime = timestamppb.New(at)
			if until != "" {
				at, err := parseAgo("--until", until, now)
				if err != nil {
					return err
				}
				req.EndTime = timestamppb.New(at)
			}
			out := cmd.OutOrStdout()
			if output != "" {
				f, err := os.OpenFile(output, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
				if err != nil {
					return fmt.Errorf("--output: %w", err)
				}
				defer f.Close()
				out = f
			}
			n, head, err := c.exportAudit(cmd, req, out)
			if err != nil {
				return err
			}
			if f, ok := out.(*os.File); ok && output != "" {
				if err := f.Sync(); err != nil {
					return fmt.Errorf("--output: %w", err)
				}
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "exported %d records; head %s\n", n, head)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&since, "since", "", "records from this time on: a duration ago (24h) or an RFC 3339 time (required)")
	f.StringVar(&until, "until", "", "records before this time: a duration ago (1h) or an RFC 3339 time")
	f.StringVar(&tenant, "tenant", "", "only this tenant's records")
	f.StringVar(&output, "output", "", "write to this new file instead of stdout")
	return cmd
}

// exportAudit pages through req, each page within --timeout, and writes
// its records to w as a chain; it returns the records written and the
// chain's head.
func (c *clientFlags) exportAudit(cmd *cobra.Command, req *pb.QueryAuditRequest, w io.Writer) (int, string, error) {
	opts, noToken, err := c.credentials(cmd.Flags().Changed("token-file"))
	if err != nil {
		return 0, "", err
	}
	conn, err := grpc.NewClient(c.Addr, opts...)
	if err != nil {
		return 0, "", fmt.Errorf("--addr: %w", err)
	}
	defer conn.Close()
	admin := pb.NewAdminServiceClient(conn)
	bw := bufio.NewWriter(w)
	var chain auditsink.Chain
	n := 0
	for {
		ctx, cancel := context.WithTimeout(cmd.Context(), c.Timeout)
		resp, err := admin.QueryAudit(ctx, req)
		cancel()
		if err != nil {
			return n, "", c.callError(err, noToken)
		}
		for _, r := range resp.GetRecords() {
			if _, err := bw.Write(chain.Line(auditRecordFromPB(r))); err != nil {
				return n, "", err
			}
			n++
		}
		if req.PageToken = resp.GetNextPageToken(); req.PageToken == "" {
			break
		}
	}
	return n, chain.Head(), bw.Flush()
}

// auditRecordFromPB is the record QueryAudit answered, as the sink writes
// it; the enums are numbered alike.
func auditRecordFromPB(r *pb.AuditRecord) policy.AuditRecord {
	return policy.AuditRecord{
		Time: r.GetRecordTime().AsTime(), Event: policy.AuditEvent(r.GetEvent()), Tenant: r.GetTenant(), Target: r.GetTarget(),
		CallID: r.GetCallId(), RunID: r.GetRunId(), Attempt: r.GetAttempt(), Classification: r.GetClassification(),
		Verdict: policy.Verdict(r.GetDecision()), Delay: r.GetDelay().AsDuration(), Stop: policy.StopReason(r.GetStopReason()),
		Disposition: policy.Disposition(r.GetDisposition()), Detail: r.GetDetail(),
	}
}
