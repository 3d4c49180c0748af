package server_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestBadInput sends one bad request per rule and checks the status code
// and that the message names the field.
func TestBadInput(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	nan, two, half := math.NaN(), 2.0, 0.5
	inf := math.Inf(1)
	zero := uint32(0)
	past := timestamppb.New(h.clock.Now().Add(-time.Hour))
	future := timestamppb.New(h.clock.Now().Add(time.Hour))
	neg := &durationpb.Duration{Seconds: -1}
	nd := func(c *pb.CallRef, attempt uint32, f *pb.Failure) error {
		_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: c, Attempt: attempt, Failure: f})
		return err
	}
	setPolicy := func(p *pb.Policy) error {
		_, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme", Policy: p})
		return err
	}
	setBudget := func(b *pb.TenantBudget) error {
		_, err := h.admin.SetTenantBudget(ctx, &pb.SetTenantBudgetRequest{Budget: b})
		return err
	}
	tests := []struct {
		name  string
		err   error
		code  codes.Code
		field string
	}{
		{"missing call", nd(nil, 1, http(503)), codes.InvalidArgument, "call"},
		{"missing tenant", nd(&pb.CallRef{Target: "t", CallId: "c"}, 1, http(503)), codes.InvalidArgument, "call.tenant"},
		{"missing target", nd(&pb.CallRef{Tenant: "a", CallId: "c"}, 1, http(503)), codes.InvalidArgument, "call.target"},
		{"missing call id", nd(&pb.CallRef{Tenant: "a", Target: "t"}, 1, http(503)), codes.InvalidArgument, "call.call_id"},
		{"oversized tenant", nd(&pb.CallRef{Tenant: strings.Repeat("a", 129), Target: "t", CallId: "c"}, 1, http(503)), codes.InvalidArgument, "call.tenant"},
		{"NUL in target", nd(&pb.CallRef{Tenant: "a", Target: "t\x00x", CallId: "c"}, 1, http(503)), codes.InvalidArgument, "call.target"},
		{"attempt 0", nd(call("a", "t", "c"), 0, http(503)), codes.InvalidArgument, "attempt"},
		{"attempt 1e9", nd(call("a", "t", "c"), 1_000_000_000, http(503)), codes.InvalidArgument, "attempt"},
		{"missing failure", nd(call("a", "t", "c"), 1, nil), codes.InvalidArgument, "failure"},
		{"empty failure", nd(call("a", "t", "c"), 1, &pb.Failure{}), codes.InvalidArgument, "failure"},
		{"http status 99", nd(call("a", "t", "c"), 1, http(99)), codes.InvalidArgument, "failure.http_status"},
		{"grpc code 0", nd(call("a", "t", "c"), 1, &pb.Failure{Kind: &pb.Failure_GrpcCode{GrpcCode: 0}}), codes.InvalidArgument, "failure.grpc_code"},
		{"unknown transport enum", nd(call("a", "t", "c"), 1, transport(99)), codes.InvalidArgument, "failure.transport_error"},
		{"deadline before origin", nd(&pb.CallRef{Tenant: "a", Target: "t", CallId: "c", OriginTime: future, DeadlineTime: past}, 1, http(503)),
			codes.InvalidArgument, "call.deadline_time"},
		{"negative previous delay", func() error {
			_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("a", "t", "c"), Attempt: 1, Failure: http(503), PreviousDelay: neg})
			return err
		}(), codes.InvalidArgument, "previous_delay"},
		{"oversized retry-after", func() error {
			_, err := h.workers.NextDelay(ctx, &pb.NextDelayRequest{Call: call("a", "t", "c"), Attempt: 1, Failure: http(503),
				Pushback: &pb.Pushback{RetryAfter: strings.Repeat("9", 300)}})
			return err
		}(), codes.InvalidArgument, "pushback.retry_after"},
		{"classify missing failure", func() error {
			_, err := h.workers.Classify(ctx, &pb.ClassifyRequest{Call: call("a", "t", "")})
			return err
		}(), codes.InvalidArgument, "failure"},
		{"admit missing target", func() error {
			_, err := h.workers.Admit(ctx, &pb.AdmitRequest{Call: &pb.CallRef{Tenant: "a"}})
			return err
		}(), codes.InvalidArgument, "call.target"},
		{"report empty batch", func() error {
			_, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{})
			return err
		}(), codes.InvalidArgument, "outcomes"},
		{"report oversized batch", func() error {
			outs := make([]*pb.Outcome, 1001)
			for i := range outs {
				outs[i] = &pb.Outcome{Call: call("a", "t", "c"), Attempt: 1, Success: true}
			}
			_, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: outs})
			return err
		}(), codes.InvalidArgument, "outcomes"},
		{"report failure without failure", func() error {
			_, err := h.workers.ReportOutcome(ctx, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{
				{Call: call("a", "t", "c"), Attempt: 1, Success: true},
				{Call: call("a", "t", "c"), Attempt: 1}}})
			return err
		}(), codes.InvalidArgument, "outcomes[1].failure"},
		{"plan without window", func() error {
			_, err := h.workers.PlanBudget(ctx, &pb.PlanBudgetRequest{})
			return err
		}(), codes.InvalidArgument, "window"},
		{"plan base beyond window", func() error {
			_, err := h.workers.PlanBudget(ctx, &pb.PlanBudgetRequest{Window: durationpb.New(time.Second),
				Backoff: &pb.BackoffSettings{BaseDelay: durationpb.New(2 * time.Second)}})
			return err
		}(), codes.InvalidArgument, "backoff.base_delay"},
		{"plan NaN factor", func() error {
			_, err := h.workers.PlanBudget(ctx, &pb.PlanBudgetRequest{Window: durationpb.New(time.Hour),
				Backoff: &pb.BackoffSettings{Factor: &nan}})
			return err
		}(), codes.InvalidArgument, "backoff.factor"},
		{"policy factor 0.5", setPolicy(&pb.Policy{Backoff: &pb.BackoffSettings{Factor: &half}}), codes.InvalidArgument, "policy.backoff.factor"},
		{"policy infinite factor", setPolicy(&pb.Policy{Backoff: &pb.BackoffSettings{Factor: &inf}}), codes.InvalidArgument, "policy.backoff.factor"},
		{"policy max attempts 0", setPolicy(&pb.Policy{MaxAttempts: &zero}), codes.InvalidArgument, "policy.max_attempts"},
		{"policy negative timeout", setPolicy(&pb.Policy{AttemptTimeout: neg}), codes.InvalidArgument, "policy.attempt_timeout"},
		{"policy idempotency TTL shorter than the schedule", setPolicy(&pb.Policy{IdempotencyTtl: durationpb.New(time.Second)}),
			codes.InvalidArgument, "policy.idempotency_ttl: must be at least the policy's schedule (31.5s)"},
		{"policy unknown jitter", setPolicy(&pb.Policy{Backoff: &pb.BackoffSettings{Jitter: 42}}), codes.InvalidArgument, "policy.backoff.jitter"},
		{"policy probes 0", setPolicy(&pb.Policy{Breaker: &pb.BreakerSettings{HalfOpenProbes: &zero}}), codes.InvalidArgument, "policy.breaker.half_open_probes"},
		{"policy min calls 0", setPolicy(&pb.Policy{Breaker: &pb.BreakerSettings{MinCalls: &zero}}), codes.InvalidArgument, "policy.breaker.min_calls"},
		{"policy window 0", setPolicy(&pb.Policy{Breaker: &pb.BreakerSettings{Window: durationpb.New(0)}}), codes.InvalidArgument, "policy.breaker.window"},
		{"policy rate NaN", setPolicy(&pb.Policy{Breaker: &pb.BreakerSettings{FailureRate: &nan}}), codes.InvalidArgument, "policy.breaker.failure_rate"},
		{"policy base beyond deadline", setPolicy(&pb.Policy{CallDeadline: durationpb.New(time.Second),
			Backoff: &pb.BackoffSettings{BaseDelay: durationpb.New(2 * time.Second), Factor: &two}}), codes.InvalidArgument, "policy."},
		{"policy missing", func() error {
			_, err := h.admin.SetPolicy(ctx, &pb.SetPolicyRequest{Tenant: "acme"})
			return err
		}(), codes.InvalidArgument, "policy"},
		{"budget NaN capacity", setBudget(&pb.TenantBudget{Tenant: "acme", Capacity: nan}), codes.InvalidArgument, "budget.capacity"},
		{"budget negative capacity", setBudget(&pb.TenantBudget{Tenant: "acme", Capacity: -1}), codes.InvalidArgument, "budget.capacity"},
		{"budget ratio above 1", setBudget(&pb.TenantBudget{Tenant: "acme", DepositRatio: 1.5}), codes.InvalidArgument, "budget.deposit_ratio"},
		{"budget missing tenant", setBudget(&pb.TenantBudget{Capacity: 1}), codes.InvalidArgument, "budget.tenant"},
		{"unknown tenant budget", func() error {
			_, err := h.admin.GetTenantBudget(ctx, &pb.GetTenantBudgetRequest{Tenant: "nobody"})
			return err
		}(), codes.NotFound, "nobody"},
		{"unknown policy", func() error {
			_, err := h.admin.GetPolicy(ctx, &pb.GetPolicyRequest{Tenant: "nobody"})
			return err
		}(), codes.NotFound, "policy"},
		{"unknown breaker", func() error {
			_, err := h.admin.GetBreaker(ctx, &pb.GetBreakerRequest{Key: &pb.BreakerKey{Tenant: "a", Target: "nothing"}})
			return err
		}(), codes.NotFound, "breaker"},
		{"force half-open", func() error {
			_, err := h.admin.ForceBreaker(ctx, &pb.ForceBreakerRequest{Key: &pb.BreakerKey{Tenant: "a", Target: "t"},
				State: pb.BreakerState_BREAKER_STATE_HALF_OPEN})
			return err
		}(), codes.InvalidArgument, "state"},
		{"run pool 0", func() error {
			_, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{Tenant: "a", CutoffTime: future})
			return err
		}(), codes.InvalidArgument, "retry_pool"},
		{"run cut-off in the past", func() error {
			_, err := h.admin.OpenRun(ctx, &pb.OpenRunRequest{Tenant: "a", RetryPool: 3, CutoffTime: past})
			return err
		}(), codes.InvalidArgument, "cutoff_time"},
		{"unknown run", func() error {
			_, err := h.admin.GetRun(ctx, &pb.GetRunRequest{RunId: "nope"})
			return err
		}(), codes.NotFound, "nope"},
		{"page size too large", func() error {
			_, err := h.admin.ListBreakers(ctx, &pb.ListBreakersRequest{PageSize: 5000})
			return err
		}(), codes.InvalidArgument, "page_size"},
		{"forged page token", func() error {
			_, err := h.admin.ListPolicies(ctx, &pb.ListPoliciesRequest{PageToken: "!!"})
			return err
		}(), codes.InvalidArgument, "page_token"},
	}
	tests = append(tests, struct {
		name  string
		err   error
		code  codes.Code
		field string
	}{"non-UTF-8 tenant", rawClassify(t, h, "a\xff"), codes.InvalidArgument, "call.tenant"},
		struct {
			name  string
			err   error
			code  codes.Code
			field string
		}{"undecodable bytes", rawInvoke(h, "/retrypolicy.v1.RetryPolicyService/NextDelay", []byte{0xff, 0xff, 0xff}), codes.InvalidArgument, "request"})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msg := wantCode(t, tc.err, tc.code)
			if !strings.Contains(msg, tc.field) {
				t.Errorf("message %q does not name %q", msg, tc.field)
			}
		})
	}
}

// rawCodec sends bytes as they are, so a test can send what a generated
// client would refuse to encode.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (rawCodec) Name() string { return "proto" }

func rawInvoke(h *harness, method string, req []byte) error {
	var resp []byte
	return h.conn.Invoke(context.Background(), method, &req, &resp, grpc.ForceCodecV2(rawCodec{}))
}

// rawClassify sends a ClassifyRequest whose tenant is the given bytes.
func rawClassify(t *testing.T, h *harness, tenant string) error {
	t.Helper()
	var call []byte
	call = protowire.AppendTag(call, 1, protowire.BytesType)
	call = protowire.AppendString(call, tenant)
	call = protowire.AppendTag(call, 2, protowire.BytesType)
	call = protowire.AppendString(call, "geo")
	failure, err := proto.Marshal(http(503))
	if err != nil {
		t.Fatal(err)
	}
	var req []byte
	req = protowire.AppendTag(req, 1, protowire.BytesType)
	req = protowire.AppendBytes(req, call)
	req = protowire.AppendTag(req, 2, protowire.BytesType)
	req = protowire.AppendBytes(req, failure)
	return rawInvoke(h, "/retrypolicy.v1.RetryPolicyService/Classify", req)
}
