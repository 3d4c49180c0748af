package server

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const workersPrefix = "/" + "retrypolicy.v1.RetryPolicyService/"

// tenantGate refuses worker calls naming a tenant that declared rejects
// (Config.DeclaredTenants). Every undeclared tenant gets the same answer,
// whether or not it has state, so the gate tells a caller nothing about
// which tenants exist.
type tenantGate struct {
	declared func(tenant string) bool
}

// check refuses req when it names an undeclared tenant. The empty tenant
// (a watch of every tenant) is left to Auth.
func (g tenantGate) check(method string, req any) error {
	if !strings.HasPrefix(method, workersPrefix) {
		return nil
	}
	for _, t := range requestTenants(req) {
		if t != "" && !g.declared(t) {
			return status.Error(codes.PermissionDenied, "tenant "+quoteTenant(t)+
				": not a declared tenant (--tenants=declared); declare it with a budget (SetTenantBudget or the policy file)")
		}
	}
	return nil
}

func (g tenantGate) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := g.check(info.FullMethod, req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func (g tenantGate) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, &gatedStream{ServerStream: ss, g: g, method: info.FullMethod})
	}
}

// gatedStream checks each message a client streams in.
type gatedStream struct {
	grpc.ServerStream
	g      tenantGate
	method string
}

func (s *gatedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.g.check(s.method, m)
}
