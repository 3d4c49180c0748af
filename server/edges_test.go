package server_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/policy"
	"github.com/policyd/policyd/server"
)

// TestOriginTimeInTheFuture: an origin_time more than the clock skew after
// the daemon's clock is refused naming the field; within the skew it is
// served.
func TestOriginTimeInTheFuture(t *testing.T) {
	tests := []struct {
		name  string
		skew  time.Duration // 0: the default, 5 min
		ahead time.Duration
		code  codes.Code
	}{
		{"in the past", 0, -time.Hour, codes.OK},
		{"within the default skew", 0, 5 * time.Minute, codes.OK},
		{"beyond the default skew", 0, 5*time.Minute + time.Second, codes.InvalidArgument},
		{"a year ahead", 0, 365 * 24 * time.Hour, codes.InvalidArgument},
		{"beyond a configured skew", 10 * time.Second, 11 * time.Second, codes.InvalidArgument},
		{"within a configured skew", time.Hour, 30 * time.Minute, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(c *server.Config, _ *breakerstore.Options) { c.MaxClockSkew = tt.skew })
			c := call("acme", "geo", "c1")
			c.OriginTime = timestamppb.New(h.clock.Now().Add(tt.ahead))
			_, err := h.workers.NextDelay(context.Background(), &pb.NextDelayRequest{Call: c, Attempt: 1, Failure: http(503)})
			msg := wantCode(t, err, tt.code)
			if tt.code != codes.OK && !strings.Contains(msg, "call.origin_time") {
				t.Errorf("message %q does not name call.origin_time", msg)
			}
		})
	}
}

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer = server.LockedBuffer

// logRecords returns the JSON records in logs whose msg is msg (every
// record for ""), each with its text under "line".
func logRecords(t *testing.T, logs *lockedBuffer, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if msg == "" || rec["msg"] == msg {
			rec["line"] = line
			out = append(out, rec)
		}
	}
	return out
}

// TestRefusedCallsAreLogged: every refused call is logged with the peer
// and the method, never the token, at most RefusalLogBurst a minute; the
// rest are counted in a "suppressed" line.
func TestRefusedCallsAreLogged(t *testing.T) {
	var logs lockedBuffer
	h := newHarness(t, func(c *server.Config, _ *breakerstore.Options) {
		c.Auth = server.NewAuth(server.AuthConfig{
			AdminTokens:  []string{"admin-secret"},
			TenantTokens: map[string]string{"tok-a": "tenant-a"},
			Logger:       slog.New(slog.NewJSONHandler(&logs, nil)),
			Clock:        c.Clock,
		})
	})
	nd := func(tok, tenant string) error {
		_, err := h.workers.NextDelay(withToken(tok), &pb.NextDelayRequest{Call: call(tenant, "geo", "c"), Attempt: 1, Failure: http(503)})
		return err
	}
	const refused = server.RefusalLogBurst + 5
	for i := range refused {
		switch i % 3 {
		case 0:
			wantCode(t, nd("forged-secret-token", "tenant-a"), codes.Unauthenticated)
		case 1:
			wantCode(t, nd("tok-a", "tenant-b"), codes.PermissionDenied)
		default:
			_, err := h.admin.ListBreakers(withToken("tok-a"), &pb.ListBreakersRequest{})
			wantCode(t, err, codes.PermissionDenied)
		}
	}
	if err := nd("tok-a", "tenant-a"); err != nil { // allowed calls are not logged
		t.Fatal(err)
	}
	h.clock.Advance(server.RefusalLogInterval)
	wantCode(t, nd("", "tenant-a"), codes.Unauthenticated)

	out := logs.String()
	for _, secret := range []string{"forged-secret-token", "tok-a", "admin-secret"} {
		if strings.Contains(out, secret) {
			t.Errorf("the log shows a token %q: %s", secret, out)
		}
	}
	var lines, suppressed int
	for _, rec := range logRecords(t, &logs, "") {
		line := rec["line"]
		switch rec["msg"] {
		case "call refused":
			lines++
			if rec["peer"] == "" || rec["peer"] == nil || !strings.HasPrefix(rec["method"].(string), "/retrypolicy.v1.") || rec["code"] == nil {
				t.Errorf("refusal line %q lacks the peer, method or code", line)
			}
		case "refused calls not logged":
			suppressed = int(rec["suppressed"].(float64))
		}
	}
	if lines != server.RefusalLogBurst+1 || suppressed != refused-server.RefusalLogBurst {
		t.Errorf("got %d refusal lines and %d suppressed, want %d and %d; log: %s",
			lines, suppressed, server.RefusalLogBurst+1, refused-server.RefusalLogBurst, out)
	}
}

