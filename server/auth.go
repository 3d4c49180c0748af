package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// Auth says who may call what. Credentials are a bearer token in the
// "authorization" metadata ("Bearer <token>") or, over mutual TLS, a client
// certificate that chains to an admin CA.
//
//   - AdminService needs an admin credential: an admin token or an admin
//     certificate. Without one it answers UNAUTHENTICATED (no credential)
//     or PERMISSION_DENIED (a worker credential), unless OpenAdmin is set.
//   - RetryPolicyService is open while TenantTokens is empty. Once tenant
//     tokens exist, a worker call needs one, and may name only that token's
//     tenant: naming another answers PERMISSION_DENIED, whether or not the
//     other tenant or its objects exist. An admin credential may act for any
//     tenant.
//   - Health and reflection are always open.
//
// Tokens are compared in constant time over their SHA-256 digests.
type Auth struct {
	adminTokens  [][32]byte
	tenantTokens map[[32]byte]string
	adminCAs     *x509.CertPool
	openAdmin    bool
	refusals     refusalLog
}

// AuthConfig lists the credentials policyd accepts.
type AuthConfig struct {
	AdminTokens []string
	// TenantTokens maps a worker token to the one tenant it may act for.
	TenantTokens map[string]string
	// AdminCAs, when set, makes a verified client certificate chaining to
	// one of these CAs an admin credential.
	AdminCAs *x509.CertPool
	// OpenAdmin lets anyone call AdminService: a development mode the
	// daemon warns about in its log.
	OpenAdmin bool
	// Logger receives a warning for every refused call (rate-limited, see
	// RefusalLogBurst), naming the peer's address, the method and the
	// answer, never the credential. Default: slog.Default().
	Logger *slog.Logger
	// Clock paces the refusal log. Default: the wall clock.
	Clock Clock
}

// RefusalLogBurst is how many refused calls Auth logs per
// RefusalLogInterval; it counts the rest and logs how many it suppressed
// once the interval is over.
const (
	RefusalLogBurst    = 10
	RefusalLogInterval = time.Minute
)

// NewAuth returns the authenticator for cfg.
func NewAuth(cfg AuthConfig) *Auth {
	a := &Auth{tenantTokens: map[[32]byte]string{}, adminCAs: cfg.AdminCAs, openAdmin: cfg.OpenAdmin,
		refusals: refusalLog{log: cfg.Logger, clock: cfg.Clock}}
	if a.refusals.log == nil {
		a.refusals.log = slog.Default()
	}
	if a.refusals.clock == nil {
		a.refusals.clock = wallClock{}
	}
	for _, t := range cfg.AdminTokens {
		a.adminTokens = append(a.adminTokens, sha256.Sum256([]byte(t)))
	}
	for t, tenant := range cfg.TenantTokens {
		a.tenantTokens[sha256.Sum256([]byte(t))] = tenant
	}
	return a
}

// AdminToken reports whether tok is one of the admin tokens, compared as
// calls' tokens are. It is for other listeners of the daemon (the status
// page) that take the same credential; it is safe for concurrent use.
func (a *Auth) AdminToken(tok string) bool {
	sum := sha256.Sum256([]byte(tok))
	ok := false
	for _, at := range a.adminTokens {
		ok = subtle.ConstantTimeCompare(sum[:], at[:]) == 1 || ok
	}
	return ok
}

// OpenAdmin reports whether admin calls need no credential (AuthConfig.OpenAdmin).
func (a *Auth) OpenAdmin() bool { return a.openAdmin }

// identity is who a call comes from.
type identity struct {
	admin  bool
	tenant string // for a worker token
	known  bool   // any credential at all
}

// identify reads the caller's credentials. A token that is presented but not
// known is an error: it is never treated as no credential.
func (a *Auth) identify(ctx context.Context) (identity, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if vals := md.Get("authorization"); len(vals) > 0 {
			tok, ok := strings.CutPrefix(vals[0], "Bearer ")
			if !ok || tok == "" {
				return identity{}, status.Error(codes.Unauthenticated, "authorization: must be \"Bearer <token>\"")
			}
			sum := sha256.Sum256([]byte(tok))
			for _, at := range a.adminTokens {
				if subtle.ConstantTimeCompare(sum[:], at[:]) == 1 {
					return identity{admin: true, known: true}, nil
				}
			}
			if tenant, ok := a.tenantTokens[sum]; ok {
				return identity{tenant: tenant, known: true}, nil
			}
			return identity{}, status.Error(codes.Unauthenticated, "authorization: unknown token")
		}
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return identity{}, nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return identity{}, nil
	}
	// The handshake verified the certificate: it is a credential, an
	// admin one when it chains to an admin CA.
	return identity{admin: a.adminCert(ti), known: true}, nil
}

// adminCert reports whether the peer's client certificate chains to an
// admin CA.
func (a *Auth) adminCert(ti credentials.TLSInfo) bool {
	if a.adminCAs == nil {
		return false
	}
	leaf := ti.State.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range ti.State.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: a.adminCAs, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err == nil
}

const adminPrefix = "/" + "retrypolicy.v1.AdminService/"

// authorize decides a call to method with request req (nil for a stream
// before its first message), and logs a refusal.
func (a *Auth) authorize(ctx context.Context, method string, req any) error {
	err := a.check(ctx, method, req)
	if err != nil {
		a.refusals.refused(ctx, method, err)
	}
	return err
}

