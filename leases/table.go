package leases

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// Key is what a Table is keyed by: comparable, and sharded by the string
// ShardKey returns (the rate-limit key, say), which must be the same for
// equal keys.
type Key interface {
	comparable
	ShardKey() string
}

// shards is how many parts a Table's lock is split into, so that checks of
// different keys seldom wait for each other.
const shards = 64

// Table holds a holder's per-key state V (a lease and what sizes it) by
// key K, at most Max entries. Lookups take a shard's read lock and
// allocate nothing. Safe for concurrent use.
type Table[K Key, V any] struct {
	seed   maphash.Seed
	shards [shards]tableShard[K, V]
	// size counts the entries; an entry is added only after size has made
	// room for it. full counts GetOrCreate calls that found no room.
	size, full atomic.Int64
	max        int64
}

type tableShard[K Key, V any] struct {
	mu sync.RWMutex
	m  map[K]*V
}

// NewTable is an empty table of at most maxEntries entries.
func NewTable[K Key, V any](maxEntries int) *Table[K, V] {
	t := &Table[K, V]{seed: maphash.MakeSeed(), max: int64(maxEntries)}
	for i := range t.shards {
		t.shards[i].m = make(map[K]*V)
	}
	return t
}

func (t *Table[K, V]) shard(k K) *tableShard[K, V] {
	return &t.shards[maphash.String(t.seed, k.ShardKey())%shards]
}

// Get returns k's entry, or nil.
func (t *Table[K, V]) Get(k K) *V {
	sh := t.shard(k)
	sh.mu.RLock()
	v := sh.m[k]
	sh.mu.RUnlock()
	return v
}

// GetOrCreate returns k's entry, adding fresh() if there is none and
// there is room. When the table is full it returns fresh() without adding
// it, and inTable false: enough to decide one check, which the caller
// must not lease for (its demand is that one check).
func (t *Table[K, V]) GetOrCreate(k K, fresh func() *V) (v *V, inTable bool) {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if v := sh.m[k]; v != nil {
		return v, true
	}
	v = fresh()
	if t.size.Add(1) > t.max {
		t.size.Add(-1)
		t.full.Add(1)
		return v, false
	}
	sh.m[k] = v
	return v, true
}

// Remove removes k's entry and returns it, or nil.
func (t *Table[K, V]) Remove(k K) *V {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	v := sh.m[k]
	if v != nil {
		delete(sh.m, k)
		t.size.Add(-1)
	}
	return v
}

// RemoveIf removes k's entry if it is still v and drop(v) holds under the
// shard's write lock.
func (t *Table[K, V]) RemoveIf(k K, v *V, drop func(*V) bool) {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m[k] == v && drop(v) {
		delete(sh.m, k)
		t.size.Add(-1)
	}
}

// Each calls f for every entry under read locks, so lookups of the same
// shard proceed meanwhile; f must not call back into the table.
func (t *Table[K, V]) Each(f func(K, *V)) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.RLock()
		for k, v := range sh.m {
			f(k, v)
		}
		sh.mu.RUnlock()
	}
}

// Sweep calls f for every entry under its shard's write lock and removes
// those for which it returns true; f must not block for long.
func (t *Table[K, V]) Sweep(f func(K, *V) bool) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, v := range sh.m {
			if f(k, v) {
				delete(sh.m, k)
				t.size.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}

// Len is the number of entries.
func (t *Table[K, V]) Len() int64 { return t.size.Load() }

// Full counts the GetOrCreate calls that found the table full.
func (t *Table[K, V]) Full() int64 { return t.full.Load() }
