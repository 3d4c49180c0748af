package main

import (
	"context"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
)

// refusingWatches is a replica's two services as measurePropagation uses
// them: a ForceBreaker is sent to every watch, and the first refuse
// watches answer UNAVAILABLE before their snapshot, as a replica does
// when its engine outlasts --store-timeout.
type refusingWatches struct {
	pb.UnimplementedRetryPolicyServiceServer
	pb.UnimplementedAdminServiceServer
	mu      sync.Mutex
	refuse  int
	watches []chan *pb.Breaker
}

func (f *refusingWatches) Admit(context.Context, *pb.AdmitRequest) (*pb.AdmitResponse, error) {
	return &pb.AdmitResponse{Admitted: true}, nil
}

func (f *refusingWatches) ForceBreaker(_ context.Context, req *pb.ForceBreakerRequest) (*pb.ForceBreakerResponse, error) {
	b := &pb.Breaker{Key: req.GetKey(), State: req.GetState()}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.watches {
		w <- b
	}
	return &pb.ForceBreakerResponse{Breaker: b}, nil
}

func (f *refusingWatches) WatchBreakers(_ *pb.WatchBreakersRequest, st grpc.ServerStreamingServer[pb.WatchBreakersResponse]) error {
	f.mu.Lock()
	if f.refuse > 0 {
		f.refuse--
		f.mu.Unlock()
		return status.Error(codes.Unavailable, "breakers: the store is unavailable, try again later")
	}
	w := make(chan *pb.Breaker, 1024)
	f.watches = append(f.watches, w)
	f.mu.Unlock()
	if err := st.Send(&pb.WatchBreakersResponse{SnapshotComplete: true}); err != nil {
		return err
	}
	for {
		select {
		case b := <-w:
			if err := st.Send(&pb.WatchBreakersResponse{Breaker: b}); err != nil {
				return err
			}
		case <-st.Context().Done():
			return nil
		}
	}
}

// serveFake serves the services register puts on a gRPC server, on a
// free loopback port until the test ends, and returns its address.
func serveFake(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	srv := grpc.NewServer()
	register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// TestPropagationWatchesAgainAfterUnavailable: a watch refused UNAVAILABLE
// before its snapshot is sent again, as the clients do, and every
// transition is timed; before, the sweep printed "propagation not
// measured" and a p99 of 0.
func TestPropagationWatchesAgainAfterUnavailable(t *testing.T) {
	f := &refusingWatches{refuse: 2}
	addr := serveFake(t, func(srv *grpc.Server) {
		pb.RegisterRetryPolicyServiceServer(srv, f)
		pb.RegisterAdminServiceServer(srv, f)
	})
	fl := &replicaFleet{reps: []*daemon{{addr: addr}, {addr: addr}, {addr: addr}}}
	p, err := measurePropagation(context.Background(), fl, 6)
	if err != nil {
		t.Fatalf("measurePropagation = %v", err)
	}
	if p.Samples != 12 || p.Missed != 0 || p.Resubscribed != 2 || p.NoSnapshot != 0 {
		t.Errorf("measured %d arrivals, %d missed, %d watches sent again, %d without a snapshot; want 12, 0, 2, 0",
			p.Samples, p.Missed, p.Resubscribed, p.NoSnapshot)
	}
}
