package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// adviseCmd is `policyd advise`: per target, what the retries earned over
// a window (AdviseTargets) and the policy change that follows, written
// through SetPolicy with --apply.
func adviseCmd(c *clientFlags) *cobra.Command {
	var (
		tenant, target string
		since          time.Duration
		apply          bool
	)
	cmd := &cobra.Command{
		Use:   "advise",
		Short: "Say per target what its retries earned and the policy change that follows (--apply writes it)",
		Long: "Say, per tenant and target with calls in the window, what the retries earned\n" +
			"(successes and final failures by attempt number, a summary) and the change\n" +
			"that follows: fallback.after_attempts or max_attempts when the attempts beyond\n" +
			"k recover under 1% of the calls that reach them, nothing when the retries earn\n" +
			"their keep or below 50 calls. A dry run by default; --apply writes each\n" +
			"proposed policy at its (tenant, target) scope through SetPolicy.",
		Example: "  policyd advise --tenant acme --since 24h\n  policyd advise --tenant acme --target geocoder-b --apply",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &pb.AdviseTargetsRequest{Tenant: tenant, Target: target, Since: durationpb.New(since)}
			return c.call(cmd, func(ctx context.Context, a pb.AdminServiceClient) (proto.Message, error) {
				resp, err := a.AdviseTargets(ctx, req)
				if err != nil || !apply {
					return resp, err
				}
				for _, ad := range resp.GetAdvice() {
					if ad.GetProposedPolicy() == nil {
						continue
					}
					if _, err := a.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: ad.GetTenant(), Target: ad.GetTarget(),
						Policy: ad.GetProposedPolicy()}); err != nil {
						return nil, fmt.Errorf("set the policy of %s/%s: %w", ad.GetTenant(), ad.GetTarget(), err)
					}
					if c.JSON { // the text says so itself
						fmt.Fprintf(cmd.ErrOrStderr(), "set %s/%s: %s\n", shown(ad.GetTenant()), shown(ad.GetTarget()), strings.Join(ad.GetChanges(), ", "))
					}
				}
				return resp, nil
			}, func(w io.Writer, m proto.Message) {
				printAdvice(w, m.(*pb.AdviseTargetsResponse), apply)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&tenant, "tenant", "", "only this tenant's targets (required with a tenant token)")
	f.StringVar(&target, "target", "", "only this target")
	f.DurationVar(&since, "since", 24*time.Hour, "how far back the window reaches: 1m to 168h")
	f.BoolVar(&apply, "apply", false, "write each proposed policy through SetPolicy (default: a dry run)")
	return cmd
}

// printAdvice prints per target its compact histogram (the attempts up to
// the highest one counted), the summary, the recommendation and the
// change, and what a dry run would set.
func printAdvice(w io.Writer, resp *pb.AdviseTargetsResponse, applied bool) {
	if len(resp.GetAdvice()) == 0 {
		fmt.Fprintln(w, "no calls in the window")
		return
	}
	for i, ad := range resp.GetAdvice() {
		if i > 0 {
			fmt.Fprintln(w)
		}
		succ, fail := ad.GetSuccessesByAttempt(), ad.GetFailuresByAttempt()
		var calls uint64
		last := 1
		for j := range max(len(succ), len(fail)) {
			n := at(succ, j) + at(fail, j)
			calls += n
			if n > 0 {
				last = j + 1
			}
		}
		fmt.Fprintf(w, "%s/%s: %d calls from %s to %s\n", shown(ad.GetTenant()), shown(ad.GetTarget()), calls,
			tsText(ad.GetStartTime()), tsText(ad.GetEndTime()))
		header := []string{"ATTEMPT"}
		ok, failed := []string{"succeeded"}, []string{"failed"}
		for j := range last {
			name := strconv.Itoa(j + 1)
			if j == 15 {
				name = "16+"
			}
			header = append(header, name)
			ok = append(ok, strconv.FormatUint(at(succ, j), 10))
			failed = append(failed, strconv.FormatUint(at(fail, j), 10))
		}
		table(w, strings.Join(header, "\t"), [][]string{ok, failed})
		fmt.Fprintf(w, "summary: %s\n", ad.GetSummary())
		fmt.Fprintf(w, "recommendation: %s\n", ad.GetRecommendation())
		if ad.GetProposedPolicy() == nil {
			continue
		}
		changes := strings.Join(ad.GetChanges(), ", ")
		if applied {
			fmt.Fprintf(w, "applied: set %s/%s: %s\n", shown(ad.GetTenant()), shown(ad.GetTarget()), changes)
		} else {
			fmt.Fprintf(w, "dry run: would set %s/%s: %s (--apply writes it)\n", shown(ad.GetTenant()), shown(ad.GetTarget()), changes)
		}
	}
}

// at returns counts[i], 0 past its end.
func at(counts []uint64, i int) uint64 {
	if i < len(counts) {
		return counts[i]
	}
	return 0
}
