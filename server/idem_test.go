package server_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/policyd/policyd/breakerstore"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/server"
)

// TestIdempotencyKeys: ClaimKey, CompleteKey and GetKey over real gRPC,
// and their bad input: an unknown key (or another tenant's) is NOT_FOUND,
// completing without the lease FAILED_PRECONDITION naming it, an
// oversized result reference INVALID_ARGUMENT, a key beyond the tenant's
// cap RESOURCE_EXHAUSTED.
func TestIdempotencyKeys(t *testing.T) {
	h := newHarness(t, func(c *server.Config, o *breakerstore.Options) {
		o.MaxKeysPerTenant = 2
		c.Auth = server.NewAuth(server.AuthConfig{TenantTokens: map[string]string{"tok-a": "acme", "tok-b": "other"}})
	})
	a := withToken("tok-a")
	ref := func(key string) *pb.CallRef {
		c := call("acme", "grants", "c-"+key)
		c.IdempotencyKey = key
		return c
	}
	claim, err := h.workers.ClaimKey(a, &pb.ClaimKeyRequest{Call: ref("k1"), Attempt: 1})
	if err != nil || claim.GetState() != pb.KeyState_KEY_STATE_NEW || claim.GetLeaseId() == "" ||
		!claim.GetLeaseExpireTime().AsTime().Equal(h.clock.Now().Add(11*time.Second)) {
		t.Fatalf("first claim: %v, %v; want NEW with a lease of the attempt timeout plus 1 s", claim, err)
	}
	second, err := h.workers.ClaimKey(a, &pb.ClaimKeyRequest{Call: ref("k1"), Attempt: 1})
	if err != nil || second.GetState() != pb.KeyState_KEY_STATE_IN_FLIGHT || second.GetLeaseId() != "" {
		t.Fatalf("second claim: %v, %v; want IN_FLIGHT", second, err)
	}
	bad := []struct {
		name string
		req  *pb.CompleteKeyRequest
		code codes.Code
		msg  string
	}{
		{"not the lease", &pb.CompleteKeyRequest{Tenant: "acme", IdempotencyKey: "k1", LeaseId: "beef", Outcome: pb.KeyOutcome_KEY_OUTCOME_SUCCEEDED},
			codes.FailedPrecondition, `lease_id: "beef" does not hold idempotency key "k1"`},
		{"unknown key", &pb.CompleteKeyRequest{Tenant: "acme", IdempotencyKey: "nope", LeaseId: "beef", Outcome: pb.KeyOutcome_KEY_OUTCOME_SUCCEEDED},
			codes.NotFound, `idempotency_key: "nope" not found for tenant "acme"`},
		{"oversized result", &pb.CompleteKeyRequest{Tenant: "acme", IdempotencyKey: "k1", LeaseId: claim.GetLeaseId(),
			Outcome: pb.KeyOutcome_KEY_OUTCOME_SUCCEEDED, ResultRef: strings.Repeat("r", 1025)}, codes.InvalidArgument, "result_ref: must be at most 1024 bytes"},
		{"no outcome", &pb.CompleteKeyRequest{Tenant: "acme", IdempotencyKey: "k1", LeaseId: claim.GetLeaseId()}, codes.InvalidArgument, "outcome"},
		{"another tenant", &pb.CompleteKeyRequest{Tenant: "other", IdempotencyKey: "k1", LeaseId: claim.GetLeaseId(),
			Outcome: pb.KeyOutcome_KEY_OUTCOME_SUCCEEDED}, codes.PermissionDenied, "tenant"},
	}
	for _, tt := range bad {
		_, err := h.workers.CompleteKey(a, tt.req)
		if msg := wantCode(t, err, tt.code); !strings.HasPrefix(msg, tt.msg) {
			t.Errorf("%s: %q, want %q", tt.name, msg, tt.msg)
		}
	}
	if _, err := h.workers.CompleteKey(a, &pb.CompleteKeyRequest{Tenant: "acme", IdempotencyKey: "k1", LeaseId: claim.GetLeaseId(),
		Outcome: pb.KeyOutcome_KEY_OUTCOME_SUCCEEDED, ResultRef: "rec-1"}); err != nil {
		t.Fatal(err)
	}
	// Another tenant's key is NOT_FOUND, as an unknown one.
	_, err = h.workers.GetKey(withToken("tok-b"), &pb.GetKeyRequest{Tenant: "other", IdempotencyKey: "k1"})
	if msg := wantCode(t, err, codes.NotFound); msg != `idempotency_key: "k1" not found for tenant "other"` {
		t.Errorf("another tenant's key: %q", msg)
	}
	if _, err := h.workers.ClaimKey(a, &pb.ClaimKeyRequest{Call: ref("k2"), Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	_, err = h.workers.ClaimKey(a, &pb.ClaimKeyRequest{Call: ref("k3"), Attempt: 1})
	wantCode(t, err, codes.ResourceExhausted)
	// A deduplicated success needs the key to have SUCCEEDED (k2 is in
	// flight), and the key itself.
	for _, tt := range []struct{ key, msg string }{
		{"k2", "outcomes[0].deduplicated: needs the call's idempotency key to have SUCCEEDED"},
		{"", "outcomes[0].deduplicated: only with success"},
	} {
		_, err = h.workers.ReportOutcome(a, &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: ref(tt.key), Attempt: 1,
			Success: true, FinalDisposition: pb.Disposition_DISPOSITION_SUCCEEDED, Deduplicated: true}}})
		if msg := wantCode(t, err, codes.InvalidArgument); !strings.HasPrefix(msg, tt.msg) {
			t.Errorf("deduplicated with key %q: %q, want %q", tt.key, msg, tt.msg)
		}
	}
	_, err = h.workers.ClaimKey(a, &pb.ClaimKeyRequest{Call: call("acme", "grants", "c"), Attempt: 1})
	if msg := wantCode(t, err, codes.InvalidArgument); !strings.HasPrefix(msg, "call.idempotency_key") {
		t.Errorf("no key: %q", msg)
	}

}

