package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/policyd/policyd/clients/go/policyclient"
	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/redisstore"
	"github.com/policyd/policyd/server"
)

// startRedisReplica is a real policyd replica on the Redis at addr, on a
// loopback port, with the interceptors of startReplica.
func startRedisReplica(t *testing.T, addr string) *replica {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := redisstore.Open(context.Background(), redisstore.Options{Client: rc, Timeout: 2 * time.Second, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{held: make(chan struct{}), watched: make(chan struct{}, 16)}
	r.gs = server.New(store, server.Config{Logger: quiet}, grpc.ChainUnaryInterceptor(r.unary), grpc.ChainStreamInterceptor(r.stream))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = lis.Addr().String()
	go func() { _ = r.gs.Serve(lis) }()
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.admin = pb.NewAdminServiceClient(conn)
	t.Cleanup(func() {
		conn.Close()
		r.gs.Stop()
		store.Close()
		rc.Close()
	})
	return r
}

// TestWatchResumesOnAnotherRedisReplica: three replicas on one Redis; the
// client's watch is on one of them when it stops. Breakers are forced
// OPEN through another replica before the stop, between the two streams
// and after the client resumed on a survivor: the client is told of every
// one (EventBreakerChanged) exactly once, in order, those of the gap
// included, which a fresh snapshot would have folded into its states
// without an event.
func TestWatchResumesOnAnotherRedisReplica(t *testing.T) {
	srv := redistest.Standalone(t)
	var rs []*replica
	var addrs []string
	for range 3 {
		r := startRedisReplica(t, srv.Addr)
		rs, addrs = append(rs, r), append(addrs, r.addr)
	}
	var mu sync.Mutex
	var seen []string
	arrived := make(chan string, 64)
	dialReplicas(t, addrs, func(cfg *policyclient.Config) {
		cfg.OnEvent = func(ev policyclient.Event) {
			if ev.Kind == policyclient.EventBreakerChanged {
				mu.Lock()
				seen = append(seen, ev.Target)
				mu.Unlock()
				arrived <- ev.Target
			}
		}
	})
	var w int
	select {
	case <-rs[0].watched:
	case <-rs[1].watched:
		w = 1
	case <-rs[2].watched:
		w = 2
	case <-time.After(10 * time.Second):
		t.Fatal("no replica saw the watch")
	}
	maker := rs[(w+1)%3] // makes every transition; a survivor
	target := func(i int) string { return fmt.Sprintf("x%02d", i) }
	open := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			maker.forceOpen(t, target(i))
		}
	}
	await := func(to int) {
		t.Helper()
		for {
			select {
			case got := <-arrived:
				if got == target(to-1) {
					return
				}
			case <-time.After(10 * time.Second):
				mu.Lock()
				defer mu.Unlock()
				t.Fatalf("waiting for %s: the client has seen %v", target(to-1), seen)
			}
		}
	}
	open(0, 5)
	await(5)

	// The survivors hold the next subscription until more breakers have
	// been forced OPEN, so those are forced while the client has no stream.
	gate := make(chan struct{})
	var survivors []*replica
	for i, r := range rs {
		if i != w {
			r.watchGate.Store(&gate)
			survivors = append(survivors, r)
		}
	}
	rs[w].gs.Stop()
	select {
	case <-survivors[0].watched:
	case <-survivors[1].watched:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not subscribe again")
	}
	open(5, 10)
	close(gate)
	open(10, 16) // x15 is the last: a duplicate of any before it would come first
	await(16)

	mu.Lock()
	defer mu.Unlock()
	var want []string
	for i := range 16 {
		want = append(want, target(i))
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("breaker changes the client was told of:\n%v\nwant each once, in order:\n%v", seen, want)
	}
}
