package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestRunCallsAndRedrive, against a real daemon: a batch of 8 documents
// under run nightly, half of them failing with 503 on every attempt;
// `policyd run calls --disposition dead_letter --json` prints their JSON
// Lines (disposition, stop reason, attempts, triage reference);
// `policyd run redrive nightly --into nightly-redrive` opens the linked
// run and prints their ids; re-driven under it against a healed upstream,
// each succeeds, and the new run's ledger says so.
func TestRunCallsAndRedrive(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir+"/policyd.db")
	conn := d.conn(t)
	ctx := context.Background()
	admin := pb.NewAdminServiceClient(conn)
	if _, err := admin.OpenRun(ctx, &pb.OpenRunRequest{RunId: "nightly", Tenant: "acme", RetryPool: 100,
		CutoffTime: timestamppb.New(time.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	healthy := false
	upstream := func(doc int) func(context.Context, policyclient.Attempt) error {
		return func(context.Context, policyclient.Attempt) error {
			if doc%2 == 1 && !healthy {
				return policyclient.HTTPError(503, nil)
			}
			return nil
		}
	}
	submit := func(run string, ids []string) map[string]policyclient.Result {
		c, err := policyclient.New(conn, policyclient.Config{Tenant: "acme", NoWatch: true,
			Sleep: func(ctx context.Context, _ time.Duration) error { return ctx.Err() }})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]policyclient.Result{}
		for _, id := range ids {
			var doc int
			fmt.Sscanf(id, "doc-%d", &doc)
			res, err := c.Do(ctx, policyclient.Call{Target: "grants", SubmissionID: id, RunID: run,
				TriageRef: "s3://inbox/" + id + ".pdf"}, upstream(doc))
			if err != nil {
				t.Fatal(err)
			}
			out[id] = res
		}
		if err := c.Close(ctx); err != nil { // reports every outcome
			t.Fatal(err)
		}
		return out
	}
	var docs []string
	for i := range 8 {
		docs = append(docs, fmt.Sprintf("doc-%d", i))
	}
	first := submit("nightly", docs)

	out, err := runCLI(t, dir, "run", "calls", "nightly", "--disposition", "dead_letter", "--json", "--addr", d.addr)
	if err != nil {
		t.Fatalf("run calls: %v\n%s", err, out)
	}
	t.Logf("policyd run calls nightly --disposition dead_letter --json\n%s", out)
	var dead []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var rc struct {
			CallID      string `json:"callId"`
			Disposition string `json:"disposition"`
			Attempts    int    `json:"attempts"`
			TriageRef   string `json:"triageRef"`
		}
		if err := json.Unmarshal([]byte(line), &rc); err != nil {
			t.Fatalf("not a JSON line: %q: %v", line, err)
		}
		if rc.Disposition != "DISPOSITION_DEAD_LETTER" || rc.TriageRef != "s3://inbox/"+rc.CallID+".pdf" ||
			first[rc.CallID].Disposition != policyclient.DeadLetter || rc.Attempts != first[rc.CallID].Attempts {
			t.Errorf("line %s, but the worker got %+v", line, first[rc.CallID])
		}
		dead = append(dead, rc.CallID)
	}
	if fmt.Sprint(dead) != "[doc-1 doc-3 doc-5 doc-7]" {
		t.Errorf("dead letters listed: %v, want the 4 odd documents", dead)
	}

	var stdout, stderr bytes.Buffer
	cmd := exec.Command(binary, "run", "redrive", "nightly", "--into", "nightly-redrive", "--addr", d.addr)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("run redrive: %v\n%s", err, stderr.String())
	}
	t.Logf("policyd run redrive nightly --into nightly-redrive\n%s%s", stdout.String(), stderr.String())
	ids := strings.Fields(stdout.String())
	if fmt.Sprint(ids) != fmt.Sprint(dead) {
		t.Fatalf("re-drive ids: %v, want %v", ids, dead)
	}
	healthy = true
	for id, res := range submit("nightly-redrive", ids) {
		if !res.OK() {
			t.Errorf("%s re-driven: %v", id, res.Disposition)
		}
	}
	run, err := admin.GetRun(ctx, &pb.GetRunRequest{RunId: "nightly-redrive"})
	if err != nil {
		t.Fatal(err)
	}
	if r := run.GetRun(); r.GetRedriveOf() != "nightly" || r.GetLedger().GetSucceeded() != uint64(len(ids)) {
		t.Errorf("the re-drive run: %v, want redrive_of nightly and %d succeeded", r, len(ids))
	}
	out, _ = runCLI(t, dir, "run", "calls", "nightly-redrive", "--addr", d.addr)
	t.Logf("policyd run calls nightly-redrive\n%s", out)
}