// TestIDsRefuseInvisibleCharacters: tenant, target, call and run ids with
// white space at either end, or control, format (bidi), separator or
// noncharacter code points, are INVALID_ARGUMENT naming the field, in
// worker and admin calls alike; ordinary names are served.
func TestIDsRefuseInvisibleCharacters(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	bad := []struct{ name, v, rule string }{
		{"leading space", " acme", "white space"},
		{"trailing space", "acme ", "white space"},
		{"leading no-break space", "\u00a0acme", "white space"},
		{"trailing ideographic space", "acme\u3000", "white space"},
		{"trailing newline", "acme\n", "white space"},
		{"tab inside", "ac\tme", "control"},
		{"DEL inside", "ac\x7fme", "control"},
		{"C1 control", "ac\u0085me", "control"},
		{"right-to-left override", "ac\u202eme", "U+202E"},
		{"right-to-left isolate", "ac\u2067me", "bidi"},
		{"left-to-right mark", "ac\u200eme", "bidi"},
		{"zero width space", "ac\u200bme", "format"},
		{"byte order mark", "\ufeffacme", "format"},
		{"line separator", "ac\u2028me", "separator"},
		{"paragraph separator", "ac\u2029me", "separator"},
		{"noncharacter U+FFFE", "ac\ufffeme", "noncharacter"},
		{"noncharacter U+FDD0", "ac\ufdd0me", "noncharacter"},
		{"noncharacter U+10FFFF", "acme\U0010ffffx", "noncharacter"},
	}
	fields := []struct {
		field string
		ref   func(v string) *pb.CallRef
	}{
		{"call.tenant", func(v string) *pb.CallRef { return call(v, "geo", "c") }},
		{"call.target", func(v string) *pb.CallRef { return call("acme", v, "c") }},
		{"call.call_id", func(v string) *pb.CallRef { return call("acme", "geo", v) }},
		{"call.run_id", func(v string) *pb.CallRef { c := call("acme", "geo", "c"); c.RunId = v; return c }},
	}
	for _, f := range fields {
		for _, b := range bad {
			t.Run(f.field+"/"+b.name, func(t *testing.T) {
				_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: f.ref(b.v), Attempt: 1, Failure: http(503)})
				msg := wantCode(t, err, codes.InvalidArgument)
				if !strings.HasPrefix(msg, f.field+":") || !strings.Contains(msg, b.rule) {
					t.Errorf("message %q, want it to name %s and say %q", msg, f.field, b.rule)
				}
			})
		}
	}
	t.Run("admin tenant", func(t *testing.T) {
		_, err := h.admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "acme\u202e", Capacity: 5}})
		if msg := wantCode(t, err, codes.InvalidArgument); !strings.Contains(msg, "tenant") {
			t.Errorf("message %q does not name the tenant", msg)
		}
	})
	for _, good := range []string{"acme", "acme corp", "café", "東京", "a\u00a0b", "emoji-\U0001f600"} {
		t.Run("served/"+good, func(t *testing.T) {
			if _, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call(good, good, good), Attempt: 1, Failure: http(503)}); err != nil {
				t.Errorf("NextDelay for %q: %v", good, err)
			}
		})
	}
}

