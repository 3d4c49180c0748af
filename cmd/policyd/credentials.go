package main

import (
	"bufio"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/policyd/policyd/server"
)

// securityConfig is what the security flags of `policyd serve` say.
type securityConfig struct {
	TLSCert, TLSKey  string
	ClientCA         string
	AdminCA          string
	AdminTokenFile   string
	TenantTokensFile string
	OpenAdmin        bool
	InsecureFiles    bool
	InsecureListen   bool
}

func (c *securityConfig) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&c.TLSCert, "tls-cert", "", "serve TLS with this certificate (PEM); needs --tls-key")
	f.StringVar(&c.TLSKey, "tls-key", "", "the private key of --tls-cert (PEM)")
	f.StringVar(&c.ClientCA, "client-ca", "", "require client certificates signed by this CA (PEM): mutual TLS")
	f.StringVar(&c.AdminCA, "admin-ca", "", "client certificates signed by this CA (PEM) are admin credentials; implies mutual TLS")
	f.StringVar(&c.AdminTokenFile, "admin-token-file", "", "file holding the admin bearer token (default: <db>.admin-token, created with a random token on first start)")
	f.StringVar(&c.TenantTokensFile, "tenant-tokens-file", "", "file of worker tokens, one \"tenant token\" pair a line; when set, worker calls need a token and act only for its tenant")
	f.BoolVar(&c.OpenAdmin, "open-admin", false, "development only: admin calls need no credential (logged as a warning)")
	f.BoolVar(&c.InsecureFiles, "insecure-files", false, "accept token files that group or others may read or write (logged as a warning at every start)")
	f.BoolVar(&c.InsecureListen, "insecure-listen", false, "accept a --listen address other than loopback without TLS (logged as a warning at every start)")
}

// checkExposure refuses a --listen address other than loopback without
// TLS, unless --insecure-listen accepts it with a warning, and warns about
// a --metrics-listen address other than loopback: the metrics name tenants
// and targets.
func (c *securityConfig) checkExposure(listen, metricsListen string, log *slog.Logger) error {
	if !loopback(listen) && c.TLSCert == "" {
		if !c.InsecureListen {
			return fmt.Errorf("--listen %s: not a loopback address, and without TLS tokens and decisions cross the network in clear; "+
				"give --tls-cert and --tls-key, or --insecure-listen to accept it", listen)
		}
		log.Warn("serving without TLS on an address other than loopback (--insecure-listen): tokens and decisions cross the network in clear",
			"listen", listen)
	}
	if metricsListen != "" && !loopback(metricsListen) {
		log.Warn("metrics served on an address other than loopback: they name tenants and targets", "metrics_listen", metricsListen)
	}
	return nil
}

// loopback reports whether a host:port address listens on loopback only:
// "localhost" or a loopback IP. An empty host (every interface) is not.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkPrivate refuses a credential file that group or others may read or
// write, unless --insecure-files accepts it with a warning.
func (c *securityConfig) checkPrivate(path string, log *slog.Logger) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		if !c.InsecureFiles {
			return fmt.Errorf("%s: open to group or others (mode %04o); chmod 600 it, or pass --insecure-files", path, perm)
		}
		log.Warn("credential file open to group or others (--insecure-files)", "file", path, "mode", fmt.Sprintf("%04o", perm))
	}
	return nil
}

// auth loads the credentials the flags name. Unless --open-admin is set,
// an admin token always exists: the named file, or <db>.admin-token, which
// is created (mode 0600) with a random token when missing. created names
// the token file auth made, empty when it made none: the caller removes it
// if the daemon then fails to start, so a failed start leaves no token.
func (c *securityConfig) auth(db string, log *slog.Logger) (_ *server.Auth, created string, err error) {
	a, created, err := c.loadAuth(db, log)
	if err != nil && created != "" {
		os.Remove(created)
		created = ""
	}
	return a, created, err
}

