package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	pb "github.com/policyd/policyd/gen/go/retrypolicy/v1"
	"github.com/policyd/policyd/internal/redistest"
	"github.com/policyd/policyd/redisstore"
)

// feedReads records how long each blocking XREAD of a feed may take: the
// time from its start to its context's deadline (zero: no deadline).
type feedReads struct {
	mu     sync.Mutex
	bounds map[string]time.Duration // first stream read → its longest bound
	open   int                      // reads without a deadline
}

func (f *feedReads) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *feedReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "xread" {
			stream := ""
			for i, a := range cmd.Args() {
				if s, ok := a.(string); ok && s == "streams" && i+1 < len(cmd.Args()) {
					stream, _ = cmd.Args()[i+1].(string)
				}
			}
			f.mu.Lock()
			if d, ok := ctx.Deadline(); ok {
				f.bounds[stream] = max(f.bounds[stream], time.Until(d))
			} else {
				f.bounds[stream] = 0
				f.open++
			}
			f.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (f *feedReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestFeedReadsAreBounded: both feeds (the admin changes stream and the
// tenants' event streams) block in XREAD, which go-redis does not end when
// the Store's context is cancelled; a read in flight to a paused Redis
// only ended at its socket timeout (FeedBlock + 10 s), and Close waited
// for it that long. Each read is bounded by FeedBlock plus a grace, so
// Close with Redis gone returns within that.
func TestFeedReadsAreBounded(t *testing.T) {
	srv := redistest.Standalone(t)
	reads := &feedReads{bounds: map[string]time.Duration{}}
	const block = 100 * time.Millisecond
	r := newReplicaWith(t, func() redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true,
			ReadTimeout: time.Minute, WriteTimeout: time.Minute})
		c.AddHook(reads)
		return c
	}, redisstore.Options{Timeout: 50 * time.Millisecond, FeedBlock: block})
	// A tenant's event stream is followed once the replica has used it.
	if _, err := r.workers.Admit(context.Background(), &pb.AdmitRequest{Call: &pb.CallRef{Tenant: "acme", Target: "geo", CallId: "c1"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "reads of both feeds", func() bool {
		reads.mu.Lock()
		defer reads.mu.Unlock()
		return len(reads.bounds) >= 2
	})
	reads.mu.Lock()
	defer reads.mu.Unlock()
	if reads.open > 0 {
		t.Fatalf("%d feed reads had no deadline (%v): Close waits for each up to its socket timeout", reads.open, reads.bounds)
	}
	for stream, d := range reads.bounds {
		if d > block+redisstore.FeedGrace {
			t.Errorf("a read of %s may block %v, past FeedBlock %v + grace %v", stream, d, block, redisstore.FeedGrace)
		}
	}
}
