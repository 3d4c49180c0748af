package policyclient

import (
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/health" // client-side health checking, named in ServiceConfig
	"google.golang.org/grpc/resolver"
)

// ServiceConfig is the gRPC service config Dial and DialReplicas give the
// connection; pass it with grpc.WithDefaultServiceConfig to a connection
// made for New. It spreads calls over every replica the target resolves to
// (round_robin), sends none to a replica whose grpc.health.v1 status is not
// SERVING (policyd turns NOT_SERVING when it starts to drain), and sends a
// decision that failed with UNAVAILABLE (its replica died or drained under
// it) again, to the next replica, within the same decision timeout.
//
// Only the RPCs that may run twice are sent again: NextDelay (policyd
// replays the answer of an attempt it already decided), Classify and
// PlanBudget (no side effects), Admit, whose second try can at worst
// hold a HALF_OPEN probe permit that is never settled; permits expire, and
// no more than N are handed out; ClaimKey, whose second try can at worst
// find the lease the first one took (IN_FLIGHT, then UNKNOWN once it
// expires: the call is dead-lettered, never written twice), which is
// safer than the attempt going on without the idempotency ledger; and
// CompleteKey, whose second try after a first that was applied is refused
// (FAILED_PRECONDITION: the client counts the outcome unrecorded).
// ReportOutcome is not: the client keeps a batch that failed and sends it
// again itself. WatchBreakers reconnects by itself, with the resume token
// of the last message it applied: replicas of a Redis store go on from
// there, on any replica, without a gap; a store that cannot resume starts
// again from a snapshot.
const ServiceConfig = `{
  "loadBalancingConfig": [{"round_robin": {}}],
  "healthCheckConfig": {"serviceName": ""},
  "methodConfig": [{
    "name": [
      {"service": "retrypolicy.v1.RetryPolicyService", "method": "NextDelay"},
      {"service": "retrypolicy.v1.RetryPolicyService", "method": "Admit"},
      {"service": "retrypolicy.v1.RetryPolicyService", "method": "Classify"},
      {"service": "retrypolicy.v1.RetryPolicyService", "method": "PlanBudget"},
      {"service": "retrypolicy.v1.RetryPolicyService", "method": "ClaimKey"},
      {"service": "retrypolicy.v1.RetryPolicyService", "method": "CompleteKey"}
    ],
    "retryPolicy": {
      "maxAttempts": 4,
      "initialBackoff": "0.005s",
      "maxBackoff": "0.05s",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`

// DialReplicas connects to the policyd replicas at addrs (host:port each)
// and returns a Client that owns the connection, as Dial does for one
// address: calls are spread over the replicas that are up and SERVING (see
// ServiceConfig), and a replica that dies or drains is left for the others.
// With TLS, each replica's certificate must name its host. For replicas
// behind one DNS name, Dial("dns:///name:port", ...) does the same.
func DialReplicas(addrs []string, cfg Config, opts ...grpc.DialOption) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("policyclient: DialReplicas: no address given")
	}
	st := resolver.State{}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("policyclient: DialReplicas: address %q is not host:port: %v", a, err)
		}
		// ServerName: each replica is its own authority (and, with TLS,
		// the name its certificate must carry), as with Dial(a).
		st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a, ServerName: a}}})
	}
	b := &replicaList{state: st}
	return Dial(replicaScheme+":///replicas", cfg, append([]grpc.DialOption{grpc.WithResolvers(b)}, opts...)...)
}

// replicaScheme names the resolver of DialReplicas' fixed address list.
const replicaScheme = "policyd-replicas"

// replicaList resolves to a fixed list of replicas; it is its own
// resolver, as the list never changes.
type replicaList struct{ state resolver.State }

func (r *replicaList) Build(_ resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	// An error here is the balancer's to report (on the RPCs), as with
	// grpc-go's passthrough resolver.
	_ = cc.UpdateState(r.state)
	return r, nil
}

func (r *replicaList) Scheme() string                        { return replicaScheme }
func (r *replicaList) ResolveNow(resolver.ResolveNowOptions) {}
func (r *replicaList) Close()                                {}
