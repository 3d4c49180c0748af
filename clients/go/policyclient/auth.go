package policyclient

import (
	"context"

	"google.golang.org/grpc/credentials"
)

// BearerToken returns per-RPC credentials that send token as
// "authorization: Bearer <token>", the form policyd's tenant and admin
// tokens take. Pass it to grpc.WithPerRPCCredentials, or set Config.Token
// and use Dial. It is sent over plaintext connections too, so policyd's
// loopback default works; use TLS for anything else.
func BearerToken(token string) credentials.PerRPCCredentials { return bearer(token) }

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }
