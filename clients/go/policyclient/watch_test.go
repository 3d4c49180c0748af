package policyclient_test

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// drainingWatch is the WatchBreakers side of a policyd that drains: the
// first stream delivers a (empty) snapshot and ends with UNAVAILABLE once
// drain is closed; every later stream is refused with UNAVAILABLE, as a
// stopped daemon's would be. (The client module does not import the
// daemon; clients/go/e2e runs the client against a real one.)
type drainingWatch struct {
	pb.UnimplementedRetryPolicyServiceServer
	drain  chan struct{}
	served chan struct{}
}

func (w *drainingWatch) WatchBreakers(_ *pb.WatchBreakersRequest, stream grpc.ServerStreamingServer[pb.WatchBreakersResponse]) error {
	select {
	case <-w.served:
		return status.Error(codes.Unavailable, "draining")
	default:
		close(w.served)
	}
	if err := stream.Send(&pb.WatchBreakersResponse{SnapshotComplete: true}); err != nil {
		return err
	}
	<-w.drain
	return status.Error(codes.Unavailable, "draining")
}

// startDrainingWatch serves w over bufconn and returns a client of it that
// runs no watch of its own.
func startDrainingWatch(t *testing.T, w *drainingWatch) *policyclient.Client {
	t.Helper()
	gs := grpc.NewServer()
	pb.RegisterRetryPolicyServiceServer(gs, w)
	lis := bufconn.Listen(1 << 20)
	go func() { _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///policyd",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := policyclient.New(conn, policyclient.Config{Tenant: "acme", NoWatch: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close(context.Background())
		conn.Close()
		gs.Stop()
	})
	return c
}

// nominalReconnect is the documented ceiling of reconnect n's wait.
func nominalReconnect(n int) time.Duration {
	return min(5*time.Second, 200*time.Millisecond<<min(n, 5))
}

// TestWatchReconnectsWithJitteredBackoff: when policyd drains, the watch
// (whose snapshot had arrived) reconnects after a wait drawn from the
// upper half of a doubling, capped backoff, starting again from the
// smallest, and two workers that lost their streams together do not wait
// the same. Before, every worker waited exactly 100ms, 200ms, 400ms, ...
func TestWatchReconnectsWithJitteredBackoff(t *testing.T) {
	const waits = 10
	run := func(t *testing.T, draw func() float64) []time.Duration {
		w := &drainingWatch{drain: make(chan struct{}), served: make(chan struct{})}
		c := startDrainingWatch(t, w)
		got := make(chan []time.Duration, 1)
		go func() { got <- policyclient.WatchReconnects(c, waits, draw) }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Ready(ctx); err != nil {
			t.Fatalf("Ready: %v", err)
		}
		close(w.drain) // the watch ends with UNAVAILABLE
		return <-got
	}
	t.Run("bounds", func(t *testing.T) {
		for _, tt := range []struct {
			name string
			u    float64
			want func(n int) time.Duration
		}{
			{"draw 0 waits half the nominal", 0, func(n int) time.Duration { return nominalReconnect(n) / 2 }},
			{"draw near 1 waits just under it", 1 - 1e-12, func(n int) time.Duration { return nominalReconnect(n) - 1 }},
		} {
			t.Run(tt.name, func(t *testing.T) {
				got := run(t, func() float64 { return tt.u })
				for n, w := range got {
					if w != tt.want(n) {
						t.Errorf("wait %d: got %v, want %v (all: %v)", n, w, tt.want(n), got)
					}
				}
			})
		}
	})
	t.Run("two workers do not wait alike", func(t *testing.T) {
		a := run(t, rand.New(rand.NewPCG(1, 1)).Float64)
		b := run(t, rand.New(rand.NewPCG(2, 2)).Float64)
		for _, got := range [][]time.Duration{a, b} {
			if len(got) != waits {
				t.Fatalf("waits: got %d, want %d", len(got), waits)
			}
			for n, w := range got {
				if lo, hi := nominalReconnect(n)/2, nominalReconnect(n); w < lo || w >= hi {
					t.Errorf("wait %d: got %v, want in [%v, %v)", n, w, lo, hi)
				}
			}
		}
		same := 0
		for n := range a {
			if a[n] == b[n] {
				same++
			}
		}
		if same > 0 || slices.Equal(a, b) {
			t.Errorf("two workers' waits: got %v and %v, %d equal, want none equal", a, b, same)
		}
	})
}
