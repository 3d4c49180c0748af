package server_test

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// unaryRPC calls one handler with a request decoded from raw bytes.
type unaryRPC struct {
	name string
	call func(ctx context.Context, raw []byte) error
}

// rpcTable lists every unary method of both services, called through the
// generated handlers as the gRPC server calls them.
func rpcTable(d *server.Decisions, a *server.Admin) []unaryRPC {
	var out []unaryRPC
	for _, svc := range []struct {
		desc *grpc.ServiceDesc
		impl any
	}{{&pb.RetryPolicyService_ServiceDesc, d}, {&pb.AdminService_ServiceDesc, a}} {
		for _, m := range svc.desc.Methods {
			handler, impl := m.Handler, svc.impl
			out = append(out, unaryRPC{svc.desc.ServiceName + "/" + m.MethodName, func(ctx context.Context, raw []byte) error {
				undecodable := false
				_, err := handler(impl, ctx, func(v any) error {
					if err := proto.Unmarshal(raw, v.(proto.Message)); err != nil {
						undecodable = true // the server's codec answers these INVALID_ARGUMENT
						return err
					}
					return nil
				}, nil)
				if undecodable {
					return nil
				}
				return err
			}})
		}
	}
	return out
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// FuzzRequests feeds raw bytes to every handler: none may panic, and none
// may answer UNKNOWN or INTERNAL.
func FuzzRequests(f *testing.F) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	seeds := []proto.Message{
		&pb.ClassifyRequest{Call: call("a", "t", ""), Failure: http(503)},
		&pb.NextDelayRequest{Call: call("a", "t", "c"), Attempt: 2, Failure: http(429), Pushback: &pb.Pushback{RetryAfter: "Sun, 06 Nov 1994 08:49:37 GMT"}},
		&pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "a", Target: "t", CallId: "c", RunId: "r"}, Attempt: 1, Failure: transport(1)},
		&pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: call("a", "t", "c"), Attempt: 1, Success: true}}},
		&pb.AdmitRequest{Call: call("a", "t", "c"), Attempt: 1},
		&pb.PlanBudgetRequest{Window: durationpb.New(time.Hour), Hops: 3, AttemptTimeout: durationpb.New(time.Minute)},
		&pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "a", Capacity: 3}},
		&pb.SetPolicyRequest{Tenant: "a", Policy: &pb.Policy{CallDeadline: durationpb.New(time.Minute)}},
		&pb.ForceBreakerRequest{Key: &pb.BreakerKey{Target: "t"}, State: pb.BreakerState_BREAKER_STATE_OPEN},
		&pb.OpenRunRequest{Tenant: "a", RetryPool: 9, CutoffTime: timestamppb.New(now.Add(time.Hour))},
		&pb.ListBreakersRequest{PageSize: 2},
		&pb.GetPolicyRequest{Tenant: "a", Effective: true},
		&pb.QueryAuditRequest{CallId: "c", Tenant: "a", StartTime: timestamppb.New(now), PageSize: 5, PageToken: "MTAAMg"},
		// The edges: ids with invisible characters, huge but valid hints,
		// an origin in the future.
		&pb.NextDelayRequest{Call: &pb.CallRef{Tenant: " a", Target: "t\u202e", CallId: "c\u200b", RunId: "r\ufffe"}, Attempt: 1, Failure: http(503)},
		&pb.NextDelayRequest{Call: call("a", "t", "c"), Attempt: 1, Failure: http(503), Pushback: &pb.Pushback{RetryAfter: "99999999999",
			GrpcRetryPushbackMs: "9223372036854775807", XRatelimitReset: "99999999999999", XAmzRetryAfter: "1000000000000000000"}},
		&pb.NextDelayRequest{Call: call("a", "t", "c"), Attempt: 1, Failure: http(503), Pushback: &pb.Pushback{GrpcRetryPushbackMs: "-0",
			RetryAfter: "Fri, 31 Dec 9999 23:59:59 GMT"}},
		&pb.NextDelayRequest{Call: &pb.CallRef{Tenant: "a", Target: "t", CallId: "c", OriginTime: timestamppb.New(now.Add(time.Hour))},
			Attempt: 1, Failure: http(503)},
		&pb.SetTenantBudgetRequest{Budget: &pb.TenantBudget{Tenant: "a\u2028b", Capacity: 3}},
		// An adaptive ceiling, and one at every edge of its fields.
		&pb.SetPolicyRequest{Tenant: "a", Target: "t", Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: proto.Uint32(12),
			Adaptive: &pb.AdaptiveCeiling{MinInFlight: proto.Uint32(2), Decrease: proto.Float64(0.5), Increase: proto.Float64(1),
				Hold: durationpb.New(time.Second)}}}},
		&pb.SetPolicyRequest{Tenant: "a", Target: "t", Policy: &pb.Policy{Flow: &pb.FlowSettings{MaxInFlight: proto.Uint32(1_000_000),
			Adaptive: &pb.AdaptiveCeiling{MinInFlight: proto.Uint32(4294967295), Decrease: proto.Float64(math.Nextafter(1, 0)),
				Increase: proto.Float64(1_000_000), Hold: durationpb.New(time.Hour)}}}},
		&pb.AdviseTargetsRequest{Tenant: "a", Target: "t", Since: durationpb.New(time.Hour)},
		&pb.AdviseTargetsRequest{Since: durationpb.New(168 * time.Hour)},
		&pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: call("a", "t", "c"), Attempt: 2, Success: true, AttemptTarget: "t-b",
			FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED}}},
	}
	clk := newFakeClock()
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(f.TempDir(), "fuzz.db"), Clock: clk, FlushInterval: time.Hour})
	if err != nil {
		f.Fatalf("open store: %v", err)
	}
	f.Cleanup(func() { store.Close() })
	cfg := server.Config{Clock: clk}
	rpcs := rpcTable(server.NewDecisions(store, cfg), server.NewAdmin(store, cfg))
	// Each seed goes to the method it is the request of, and an empty
	// request to every method.
	for i, rpc := range rpcs {
		f.Add(uint8(i), []byte{})
		for _, s := range seeds {
			name := string(s.ProtoReflect().Descriptor().Name())
			if strings.HasSuffix(rpc.name, "/"+strings.TrimSuffix(name, "Request")) {
				f.Add(uint8(i), mustMarshal(s))
			}
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, raw []byte) {
		rpc := rpcs[int(which)%len(rpcs)]
		watchdog := time.AfterFunc(10*time.Second, func() { panic(rpc.name + " hung on this input") })
		err := rpc.call(context.Background(), raw)
		watchdog.Stop()
		if c := status.Code(err); c == codes.Unknown || c == codes.Internal {
			t.Fatalf("%s answered %v: %v", rpc.name, c, err)
		}
	})
}
