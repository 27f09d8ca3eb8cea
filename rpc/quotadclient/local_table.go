package quotadclient

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// This file is local mode's table of keys, sharded so that a hit takes a
// read lock and allocates nothing.

// leaseTable holds the entries, sharded; lookups allocate nothing.
type leaseTable struct {
	seed   maphash.Seed
	shards [32]leaseShard
	size   atomic.Int64
	max    int64
}

type leaseShard struct {
	mu sync.RWMutex
	m  map[leaseKey]*entry
}

func newLeaseTable(maxKeys int) *leaseTable {
	t := &leaseTable{seed: maphash.MakeSeed(), max: int64(maxKeys)}
	for i := range t.shards {
		t.shards[i].m = make(map[leaseKey]*entry)
	}
	return t
}

func (t *leaseTable) shard(k leaseKey) *leaseShard {
	return &t.shards[maphash.String(t.seed, k.key)%uint64(len(t.shards))]
}

func (t *leaseTable) get(k leaseKey) *entry {
	sh := t.shard(k)
	sh.mu.RLock()
	e := sh.m[k]
	sh.mu.RUnlock()
	return e
}

// getOrCreate returns k's entry, adding one if there is room; a full table
// gives an entry that is not in it, which never leases (its demand is one
// check).
func (t *leaseTable) getOrCreate(k leaseKey, now int64) *entry {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.m[k]; e != nil {
		return e
	}
	e := &entry{sampleStart: now}
	e.lastUsed.Store(now)
	if t.size.Add(1) > t.max {
		t.size.Add(-1)
		e.noLease = true
		return e
	}
	sh.m[k] = e
	return e
}

// each calls f on every entry under read locks.
func (t *leaseTable) each(f func(*entry)) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.RLock()
		for _, e := range sh.m {
			f(e)
		}
		sh.mu.RUnlock()
	}
}

// sweep calls f on every entry under its shard's write lock and removes
// those for which it returns true; f must not block for long.
func (t *leaseTable) sweep(f func(*entry) bool) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if f(e) {
				delete(sh.m, k)
				t.size.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}