// TestAutoTenantsAreCappedApart: over gRPC, undeclared tenants beyond
// MaxAutoTenants get RESOURCE_EXHAUSTED naming the cap, while a declared
// tenant is still admitted.
func TestAutoTenantsAreCappedApart(t *testing.T) {
	h := newHarness(t, func(_ *server.Config, o *breakerstore.Options) { o.MaxAutoTenants = 2 })
	ctx := context.Background()
	nd := func(tenant string) error {
		_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call(tenant, "geo", "c"), Attempt: 1, Failure: http(503)})
		return err
	}
	for _, tenant := range []string{"made-up-1", "made-up-2"} {
		if err := nd(tenant); err != nil {
			t.Fatal(err)
		}
	}
	msg := wantCode(t, nd("made-up-3"), codes.ResourceExhausted)
	if !strings.Contains(msg, "cap 2") || !strings.Contains(msg, "declare") {
		t.Errorf("message %q does not give the cap and the way out", msg)
	}
	if _, err := h.admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "acme", Capacity: 5}}); err != nil {
		t.Fatal(err)
	}
	if err := nd("acme"); err != nil {
		t.Errorf("a declared tenant with the automatic cap full: %v", err)
	}
}

// TestDeclaredTenantsOnly: with DeclaredTenants (--tenants=declared), every
// worker call naming an undeclared tenant is PERMISSION_DENIED with the
// same answer whether or not the tenant has state, and creates nothing.
func TestDeclaredTenantsOnly(t *testing.T) {
	var store *breakerstore.Store
	h := newHarness(t, func(c *server.Config, _ *breakerstore.Options) {
		c.DeclaredTenants = func(tenant string) bool { return store.Declared(tenant) }
	})
	store = h.store
	ctx := context.Background()
	if _, err := h.admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "acme", Capacity: 5}}); err != nil {
		t.Fatal(err)
	}
	// "stale" has state from before the mode was switched on; "ghost" has none.
	if _, err := h.store.SpendRetry(policy.SpendRequest{Tenant: "stale"}); err != nil {
		t.Fatal(err)
	}
	calls := map[string]func(tenant string) error{
		"NextDelay": func(tenant string) error {
			_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call(tenant, "geo", "c"), Attempt: 1, Failure: http(503)})
			return err
		},
		"Admit": func(tenant string) error {
			_, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: call(tenant, "geo", "c"), Attempt: 1})
			return err
		},
		"Classify": func(tenant string) error {
			_, err := h.workers.Classify(ctx, &pb.ClassifyRequest{Call: call(tenant, "geo", ""), Failure: http(503)})
			return err
		},
		"ReportOutcome": func(tenant string) error {
			_, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
				{Call: call("acme", "geo", "c"), Attempt: 1, Success: true},
				{Call: call(tenant, "geo", "c"), Attempt: 1, Success: true}}})
			return err
		},
		"WatchBreakers": func(tenant string) error {
			stream, err := h.workers.WatchBreakers(ctx, &pb.WatchBreakersRequest{Tenant: tenant})
			if err != nil {
				return err
			}
			_, err = stream.Recv()
			return err
		},
	}
	for name, fn := range calls {
		t.Run(name, func(t *testing.T) {
			if err := fn("acme"); err != nil {
				t.Fatalf("a declared tenant: %v", err)
			}
			stale := wantCode(t, fn("stale"), codes.PermissionDenied)
			ghost := wantCode(t, fn("ghost"), codes.PermissionDenied)
			if strings.ReplaceAll(stale, "stale", "X") != strings.ReplaceAll(ghost, "ghost", "X") {
				t.Errorf("answers differ: %q for a tenant with state, %q for one without", stale, ghost)
			}
		})
	}
	resp, err := h.admin.ListBreakers(ctx, &pb.ListBreakersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range resp.GetBreakers() {
		if tn := b.GetKey().GetTenant(); tn != "acme" {
			t.Errorf("a refused call left a breaker of tenant %q", tn)
		}
	}
}
