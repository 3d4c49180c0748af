package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// runCallsCmds are `policyd run calls` (a run's call table, the dead-letter
// list) and `policyd run redrive` (a new run for its dead letters).
func runCallsCmds(c *clientFlags) []*cobra.Command {
	var (
		tenant       string
		dispositions []string
		stops        []string
	)
	calls := &cobra.Command{
		Use:   "calls RUN_ID",
		Short: "List a run's calls: disposition, stop reason, attempts, last failure, triage reference",
		Long: "List a run's calls from its call table, optionally only some dispositions\n" +
			"(--disposition dead_letter) or stop reasons (--stop-reason deadline). With\n" +
			"--json, one JSON object a line (JSON Lines), for jq.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &pb.ListRunCallsRequest{RunId: args[0], Tenant: tenant}
			if err := parseCallFilter(req, dispositions, stops); err != nil {
				return err
			}
			lines := c.JSON
			c.JSON = false // JSON Lines, written by the printer below
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				return allRunCalls(ctx, a, req)
			}, func(w io.Writer, m proto.Message) {
				resp := m.(*pb.ListRunCallsResponse)
				if lines {
					for _, rc := range resp.GetCalls() {
						b, _ := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(rc)
						fmt.Fprintln(w, string(b))
					}
					return
				}
				var rows [][]string
				for _, rc := range resp.GetCalls() {
					rows = append(rows, []string{rc.GetCallId(), enumName(rc.GetDisposition().String(), "DISPOSITION_"),
						enumName(rc.GetStopReason().String(), "STOP_REASON_"), fmt.Sprint(rc.GetAttempts()),
						rc.GetLastClassification(), tsText(rc.GetLastAttemptTime()), rc.GetTarget(), rc.GetTriageRef()})
				}
				table(w, "CALL\tDISPOSITION\tSTOP\tATTEMPTS\tLAST FAILURE\tLAST ATTEMPT\tTARGET\tTRIAGE", rows)
				if n := resp.GetUntracked(); n > 0 {
					fmt.Fprintf(w, "(%d more calls beyond the run's call table cap are counted in its ledger only)\n", n)
				}
			})
		},
	}
	f := calls.Flags()
	f.StringVar(&tenant, "tenant", "", "the tenant owning the run (required with a tenant token)")
	f.StringSliceVar(&dispositions, "disposition", nil,
		"only calls of these dispositions: succeeded, failed_terminal, dead_letter, deadline_cut, circuit_open, unspecified (repeatable)")
	f.StringSliceVar(&stops, "stop-reason", nil,
		"only calls of these stop reasons: terminal, not_idempotent, attempts_exhausted, deadline, budget_exhausted, circuit_open, server_pushback (repeatable)")

	var (
		into, cutoff string
		pool         uint64
	)
	redrive := &cobra.Command{
		Use:   "redrive RUN_ID --into NEW_RUN_ID",
		Short: "Open a run re-driving a run's dead-lettered and cut calls; print their ids",
		Long: "Open NEW_RUN_ID (redrive_of RUN_ID, the same tenant) for the dead-lettered\n" +
			"and deadline-cut calls of RUN_ID, and print their call ids, one a line, for\n" +
			"the batch to re-drive under the new run.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			at, err := parseCutoff(cutoff, time.Now())
			if err != nil {
				return err
			}
			c.JSON = false
			var opened *pb.Run
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				old, err := a.GetRun(ctx, &pb.GetRunRequest{RunId: args[0]})
				if err != nil {
					return nil, err
				}
				resp, err := allRunCalls(ctx, a, &pb.ListRunCallsRequest{RunId: args[0], Dispositions: []pb.Disposition{
					pb.Disposition_DISPOSITION_DEAD_LETTER, pb.Disposition_DISPOSITION_DEADLINE_CUT}})
				if err != nil {
					return nil, err
				}
				n := pool
				if n == 0 {
					n = 3 * uint64(max(len(resp.GetCalls()), 1))
				}
				r, err := a.OpenRun(ctx, &pb.OpenRunRequest{RunId: into, Tenant: old.GetRun().GetTenant(), RetryPool: n,
					CutoffTime: timestamppb.New(at), RedriveOf: args[0],
					Description: fmt.Sprintf("re-drive of %s: %d calls", args[0], len(resp.GetCalls()))})
				if err != nil {
					return nil, err
				}
				opened = r.GetRun()
				return resp, nil
			}, func(w io.Writer, m proto.Message) {
				ids := m.(*pb.ListRunCallsResponse).GetCalls()
				for _, rc := range ids {
					fmt.Fprintln(w, rc.GetCallId())
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "opened run %s (re-drive of %s, pool %d, cut-off %s) for %d calls\n",
					opened.GetRunId(), args[0], opened.GetRetryPool(), tsText(opened.GetCutoffTime()), len(ids))
			})
		},
	}
	f = redrive.Flags()
	f.StringVar(&into, "into", "", "the new run's id (required)")
	f.StringVar(&cutoff, "cutoff", "24h", "the new run's cut-off: a duration from now or an RFC 3339 time")
	f.Uint64Var(&pool, "pool", 0, "the new run's retry pool (default 3 x the calls re-driven)")
	_ = redrive.MarkFlagRequired("into")
	return []*cobra.Command{calls, redrive}
}

// allRunCalls pages through ListRunCalls and returns every page's calls
// in one response.
func allRunCalls(ctx context.Context, a pb.AdminServiceClient, req *pb.ListRunCallsRequest) (*pb.ListRunCallsResponse, error) {
	out := &pb.ListRunCallsResponse{}
	req.PageSize = 1000
	for {
		resp, err := a.ListRunCalls(ctx, req)
		if err != nil {
			return nil, err
		}
		out.Calls = append(out.Calls, resp.GetCalls()...)
		out.Untracked = resp.GetUntracked()
		if resp.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// parseCallFilter sets req's filter from the flags' names.
func parseCallFilter(req *pb.ListRunCallsRequest, dispositions, stops []string) error {
	for _, d := range dispositions {
		v, ok := pb.Disposition_value["DISPOSITION_"+strings.ToUpper(d)]
		if !ok {
			return fmt.Errorf("--disposition: unknown disposition %q", d)
		}
		req.Dispositions = append(req.Dispositions, pb.Disposition(v))
	}
	for _, s := range stops {
		v, ok := pb.StopReason_value["STOP_REASON_"+strings.ToUpper(s)]
		if !ok || v == 0 {
			return fmt.Errorf("--stop-reason: unknown stop reason %q", s)
		}
		req.StopReasons = append(req.StopReasons, pb.StopReason(v))
	}
	return nil
}

// enumName is an enum value's name without its prefix, lower case; ""
// for UNSPECIFIED.
func enumName(name, prefix string) string {
	if n := strings.TrimPrefix(name, prefix); n != "UNSPECIFIED" {
		return strings.ToLower(n)
	}
	return ""
}
