package main

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// TestSIGTERMEndsWatchStreams: a daemon with watch streams open and an
// hour of --grace exits on SIGTERM without waiting the grace out (d.wait
// gives up after 30s), and the streams end with UNAVAILABLE "draining".
// Before server.Server the open streams held the drain for all of --grace.
func TestSIGTERMEndsWatchStreams(t *testing.T) {
	d := startDaemon(t, filepath.Join(t.TempDir(), "policyd.db"), "--grace", "1h")
	workers := pb.NewRetryPolicyServiceClient(d.conn(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []pb.RetryPolicyService_WatchBreakersClient
	for _, tenant := range []string{"", "acme"} {
		stream, err := workers.WatchBreakers(ctx, &pb.WatchBreakersRequest{Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		for {
			msg, err := stream.Recv()
			if err != nil {
				t.Fatalf("snapshot: %v", err)
			}
			if msg.GetSnapshotComplete() {
				break
			}
		}
		streams = append(streams, stream)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for i, stream := range streams {
		_, err := stream.Recv()
		if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "draining") {
			t.Errorf("watch %d ended with %v %q, want UNAVAILABLE draining", i, st.Code(), st.Message())
		}
	}
	if err := d.wait(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v; daemon said: %s", err, d.stderr)
	}
	if log := d.stderr.String(); !strings.Contains(log, "policyd stopped") || strings.Contains(log, "grace period over") {
		t.Errorf("log: want a clean stop inside --grace, got: %s", log)
	}
}