func (c *securityConfig) loadAuth(db string, log *slog.Logger) (_ *server.Auth, created string, _ error) {
	cfg := server.AuthConfig{OpenAdmin: c.OpenAdmin, Logger: log}
	adminPath := ""
	if !c.OpenAdmin || c.AdminTokenFile != "" {
		path := c.AdminTokenFile
		if path == "" {
			path = db + ".admin-token"
			made, err := ensureToken(path)
			if err != nil {
				return nil, "", fmt.Errorf("--admin-token-file: %w", err)
			}
			if made {
				created = path
			}
		}
		if err := c.checkPrivate(path, log); err != nil {
			return nil, created, fmt.Errorf("--admin-token-file: %w", err)
		}
		tok, err := readToken(path)
		if err != nil {
			return nil, created, fmt.Errorf("--admin-token-file: %w", err)
		}
		cfg.AdminTokens, adminPath = []string{tok}, path
	}
	if c.TenantTokensFile != "" {
		if err := c.checkPrivate(c.TenantTokensFile, log); err != nil {
			return nil, created, fmt.Errorf("--tenant-tokens-file: %w", err)
		}
		m, err := readTenantTokens(c.TenantTokensFile)
		if err != nil {
			return nil, created, fmt.Errorf("--tenant-tokens-file: %w", err)
		}
		for _, admin := range cfg.AdminTokens {
			if tenant, ok := m[admin]; ok {
				return nil, created, fmt.Errorf("--tenant-tokens-file: %s: the token of tenant %q is the admin token of %s, which would make that tenant an admin; give it a token of its own",
					c.TenantTokensFile, tenant, adminPath)
			}
		}
		cfg.TenantTokens = m
	}
	if c.AdminCA != "" {
		pool, err := loadPool(c.AdminCA)
		if err != nil {
			return nil, created, fmt.Errorf("--admin-ca: %w", err)
		}
		cfg.AdminCAs = pool
	}
	return server.NewAuth(cfg), created, nil
}

// serverOptions returns the transport credentials the flags ask for.
func (c *securityConfig) serverOptions() ([]grpc.ServerOption, error) {
	if c.TLSCert == "" && c.TLSKey == "" {
		if c.ClientCA != "" || c.AdminCA != "" {
			return nil, errors.New("--client-ca and --admin-ca need --tls-cert and --tls-key")
		}
		return nil, nil
	}
	if c.TLSCert == "" || c.TLSKey == "" {
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.ClientCA != "" || c.AdminCA != "" {
		pool := x509.NewCertPool()
		for _, f := range []struct{ flag, path string }{{"--client-ca", c.ClientCA}, {"--admin-ca", c.AdminCA}} {
			if f.path == "" {
				continue
			}
			pem, err := os.ReadFile(f.path)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f.flag, err)
			}
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("%s: no PEM certificate in %s", f.flag, f.path)
			}
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(cfg))}, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no PEM certificate in %s", path)
	}
	return pool, nil
}

// ensureToken creates path with a random token unless it exists. The
// file appears whole: the token is written to a temporary file beside it,
// which is then linked to path (a link, unlike a rename, fails when path
// exists). Replicas started at once in one directory then share one
// token, the first one's, and none reads a file made but not yet
// written. On a file system without hard links the file is made in
// place, as before.
func ensureToken(path string) (created bool, err error) {
	if _, err := os.Lstat(path); err == nil {
		return false, nil
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return false, err
	}
	line := hex.EncodeToString(b[:]) + "\n"
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*") // mode 0600
	if err != nil {
		return false, err
	}
	defer os.Remove(f.Name())
	if err := writeClose(f, line); err != nil {
		return false, err
	}
	switch err := os.Link(f.Name(), path); {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrExist):
		return false, nil
	}
	return writeNew(path, line)
}

// writeNew creates path (mode 0600) holding line unless it exists.
func writeNew(path, line string) (created bool, err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	err = writeClose(f, line)
	return err == nil, err
}

// writeClose writes line to f and closes it: the first error of the two.
func writeClose(f *os.File, line string) error {
	_, err := f.WriteString(line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// readToken reads a token file: its first line, trimmed.
func readToken(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok, _, _ := strings.Cut(strings.TrimSpace(string(raw)), "\n")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", fmt.Errorf("%s holds no token", path)
	}
	return tok, nil
}

// readTenantTokens reads "tenant token" lines; # starts a comment.
func readTenantTokens(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]string{}
	lines := map[string]int{} // token -> the line that gave it
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
			continue
		case len(fields) != 2:
			return nil, fmt.Errorf("%s:%d: want \"tenant token\", got %d fields", path, n, len(fields))
		}
		if other, dup := m[fields[1]]; dup {
			return nil, fmt.Errorf("%s:%d: tenant %q has the token of tenant %q (line %d); every tenant needs a token of its own",
				path, n, fields[0], other, lines[fields[1]])
		}
		m[fields[1]], lines[fields[1]] = fields[0], n
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return m, nil
}
