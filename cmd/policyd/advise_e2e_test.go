package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestAdviseCommand, against a real daemon: 100 documents through the Go
// client on target geocoder, every fifth failing 503 on all three
// attempts; `policyd advise` prints the histogram, the summary, the
// recommendation (max_attempts 1: the retries recovered none) and a dry
// run; --json gives the counts; --apply writes the proposal through
// SetPolicy; a window outside 1m..168h is refused naming since.
func TestAdviseCommand(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir+"/policyd.db")
	conn := d.conn(t)
	ctx := context.Background()
	admin := pb.NewAdminServiceClient(conn)
	if _, err := admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "acme", Capacity: 1000}}); err != nil {
		t.Fatal(err)
	}
	c, err := policyclient.New(conn, policyclient.Config{Tenant: "acme", NoWatch: true,
		Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
	if err != nil {
		t.Fatal(err)
	}
	for doc := range 100 {
		res, err := c.Do(ctx, policyclient.Call{Target: "geocoder", SubmissionID: fmt.Sprint("doc-", doc)},
			func(context.Context, policyclient.Attempt) error {
				if doc%5 == 0 {
					return policyclient.HTTPError(503, nil)
				}
				return nil
			})
		if err != nil {
			t.Fatal(err)
		}
		if want := doc%5 != 0; res.OK() != want {
			t.Fatalf("doc-%d: %+v, want OK %v", doc, res, want)
		}
	}
	if err := c.Close(ctx); err != nil { // reports every outcome
		t.Fatal(err)
	}

	out, err := runCLI(t, dir, "advise", "--tenant", "acme", "--since", "1h", "--addr", d.addr)
	if err != nil {
		t.Fatalf("advise: %v\n%s", err, out)
	}
	t.Logf("policyd advise --tenant acme --since 1h\n%s", out)
	for _, want := range []string{
		"acme/geocoder: 100 calls from ",
		"ATTEMPT    1   2  3\nsucceeded  80  0  0\nfailed     0   0  20\n",
		"summary: 100% of successes on attempt 1; attempts 2-3 recovered 0% of failures\n",
		"recommendation: max_attempts 1: attempts 2-3 recovered 0% of the calls that reached them\n",
		"dry run: would set acme/geocoder: max_attempts: 3 -> 1 (--apply writes it)\n",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("advise output lacks %q", want)
		}
	}
	if p, err := admin.GetPolicy(ctx, &pb.GetPolicyRequest{Tenant: "acme", Target: "geocoder"}); err == nil {
		t.Errorf("a dry run stored a policy: %v", p.GetEntry())
	}

	out, err = runCLI(t, dir, "advise", "--tenant", "acme", "--json", "--addr", d.addr)
	if err != nil {
		t.Fatalf("advise --json: %v\n%s", err, out)
	}
	var resp struct {
		Advice []struct {
			Target             string   `json:"target"`
			SuccessesByAttempt []string `json:"successesByAttempt"` // uint64 is a string in proto JSON
			FailuresByAttempt  []string `json:"failuresByAttempt"`
			Changes            []string `json:"changes"`
		} `json:"advice"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("advise --json is not JSON: %v\n%s", err, out)
	}
	if len(resp.Advice) != 1 || resp.Advice[0].SuccessesByAttempt[0] != "80" || resp.Advice[0].FailuresByAttempt[2] != "20" ||
		fmt.Sprint(resp.Advice[0].Changes) != "[max_attempts: 3 -> 1]" {
		t.Errorf("advise --json = %+v, want geocoder with 80 successes on attempt 1 and 20 failures after 3", resp.Advice)
	}

	out, err = runCLI(t, dir, "advise", "--tenant", "acme", "--apply", "--addr", d.addr)
	if err != nil || !strings.Contains(string(out), "applied: set acme/geocoder: max_attempts: 3 -> 1\n") {
		t.Fatalf("advise --apply: %v\n%s", err, out)
	}
	p, err := admin.GetPolicy(ctx, &pb.GetPolicyRequest{Tenant: "acme", Target: "geocoder"})
	if err != nil || p.GetEntry().GetPolicy().GetMaxAttempts() != 1 {
		t.Errorf("after --apply: GetPolicy(acme/geocoder) = %v, %v; want max_attempts 1", p.GetEntry(), err)
	}

	out, err = runCLI(t, dir, "advise", "--since", "30s", "--addr", d.addr)
	if err == nil || !strings.Contains(string(out), "since: must be 1m to 168h") || !strings.Contains(string(out), "InvalidArgument") {
		t.Errorf("advise --since 30s: %v\n%s; want a refusal naming since (InvalidArgument)", err, out)
	}
}