// TestDeadLetterOfAKeyClaimedElsewhere: a call with an idempotency key
// may end DEAD_LETTER (NOT_IDEMPOTENT) without a failure of its own and
// without a STOP from policyd: a client that was told another worker holds
// the key, or that could not claim it at all (policyd or its store away,
// Config.RequireClaim), does not write. Whatever became of another call's
// attempt (in flight, succeeded, lost, failed), and whether the key has a
// record at all; a call without a key still needs a STOP or a transient
// failure.
func TestDeadLetterOfAKeyClaimedElsewhere(t *testing.T) {
	for _, tc := range []struct {
		name    string
		outcome pb.KeyOutcome // how the other call's attempt ended; UNSPECIFIED: still in flight
		claimed bool
		noKey   bool
		code    codes.Code
	}{
		{name: "in flight", claimed: true, code: codes.OK},
		{name: "succeeded", claimed: true, outcome: pb.KeyOutcome_KEY_OUTCOME_SUCCEEDED, code: codes.OK},
		{name: "outcome lost", claimed: true, outcome: pb.KeyOutcome_KEY_OUTCOME_UNKNOWN, code: codes.OK},
		{name: "released by a failure", claimed: true, outcome: pb.KeyOutcome_KEY_OUTCOME_FAILED, code: codes.OK},
		{name: "never claimed", code: codes.OK},
		{name: "no key", noKey: true, code: codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			ref := func(id string) *pb.CallRef {
				c := call("acme", "grants", id)
				c.Idempotent, c.IdempotencyKey = false, "doc-1"
				if tc.noKey {
					c.IdempotencyKey = ""
				}
				return c
			}
			if tc.claimed {
				claim, err := h.workers.ClaimKey(t.Context(), &pb.ClaimKeyRequest{Call: ref("first"), Attempt: 1})
				if err != nil || claim.GetState() != pb.KeyState_KEY_STATE_NEW {
					t.Fatalf("first claim: %v, %v; want NEW", claim, err)
				}
				if tc.outcome != pb.KeyOutcome_KEY_OUTCOME_UNSPECIFIED {
					if _, err := h.workers.CompleteKey(t.Context(), &pb.CompleteKeyRequest{Tenant: "acme", IdempotencyKey: "doc-1",
						LeaseId: claim.GetLeaseId(), Outcome: tc.outcome}); err != nil {
						t.Fatalf("CompleteKey: %v", err)
					}
				}
			}
			_, err := h.workers.ReportOutcome(t.Context(), &pb.ReportOutcomeRequest{Outcomes: []*pb.Outcome{{Call: ref("second"),
				Attempt: 1, AlreadyRecorded: true, FinalDisposition: pb.Disposition_DISPOSITION_DEAD_LETTER,
				FinalStopReason: pb.StopReason_STOP_REASON_NOT_IDEMPOTENT}}})
			if got := status.Code(err); got != tc.code {
				t.Errorf("ReportOutcome: got %v (%v), want %v", got, err, tc.code)
			}
		})
	}
}
