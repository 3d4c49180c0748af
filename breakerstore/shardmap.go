package breakerstore

import (
	"hash/maphash"
	"sync"

	"github.com/policyd/policyd/policy"
)

// shardMap is a map split into 64 independently locked shards so that
// lookups of different keys do not contend.
type shardMap[K comparable, V any] struct {
	seed   maphash.Seed
	hash   func(maphash.Seed, K) uint64
	shards [64]mapShard[K, V]
}

type mapShard[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]V
	_  [32]byte // keeps shards on separate cache lines
}

func (sm *shardMap[K, V]) init(hash func(maphash.Seed, K) uint64) {
	sm.seed = maphash.MakeSeed()
	sm.hash = hash
	for i := range sm.shards {
		sm.shards[i].m = make(map[K]V)
	}
}

func (sm *shardMap[K, V]) shard(k K) *mapShard[K, V] {
	return &sm.shards[sm.hash(sm.seed, k)&63]
}

func (sm *shardMap[K, V]) get(k K) (V, bool) {
	sh := sm.shard(k)
	sh.mu.RLock()
	v, ok := sh.m[k]
	sh.mu.RUnlock()
	return v, ok
}

// getOrCreate returns the value under k, calling create under the shard's
// write lock when there is none.
func (sm *shardMap[K, V]) getOrCreate(k K, create func() (V, error)) (V, error) {
	sh := sm.shard(k)
	sh.mu.RLock()
	v, ok := sh.m[k]
	sh.mu.RUnlock()
	if ok {
		return v, nil
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if v, ok := sh.m[k]; ok {
		return v, nil
	}
	v, err := create()
	if err != nil {
		return v, err
	}
	sh.m[k] = v
	return v, nil
}

func (sm *shardMap[K, V]) put(k K, v V) {
	sh := sm.shard(k)
	sh.mu.Lock()
	sh.m[k] = v
	sh.mu.Unlock()
}

// deleteIf removes k when pred holds for its value, and reports whether it did.
func (sm *shardMap[K, V]) deleteIf(k K, pred func(V) bool) bool {
	sh := sm.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if v, ok := sh.m[k]; ok && pred(v) {
		delete(sh.m, k)
		return true
	}
	return false
}

// values returns every value; callers must not hold a shard lock.
func (sm *shardMap[K, V]) values() []V {
	var out []V
	for i := range sm.shards {
		sh := &sm.shards[i]
		sh.mu.RLock()
		for _, v := range sh.m {
			out = append(out, v)
		}
		sh.mu.RUnlock()
	}
	return out
}

func (sm *shardMap[K, V]) len() int {
	n := 0
	for i := range sm.shards {
		sh := &sm.shards[i]
		sh.mu.RLock()
		n += len(sh.m)
		sh.mu.RUnlock()
	}
	return n
}

func hashKey(seed maphash.Seed, k policy.BreakerKey) uint64 {
	return maphash.String(seed, k.Tenant)*31 ^ maphash.String(seed, k.Target)
}
