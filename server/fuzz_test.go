package server_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

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

func rpcTable(d *server.Decisions, a *server.Admin) []unaryRPC {
	// decode builds a caller for request type Req.
	decode := func(name string, newReq func() proto.Message, fn func(context.Context, proto.Message) error) unaryRPC {
		return unaryRPC{name, func(ctx context.Context, raw []byte) error {
			req := newReq()
			if err := proto.Unmarshal(raw, req); err != nil {
				return nil // gRPC itself refuses undecodable bytes
			}
			return fn(ctx, req)
		}}
	}
	return []unaryRPC{
		decode("Classify", func() proto.Message { return &pb.ClassifyRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := d.Classify(ctx, m.(*pb.ClassifyRequest))
			return err
		}),
		decode("NextDelay", func() proto.Message { return &pb.NextDelayRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := d.NextDelay(ctx, m.(*pb.NextDelayRequest))
			return err
		}),
		decode("ReportOutcome", func() proto.Message { return &pb.ReportOutcomeRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := d.ReportOutcome(ctx, m.(*pb.ReportOutcomeRequest))
			return err
		}),
		decode("Admit", func() proto.Message { return &pb.AdmitRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := d.Admit(ctx, m.(*pb.AdmitRequest))
			return err
		}),
		decode("PlanBudget", func() proto.Message { return &pb.PlanBudgetRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := d.PlanBudget(ctx, m.(*pb.PlanBudgetRequest))
			return err
		}),
		decode("SetTenantBudget", func() proto.Message { return &pb.SetTenantBudgetRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := a.SetTenantBudget(ctx, m.(*pb.SetTenantBudgetRequest))
			return err
		}),
		decode("SetPolicy", func() proto.Message { return &pb.SetPolicyRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := a.SetPolicy(ctx, m.(*pb.SetPolicyRequest))
			return err
		}),
		decode("ForceBreaker", func() proto.Message { return &pb.ForceBreakerRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := a.ForceBreaker(ctx, m.(*pb.ForceBreakerRequest))
			return err
		}),
		decode("OpenRun", func() proto.Message { return &pb.OpenRunRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := a.OpenRun(ctx, m.(*pb.OpenRunRequest))
			return err
		}),
		decode("ListBreakers", func() proto.Message { return &pb.ListBreakersRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := a.ListBreakers(ctx, m.(*pb.ListBreakersRequest))
			return err
		}),
		decode("GetPolicy", func() proto.Message { return &pb.GetPolicyRequest{} }, func(ctx context.Context, m proto.Message) error {
			_, err := a.GetPolicy(ctx, m.(*pb.GetPolicyRequest))
			return err
		}),
	}
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
	}
	for i, s := range seeds {
		f.Add(uint8(i), mustMarshal(s))
	}
	clk := newFakeClock()
	store, err := breakerstore.Open(breakerstore.Options{Path: filepath.Join(f.TempDir(), "fuzz.db"), Clock: clk, FlushInterval: time.Hour})
	if err != nil {
		f.Fatalf("open store: %v", err)
	}
	f.Cleanup(func() { store.Close() })
	cfg := server.Config{Clock: clk}
	rpcs := rpcTable(server.NewDecisions(store, cfg), server.NewAdmin(store, cfg))
	f.Fuzz(func(t *testing.T, which uint8, raw []byte) {
		rpc := rpcs[int(which)%len(rpcs)]
		err := rpc.call(context.Background(), raw)
		if c := status.Code(err); c == codes.Unknown || c == codes.Internal {
			t.Fatalf("%s answered %v: %v", rpc.name, c, err)
		}
	})
}
