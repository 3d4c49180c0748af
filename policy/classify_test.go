package policy_test

import (
	"testing"

	"github.com/policyd/policyd/policy"
)

func httpF(code int) policy.Failure { return policy.Failure{Kind: policy.FailureHTTP, Code: code} }
func grpcF(code int) policy.Failure { return policy.Failure{Kind: policy.FailureGRPC, Code: code} }
func transportF(k policy.TransportKind) policy.Failure {
	return policy.Failure{Kind: policy.FailureTransport, Transport: k}
}
func localF(k policy.LocalKind) policy.Failure {
	return policy.Failure{Kind: policy.FailureLocal, Local: k}
}

var (
	transient = func(reason string) policy.Classification {
		return policy.Classification{Retryable: true, Category: policy.CategoryTransient, Reason: reason}
	}
	terminal = func(reason string) policy.Classification {
		return policy.Classification{Category: policy.CategoryTerminal, Reason: reason}
	}
	unclassified = func(reason string) policy.Classification {
		return policy.Classification{Category: policy.CategoryUnclassified, Reason: reason}
	}
	unsafe = policy.Classification{Category: policy.CategoryTransient, Reason: policy.ReasonNotIdempotent}
)

func TestClassifyDefaults(t *testing.T) {
	p := policy.Default()
	tests := []struct {
		name    string
		failure policy.Failure
		want    policy.Classification
	}{
		{"http 429", httpF(429), transient("transient:429")},
		{"http 500", httpF(500), transient("transient:500")},
		{"http 502", httpF(502), transient("transient:502")},
		{"http 503", httpF(503), transient("transient:503")},
		{"http 504", httpF(504), transient("transient:504")},
		{"http 400", httpF(400), terminal("terminal:400")},
		{"http 401", httpF(401), terminal("terminal:401")},
		{"http 403", httpF(403), terminal("terminal:403")},
		{"http 404", httpF(404), terminal("terminal:404")},
		{"http 422", httpF(422), terminal("terminal:422")},
		{"http 418 in neither table", httpF(418), unclassified("unclassified:418")},
		{"http 501 in neither table", httpF(501), unclassified("unclassified:501")},
		{"http 100 lowest", httpF(100), unclassified("unclassified:100")},
		{"http 599 highest", httpF(599), unclassified("unclassified:599")},
		{"http 42 out of range", httpF(42), unclassified("unclassified:42")},
		{"http 700 out of range", httpF(700), unclassified("unclassified:700")},
		{"http -1", httpF(-1), unclassified("unclassified:-1")},
		{"grpc 1 canceled", grpcF(1), terminal("terminal:grpc_canceled")},
		{"grpc 2 unknown", grpcF(2), terminal("terminal:grpc_unknown")},
		{"grpc 3 invalid_argument", grpcF(3), terminal("terminal:grpc_invalid_argument")},
		{"grpc 4 deadline_exceeded", grpcF(4), transient("transient:grpc_deadline_exceeded")},
		{"grpc 5 not_found", grpcF(5), terminal("terminal:grpc_not_found")},
		{"grpc 6 already_exists", grpcF(6), terminal("terminal:grpc_already_exists")},
		{"grpc 7 permission_denied", grpcF(7), terminal("terminal:grpc_permission_denied")},
		{"grpc 8 resource_exhausted", grpcF(8), transient("transient:grpc_resource_exhausted")},
		{"grpc 9 failed_precondition", grpcF(9), terminal("terminal:grpc_failed_precondition")},
		{"grpc 10 aborted", grpcF(10), transient("transient:grpc_aborted")},
		{"grpc 11 out_of_range", grpcF(11), terminal("terminal:grpc_out_of_range")},
		{"grpc 12 unimplemented", grpcF(12), terminal("terminal:grpc_unimplemented")},
		{"grpc 13 internal", grpcF(13), terminal("terminal:grpc_internal")},
		{"grpc 14 unavailable", grpcF(14), transient("transient:grpc_unavailable")},
		{"grpc 15 data_loss", grpcF(15), terminal("terminal:grpc_data_loss")},
		{"grpc 16 unauthenticated", grpcF(16), terminal("terminal:grpc_unauthenticated")},
		{"grpc 0 ok is not a failure", grpcF(0), unclassified("unclassified:grpc_0")},
		{"grpc 17 unknown", grpcF(17), unclassified("unclassified:grpc_17")},
		{"grpc -3 unknown", grpcF(-3), unclassified("unclassified:grpc_-3")},
		{"transport timeout", transportF(policy.TransportTimeout), transient("transport:timeout")},
		{"transport reset", transportF(policy.TransportConnectionReset), transient("transport:connection_reset")},
		{"transport refused", transportF(policy.TransportConnectionRefused), transient("transport:connection_refused")},
		{"transport dns", transportF(policy.TransportDNS), transient("transport:dns")},
		{"transport tls", transportF(policy.TransportTLS), terminal("transport:tls")},
		{"transport unspecified", transportF(policy.TransportUnspecified), unclassified("unclassified:transport")},
		{"transport unknown", transportF(99), unclassified("unclassified:transport")},
		{"local parse", localF(policy.LocalParse), terminal("local:parse")},
		{"local validation", localF(policy.LocalValidation), terminal("local:validation")},
		{"local unspecified", localF(policy.LocalUnspecified), unclassified("unclassified:local")},
		{"kind unspecified", policy.Failure{}, unclassified("unclassified:unspecified")},
		{"kind unknown", policy.Failure{Kind: 42, Code: 503}, unclassified("unclassified:unspecified")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := policy.Classify(&p, tt.failure, true, false)
			if got != tt.want {
				t.Errorf("Classify(%+v) = %+v, want %+v", tt.failure, got, tt.want)
			}
		})
	}
}

