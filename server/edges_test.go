package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
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
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
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
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
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
