package node

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// This file is the lease table: the leases of this node by key, sharded
// and bounded.

// leaseTable holds the leases of this node, sharded to keep lock hold
// times short, at most max of them. Lookups take a read lock and allocate
// nothing.
type leaseTable struct {
	seed   maphash.Seed
	shards [64]leaseShard
	// size counts the leases in all shards; a lease is added only after
	// size has made room for it. full counts getOrCreate calls that found
	// no room.
	size, full atomic.Int64
	max        int64
}

type leaseShard struct {
	mu sync.RWMutex
	m  map[leaseKey]*lease
}

func newLeaseTable(maxLeases int) *leaseTable {
	t := &leaseTable{seed: maphash.MakeSeed(), max: int64(maxLeases)}
	for i := range t.shards {
		t.shards[i].m = make(map[leaseKey]*lease)
	}
	return t
}

func (t *leaseTable) shard(k leaseKey) *leaseShard {
	return &t.shards[maphash.String(t.seed, k.key)%uint64(len(t.shards))]
}

func (t *leaseTable) get(k leaseKey) *lease {
	sh := t.shard(k)
	sh.mu.RLock()
	l := sh.m[k]
	sh.mu.RUnlock()
	return l
}

// getOrCreate returns k's lease, adding one if there is room. When the
// table is full it returns a lease that is not in the table: enough to
// decide one check, which it never leases for (its demand is that one
// check) and whose denial only the denied cache keeps.
func (t *leaseTable) getOrCreate(k leaseKey, now int64) *lease {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if l := sh.m[k]; l != nil {
		return l
	}
	l := &lease{sampleStart: now}
	l.lastUsed.Store(now)
	if t.size.Add(1) > t.max {
		t.size.Add(-1)
		t.full.Add(1)
		return l
	}
	sh.m[k] = l
	return l
}

func (t *leaseTable) remove(k leaseKey) *lease {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := sh.m[k]
	if l != nil {
		delete(sh.m, k)
		t.size.Add(-1)
	}
	return l
}

// removeIf removes k's lease if it is still l and drop(l) holds under the
// shard's write lock.
func (t *leaseTable) removeIf(k leaseKey, l *lease, drop func(*lease) bool) {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m[k] == l && drop(l) {
		delete(sh.m, k)
		t.size.Add(-1)
	}
}

// eachRead calls f for every lease under read locks, so checks on the
// same shard proceed meanwhile; f must not call back into the table.
func (t *leaseTable) eachRead(f func(leaseKey, *lease)) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.RLock()
		for k, l := range sh.m {
			f(k, l)
		}
		sh.mu.RUnlock()
	}
}
