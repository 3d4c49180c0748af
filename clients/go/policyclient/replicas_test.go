package policyclient_test

import (
	"strings"
	"testing"

	"github.com/policyd/policyd/clients/go/policyclient"
)

// TestDialReplicasRefusesABadList: an empty list, or an address that is
// not host:port, is refused before anything is dialled, naming the rule.
func TestDialReplicasRefusesABadList(t *testing.T) {
	tests := []struct {
		name  string
		addrs []string
		want  string
	}{
		{"no address", nil, "no address given"},
		{"no port", []string{"127.0.0.1:50051", "127.0.0.1"}, `address "127.0.0.1" is not host:port`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := policyclient.DialReplicas(tc.addrs, policyclient.Config{Tenant: "acme"})
			if err == nil {
				c.Close(t.Context())
				t.Fatalf("got a client, want an error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %q, want it to contain %q", err, tc.want)
			}
		})
	}
}