func TestClassifyIdempotency(t *testing.T) {
	p := policy.Default()
	tests := []struct {
		name       string
		failure    policy.Failure
		idempotent bool
		key        bool
		want       policy.Classification
	}{
		{"503 not idempotent without key", httpF(503), false, false, unsafe},
		{"503 not idempotent with key", httpF(503), false, true, transient("transient:503")},
		{"503 idempotent", httpF(503), true, false, transient("transient:503")},
		{"429 not idempotent without key", httpF(429), false, false, unsafe},
		{"grpc unavailable not idempotent", grpcF(14), false, false, unsafe},
		{"timeout not idempotent", transportF(policy.TransportTimeout), false, false, unsafe},
		{"reset not idempotent", transportF(policy.TransportConnectionReset), false, false, unsafe},
		{"refused never sent", transportF(policy.TransportConnectionRefused), false, false, transient("transport:connection_refused")},
		{"dns never sent", transportF(policy.TransportDNS), false, false, transient("transport:dns")},
		{"terminal stays terminal", httpF(422), false, false, terminal("terminal:422")},
		{"unclassified stays unclassified", httpF(418), false, false, unclassified("unclassified:418")},
		{"tls stays terminal", transportF(policy.TransportTLS), false, false, terminal("transport:tls")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := policy.Classify(&p, tt.failure, tt.idempotent, tt.key)
			if got != tt.want {
				t.Errorf("Classify(%+v, idempotent=%v, key=%v) = %+v, want %+v", tt.failure, tt.idempotent, tt.key, got, tt.want)
			}
		})
	}
}

func TestClassifyOverrides(t *testing.T) {
	custom := policy.Default()
	custom.TransientHTTP = []int{418, 409}
	custom.TerminalHTTP = []int{503}
	custom.TransientGRPC = []int{2}
	empty := policy.Default()
	empty.TransientHTTP, empty.TerminalHTTP, empty.TransientGRPC = nil, nil, nil
	tests := []struct {
		name    string
		p       *policy.Policy
		failure policy.Failure
		want    policy.Classification
	}{
		{"418 made transient", &custom, httpF(418), transient("transient:418")},
		{"409 made transient", &custom, httpF(409), transient("transient:409")},
		{"503 made terminal", &custom, httpF(503), terminal("terminal:503")},
		{"500 no longer in a table", &custom, httpF(500), unclassified("unclassified:500")},
		{"422 no longer in a table", &custom, httpF(422), unclassified("unclassified:422")},
		{"grpc unknown made transient", &custom, grpcF(2), transient("transient:grpc_unknown")},
		{"grpc unavailable made terminal", &custom, grpcF(14), terminal("terminal:grpc_unavailable")},
		{"empty tables classify nothing", &empty, httpF(503), unclassified("unclassified:503")},
		{"empty grpc table", &empty, grpcF(14), terminal("terminal:grpc_unavailable")},
		{"nil policy means default", nil, httpF(503), transient("transient:503")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := policy.Classify(tt.p, tt.failure, true, false)
			if got != tt.want {
				t.Errorf("Classify(%+v) = %+v, want %+v", tt.failure, got, tt.want)
			}
		})
	}
}

func TestClassifyDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	p := policy.Default()
	failures := []policy.Failure{httpF(503), httpF(418), grpcF(5), grpcF(0), transportF(policy.TransportDNS), localF(policy.LocalParse)}
	for _, f := range failures {
		got := testing.AllocsPerRun(100, func() { _ = policy.Classify(&p, f, false, false) })
		if got != 0 {
			t.Errorf("Classify(%+v) allocs = %v, want 0", f, got)
		}
	}
}
