package main

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestCheckExposure: a --listen other than loopback without TLS is refused
// unless --insecure-listen accepts it with a warning; a --metrics-listen
// other than loopback is served with a warning.
func TestCheckExposure(t *testing.T) {
	tests := []struct {
		name           string
		cfg            securityConfig
		listen         string
		metrics        string
		wantErr        bool
		wantWarning    string
		wantNoWarnings bool
	}{
		{"loopback v4", securityConfig{}, "127.0.0.1:50051", "", false, "", true},
		{"loopback v6", securityConfig{}, "[::1]:50051", "", false, "", true},
		{"localhost", securityConfig{}, "localhost:50051", "127.0.0.1:9090", false, "", true},
		{"every interface", securityConfig{}, "0.0.0.0:50051", "", true, "", false},
		{"empty host is every interface", securityConfig{}, ":50051", "", true, "", false},
		{"v6 every interface", securityConfig{}, "[::]:50051", "", true, "", false},
		{"a host name", securityConfig{}, "policyd.internal:50051", "", true, "", false},
		{"with TLS", securityConfig{TLSCert: "c.pem", TLSKey: "k.pem"}, "0.0.0.0:50051", "", false, "", true},
		{"accepted with --insecure-listen", securityConfig{InsecureListen: true}, "0.0.0.0:50051", "", false, "--insecure-listen", false},
		{"metrics on every interface", securityConfig{}, "127.0.0.1:50051", ":9090", false, "metrics served on an address other than loopback", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			err := tt.cfg.checkExposure(tt.listen, tt.metrics, slog.New(slog.NewTextHandler(&logs, nil)))
			if (err != nil) != tt.wantErr {
				t.Fatalf("checkExposure(%q, %q) = %v, want error %v", tt.listen, tt.metrics, err, tt.wantErr)
			}
			if err != nil && (!strings.Contains(err.Error(), "--listen "+tt.listen) || !strings.Contains(err.Error(), "--insecure-listen")) {
				t.Errorf("error %q names neither the address nor --insecure-listen", err)
			}
			if tt.wantWarning != "" && (!strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), tt.wantWarning)) {
				t.Errorf("log %q has no warning with %q", logs.String(), tt.wantWarning)
			}
			if tt.wantNoWarnings && logs.Len() > 0 {
				t.Errorf("log %q, want nothing", logs.String())
			}
		})
	}
}

// TestNonLoopbackListenWithoutTLSRefusesToStart: the daemon exits non-zero
// before it listens, naming the flag to give.
func TestNonLoopbackListenWithoutTLSRefusesToStart(t *testing.T) {
	db := filepath.Join(t.TempDir(), "policyd.db")
	_, port, _ := net.SplitHostPort(freeAddr(t))
	d := startDaemon(t, db, "--listen", "0.0.0.0:"+port) // the last --listen wins
	if err := d.wait(t); err == nil {
		t.Fatal("daemon on 0.0.0.0 without TLS exited 0, want a refusal")
	}
	if out := d.stderr.String(); !strings.Contains(out, "--insecure-listen") || !strings.Contains(out, "0.0.0.0:"+port) {
		t.Errorf("daemon said %q, want the address and --insecure-listen named", out)
	}
}

// TestCredentialFilesAreChecked: token files open to group or others, a
// tenant token equal to the admin token and a token shared by two tenants
// are refused at start with a message naming the file.
func TestCredentialFilesAreChecked(t *testing.T) {
	tests := []struct {
		name      string
		admin     string      // the admin token file's content, "" for the daemon's own
		adminMode os.FileMode // of that file
		tenants   string
		mode      os.FileMode // of the tenant tokens file
		args      []string
		want      string // in the refusal; "" for a start
		warning   string // in the log of a start
	}{
		{"tenant tokens readable by others", "", 0, "acme tok-a\n", 0o644, nil, "tenant-tokens: open to group or others (mode 0644)", ""},
		{"tenant tokens readable by the group", "", 0, "acme tok-a\n", 0o640, nil, "tenant-tokens: open to group or others (mode 0640)", ""},
		{"admin token readable by others", "admin-tok\n", 0o644, "acme tok-a\n", 0o600, nil, "policyd.db.admin-token: open to group or others (mode 0644)", ""},
		{"tenant token equal to the admin token", "admin-tok\n", 0o600, "acme tok-a\nevil admin-tok\n", 0o600, nil,
			`tenant-tokens: the token of tenant "evil" is the admin token`, ""},
		{"two tenants with one token", "", 0, "acme tok-a\nglobex tok-a\n", 0o600, nil,
			`tenant-tokens:2: tenant "globex" has the token of tenant "acme" (line 1)`, ""},
		{"accepted with --insecure-files", "admin-tok\n", 0o644, "acme tok-a\n", 0o644, []string{"--insecure-files"}, "",
			"credential file open to group or others (--insecure-files)"},
		{"private files", "admin-tok\n", 0o600, "acme tok-a\n", 0o600, nil, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			db := filepath.Join(dir, "policyd.db")
			if tt.admin != "" {
				writeMode(t, db+".admin-token", tt.admin, tt.adminMode)
			}
			tokens := filepath.Join(dir, "tenant-tokens")
			writeMode(t, tokens, tt.tenants, tt.mode)
			d := startDaemon(t, db, append([]string{"--tenant-tokens-file", tokens}, tt.args...)...)
			if tt.want != "" {
				if err := d.wait(t); err == nil {
					t.Fatal("daemon exited 0, want a refusal")
				}
				if out := d.stderr.String(); !strings.Contains(out, tt.want) {
					t.Errorf("daemon said %q, want %q", out, tt.want)
				}
				return
			}
			d.conn(t)
			if tt.warning != "" && strings.Count(d.stderr.String(), tt.warning) != 2 {
				t.Errorf("daemon log %q: want %q once per file", d.stderr, tt.warning)
			}
		})
	}
}

// writeMode writes a file with exactly mode perm, whatever the umask.
func writeMode(t *testing.T, path, content string, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
}

// TestHeaderListIsBounded: a call whose metadata exceeds
// --max-header-list-bytes (16 KiB by default) is refused; a larger bound
// lets it through.
func TestHeaderListIsBounded(t *testing.T) {
	big := strings.Repeat("x", 64<<10)
	classify := func(conn *grpc.ClientConn, header string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, "x-padding", header)
		_, err := pb.NewRetryPolicyServiceClient(conn).Classify(ctx, &pb.ClassifyRequest{
			Call: &pb.CallRef{Tenant: "acme", Target: "geo"}, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}})
		return err
	}
	d := startDaemon(t, filepath.Join(t.TempDir(), "policyd.db"))
	conn := d.conn(t)
	if err := classify(conn, "small"); err != nil {
		t.Fatalf("a small header: %v", err)
	}
	if err := classify(conn, big); err == nil {
		t.Error("a 64 KiB header list was accepted with the default bound of 16 KiB")
	}
	if err := classify(conn, "small"); err != nil {
		t.Errorf("a small header after a refused one: %v", err)
	}

	wide := startDaemon(t, filepath.Join(t.TempDir(), "policyd.db"), "--max-header-list-bytes", "131072")
	if err := classify(wide.conn(t), big); err != nil {
		t.Errorf("a 64 KiB header list with --max-header-list-bytes 131072: %v", err)
	}
}
