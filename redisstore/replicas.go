package redisstore

import (
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replica is one replica of the fleet's replica set (keyReplicas): its id
// and its last heartbeat.
type Replica struct {
	ID       string
	LastSeen time.Time
}

// ReplicaID returns this replica's id in the replica set, drawn at Open.
func (s *Store) ReplicaID() string { return s.id }

// Replicas returns the live replicas, this one included while its
// heartbeats reach the engine: those seen within three Options.Heartbeat
// intervals, as the degraded mode counts them, most recently seen first.
// It is one call, bounded by Options.Timeout, and safe for concurrent use.
func (s *Store) Replicas() ([]Replica, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	since := s.opts.Clock().UnixMilli() - 3*s.opts.Heartbeat.Milliseconds()
	ctx, cancel := s.call()
	zs, err := s.c.ZRevRangeByScoreWithScores(ctx, keyReplicas, &redis.ZRangeBy{Min: strconv.FormatInt(since, 10), Max: "+inf"}).Result()
	cancel()
	if err != nil {
		return nil, fmt.Errorf("redisstore: read %s: %w", keyReplicas, err)
	}
	out := make([]Replica, 0, len(zs))
	for _, z := range zs {
		id, _ := z.Member.(string)
		out = append(out, Replica{ID: id, LastSeen: time.UnixMilli(int64(z.Score))})
	}
	return out, nil
}
