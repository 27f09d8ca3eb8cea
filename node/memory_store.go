package node

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// memoryShards spreads keys over independently locked maps so that checks
// for different keys rarely contend.
const memoryShards = 64

// MemoryStore is the embedded store: the Go models of the algorithms in
// process memory. It is a single node's authority; its state is lost when the
// process exits. Safe for concurrent use.
type MemoryStore struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [memoryShards]memoryShard
	stop   chan struct{}
	done   chan struct{}
}

type memoryShard struct {
	mu     sync.Mutex
	states map[memoryKey]*memoryEntry
}

type memoryKey struct {
	base      string
	algorithm algorithms.Algorithm
}

type memoryEntry struct {
	state algorithms.State
	// slots replaces state for algorithms.Concurrency (memory_slots.go).
	slots *algorithms.ConcurrencyState
	// expiresAtMs is when the state became equivalent to a fresh one (the
	// decision's ResetAfter), the analogue of the Redis TTL.
	expiresAtMs int64
}

// NewMemoryStore returns an empty memory store reading time from now (nil
// means time.Now). It sweeps expired states every sweepEvery (0 means one
// minute) until Close.
func NewMemoryStore(now func() time.Time, sweepEvery time.Duration) *MemoryStore {
	if now == nil {
		now = time.Now
	}
	if sweepEvery <= 0 {
		sweepEvery = time.Minute
	}
	s := &MemoryStore{now: now, seed: maphash.MakeSeed(), stop: make(chan struct{}), done: make(chan struct{})}
	for i := range s.shards {
		s.shards[i].states = make(map[memoryKey]*memoryEntry)
	}
	go s.sweepLoop(sweepEvery)
	return s
}

func (s *MemoryStore) shard(base string) *memoryShard {
	return &s.shards[maphash.String(s.seed, base)%memoryShards]
}

// Acquire implements Store. It never fails and never blocks on I/O.
func (s *MemoryStore) Acquire(_ context.Context, base string, l algorithms.Limit, cost, want int64, hold time.Duration) (algorithms.Decision, algorithms.Grant, error) {
	nowMs := s.now().UnixMilli()
	k := memoryKey{base, l.Algorithm}
	sh := s.shard(base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.states[k]
	if e == nil || e.expiresAtMs <= nowMs {
		e = &memoryEntry{state: algorithms.NewState(l.Algorithm)}
	}
	if e.state == nil {
		// Concurrency: slots go through AcquireSlot.
		return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("memory check: %w %s has no State", algorithms.ErrUnknownAlgorithm, l.Algorithm)
	}
	d, g := e.state.Acquire(l, nowMs, cost, want, hold.Milliseconds())
	if d.ResetAfter > 0 {
		e.expiresAtMs = nowMs + d.ResetAfter.Milliseconds()
		sh.states[k] = e
	} else {
		delete(sh.states, k)
	}
	return d, g, nil
}

// Release implements Store. Like the Redis scripts, it never brings back a
// state that has expired.
func (s *MemoryStore) Release(_ context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error) {
	nowMs := s.now().UnixMilli()
	sh := s.shard(base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.states[memoryKey{base, l.Algorithm}]
	if e == nil || e.expiresAtMs <= nowMs || e.state == nil {
		return 0, nil
	}
	return e.state.Release(l, nowMs, units, g), nil
}

// Remote implements Store: the memory store is in process, as fast as a
// lease, so the node neither leases nor caches denials in front of it.
func (s *MemoryStore) Remote() bool { return false }

// Ping implements Store: memory always answers.
func (s *MemoryStore) Ping(context.Context) error { return nil }

// Reset implements Store.
func (s *MemoryStore) Reset(_ context.Context, base string) error {
	sh := s.shard(base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, a := range append(algorithms.Algorithms(), algorithms.Concurrency) {
		delete(sh.states, memoryKey{base, a})
	}
	return nil
}

// Len returns the number of states held (expired ones not yet swept
// included). For tests and status pages.
func (s *MemoryStore) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.states)
		sh.mu.Unlock()
	}
	return n
}

// Describe implements Store.
func (s *MemoryStore) Describe() string { return "memory (embedded, single node)" }

// Close implements Store: it stops the sweeper.
func (s *MemoryStore) Close() error {
	close(s.stop)
	<-s.done
	return nil
}

func (s *MemoryStore) sweepLoop(every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sweep()
		}
	}
}

// sweep drops expired states so that keys seen once do not stay forever.
func (s *MemoryStore) sweep() {
	nowMs := s.now().UnixMilli()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, e := range sh.states {
			if e.expiresAtMs <= nowMs {
				delete(sh.states, k)
			}
		}
		sh.mu.Unlock()
	}
}
