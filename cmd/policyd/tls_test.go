package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// testCA issues certificates for the TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a PEM certificate and key for a server (IP SAN 127.0.0.1)
// or a client.
func (ca *testCA) issue(t *testing.T, name string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMutualTLS: only client certificates of the workers' CA get through
// the handshake; one from the admin CA is an admin credential.
func TestMutualTLS(t *testing.T) {
	dir := t.TempDir()
	workersCA, adminCA, rogueCA := newCA(t, "workers"), newCA(t, "admins"), newCA(t, "rogue")
	srvCert, srvKey := workersCA.issue(t, "policyd", true)
	d := startDaemon(t, filepath.Join(dir, "policyd.db"),
		"--tls-cert", writeFile(t, dir, "srv.pem", srvCert), "--tls-key", writeFile(t, dir, "srv.key", srvKey),
		"--client-ca", writeFile(t, dir, "workers-ca.pem", workersCA.pem),
		"--admin-ca", writeFile(t, dir, "admin-ca.pem", adminCA.pem))

	roots := x509.NewCertPool()
	roots.AddCert(workersCA.cert)
	dial := func(ca *testCA, name string) *grpc.ClientConn {
		certPEM, keyPEM := ca.issue(t, name, false)
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	worker := dial(workersCA, "worker-1")
	if _, err := healthpb.NewHealthClient(worker).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("health over mTLS with a workers' certificate: %v; daemon said: %s", err, d.stderr)
	}
	if _, err := pb.NewRetryPolicyServiceClient(worker).Classify(ctx, &pb.ClassifyRequest{
		Call: &pb.CallRef{Tenant: "acme", Target: "geo"}, Failure: &pb.Failure{Kind: &pb.Failure_HttpStatus{HttpStatus: 503}}}); err != nil {
		t.Errorf("Classify with a workers' certificate: %v", err)
	}
	_, err := pb.NewAdminServiceClient(worker).ListBreakers(ctx, &pb.ListBreakersRequest{})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("admin call with a workers' certificate: got %v, want PERMISSION_DENIED", err)
	}

	admin := dial(adminCA, "operator")
	if _, err := pb.NewAdminServiceClient(admin).ListBreakers(ctx, &pb.ListBreakersRequest{}); err != nil {
		t.Errorf("admin call with an admin certificate: %v", err)
	}

	rogue := dial(rogueCA, "intruder")
	short, cancelShort := context.WithTimeout(ctx, 5*time.Second)
	defer cancelShort()
	_, err = healthpb.NewHealthClient(rogue).Check(short, &healthpb.HealthCheckRequest{})
	if err == nil {
		t.Fatal("a certificate from the wrong CA passed the handshake")
	}
	if c := status.Code(err); c != codes.Unavailable {
		t.Errorf("wrong CA: got %v, want the handshake to fail (UNAVAILABLE)", err)
	}
}

// TestAdminCallsNeedTheTokenByDefault: a plain daemon creates an admin token
// and refuses admin calls without it.
func TestAdminCallsNeedTheTokenByDefault(t *testing.T) {
	db := filepath.Join(t.TempDir(), "policyd.db")
	d := startDaemon(t, db)
	d.conn(t) // wait until SERVING
	conn, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecureCreds()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = pb.NewAdminServiceClient(conn).ListBreakers(context.Background(), &pb.ListBreakersRequest{})
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("admin call without a token: got %v, want UNAUTHENTICATED", err)
	}
	info, err := os.Stat(db + ".admin-token")
	if err != nil {
		t.Fatalf("admin token file: %v", err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("admin token file mode: got %v, want 0600", info.Mode().Perm())
	}
	// The CLI finds the token next to the database.
	out, err := runCLI(t, filepath.Dir(db), "breakers", "--addr", d.addr, "--token-file", db+".admin-token")
	if err != nil {
		t.Errorf("policyd breakers with the token: %v: %s", err, out)
	}
}