// check decides a call to method with request req.
func (a *Auth) check(ctx context.Context, method string, req any) error {
	switch {
	case strings.HasPrefix(method, "/grpc.health.v1.Health/"), strings.HasPrefix(method, "/grpc.reflection."):
		return nil
	}
	id, err := a.identify(ctx)
	if err != nil {
		return err
	}
	if strings.HasPrefix(method, adminPrefix) {
		switch {
		case id.admin || a.openAdmin:
			return nil
		case id.tenant != "" && method == adminPrefix+"ListRunCalls":
			// A tenant lists its own runs' calls (the run's tenant is
			// checked by the handler: another's is NOT_FOUND).
			if r, ok := req.(*pb.ListRunCallsRequest); ok && r.GetTenant() == id.tenant {
				return nil
			}
			return status.Error(codes.PermissionDenied, "tenant: a tenant token lists only its own tenant's run calls; set tenant to it")
		case id.tenant != "" && method == adminPrefix+"AdviseTargets":
			// A tenant reads the advice on its own targets.
			if r, ok := req.(*pb.AdviseTargetsRequest); ok && r.GetTenant() == id.tenant {
				return nil
			}
			return status.Error(codes.PermissionDenied, "tenant: a tenant token is advised only on its own tenant's targets; set tenant to it")
		case id.known:
			return status.Error(codes.PermissionDenied, "admin calls need an admin credential; worker credentials do not grant them")
		}
		return status.Error(codes.Unauthenticated, "admin calls need an admin credential (a bearer token or an admin client certificate)")
	}
	if id.admin || len(a.tenantTokens) == 0 {
		return nil
	}
	if !id.known {
		return status.Error(codes.Unauthenticated, "worker calls need a tenant token")
	}
	if req == nil {
		return nil
	}
	for _, t := range requestTenants(req) {
		if t != id.tenant {
			return status.Error(codes.PermissionDenied, "tenant "+quoteTenant(t)+": this token acts only for its own tenant")
		}
	}
	return nil
}

// quoteTenant shows a tenant name in a message without echoing bytes that
// would break it.
func quoteTenant(t string) string {
	if len(t) > 64 {
		t = t[:64] + "..."
	}
	return "\"" + strings.ToValidUTF8(t, "?") + "\""
}

// requestTenants lists every tenant a worker request acts for.
func requestTenants(req any) []string {
	switch r := req.(type) {
	case interface{ GetCall() *pb.CallRef }:
		return []string{r.GetCall().GetTenant()}
	case *pb.ReportOutcomeRequest:
		out := make([]string, 0, 1)
		for _, o := range r.GetOutcomes() {
			if t := o.GetCall().GetTenant(); len(out) == 0 || out[len(out)-1] != t {
				out = append(out, t)
			}
		}
		return out
	case *pb.WatchBreakersRequest:
		return []string{r.GetTenant()}
	case *pb.CompleteKeyRequest:
		return []string{r.GetTenant()}
	case *pb.GetKeyRequest:
		return []string{r.GetTenant()}
	}
	return nil
}

func (a *Auth) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := a.authorize(ctx, info.FullMethod, req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func (a *Auth) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := a.authorize(ss.Context(), info.FullMethod, nil); err != nil {
			return err
		}
		return handler(srv, &authStream{ServerStream: ss, a: a, method: info.FullMethod})
	}
}

// authStream checks each message a client streams in.
type authStream struct {
	grpc.ServerStream
	a      *Auth
	method string
}

func (s *authStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.a.authorize(s.Context(), s.method, m)
}

// logOpenAdmin warns that admin calls are open.
func (a *Auth) logOpenAdmin(log *slog.Logger) {
	if a != nil && a.openAdmin {
		log.Warn("admin calls are OPEN to anyone who can reach the listener (--open-admin); use only for development")
	}
}

// refusalLog logs refused calls, at most RefusalLogBurst per
// RefusalLogInterval, and then how many it suppressed. It is safe for
// concurrent use.
type refusalLog struct {
	log   *slog.Logger
	clock Clock

	mu         sync.Mutex
	start      time.Time // of the current interval
	logged     int       // lines logged in it
	suppressed int       // refusals not logged in it
}

// refused logs the refusal err of a call to method, naming the peer's
// address and the answer; the caller's credential never reaches the log.
func (l *refusalLog) refused(ctx context.Context, method string, err error) {
	now := l.clock.Now()
	l.mu.Lock()
	var suppressed int
	if now.Sub(l.start) >= RefusalLogInterval {
		suppressed = l.suppressed
		l.start, l.logged, l.suppressed = now, 0, 0
	}
	ok := l.logged < RefusalLogBurst
	if ok {
		l.logged++
	} else {
		l.suppressed++
	}
	l.mu.Unlock()
	if suppressed > 0 {
		l.log.WarnContext(ctx, "refused calls not logged", "suppressed", suppressed, "interval", RefusalLogInterval.String())
	}
	if !ok {
		return
	}
	addr := "unknown"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	st := status.Convert(err)
	l.log.WarnContext(ctx, "call refused", "peer", addr, "method", method, "code", st.Code().String(), "reason", st.Message())
}
