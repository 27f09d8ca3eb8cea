package node

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// memoryShards spreads keys over independently locked maps so that checks
// for different keys rarely contend.
const memoryShards = 64

// DefaultMemoryMaxKeys is MemoryConfig.MaxKeys's default. A state held
// costs the process about 2.6 KB of resident memory with a 1 KiB key and
// about 500 bytes with a 30-byte one (measured under a flood of checks,
// the garbage collector's headroom included), so a full store stays under
// about 650 MB: an attacker who fills it gets refusals, not an
// out-of-memory kill that would lose every limit's state.
const DefaultMemoryMaxKeys = 250_000

// ErrStoreFull means the memory store holds MemoryConfig.MaxKeys states and
// refused to add another. Keys it already holds are still decided. It is
// not a store failure (the failure mode does not apply: failing open would
// stop limiting new keys), and retrying after the full keys' states expire
// may succeed.
var ErrStoreFull = errors.New("memory store full")

// MemoryConfig configures the embedded store. The zero value is the
// default.
type MemoryConfig struct {
	// MaxKeys bounds the states the store holds, one per key and algorithm
	// with state (expired states count until swept). At the bound a check
	// that would add a state fails with ErrStoreFull, and the store sweeps
	// expired states at once (at most once a second) to make room. Refusing
	// is the safe choice: evicting a state would forget what its key has
	// spent and so loosen its limit. 0 means DefaultMemoryMaxKeys.
	MaxKeys int
	// SweepEvery is how often expired states are dropped. 0 means one
	// minute.
	SweepEvery time.Duration
	// Now is the store's clock; nil means time.Now.
	Now func() time.Time
}

// Validate reports the first problem with c.
func (c MemoryConfig) Validate() error {
	switch {
	case c.MaxKeys < 0:
		return fmt.Errorf("memory max keys: %w: %d must be > 0 (0 means %d)", ErrInvalidConfig, c.MaxKeys, DefaultMemoryMaxKeys)
	case c.SweepEvery < 0:
		return fmt.Errorf("memory sweep interval: %w: %s must not be negative", ErrInvalidConfig, c.SweepEvery)
	}
	return nil
}

func (c MemoryConfig) withDefaults() MemoryConfig {
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultMemoryMaxKeys
	}
	if c.SweepEvery == 0 {
		c.SweepEvery = time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// minSweepGap is the least time between two sweeps that a full store asks
// for: each walks every state.
const minSweepGap = time.Second

// MemoryStore is the embedded store: the Go models of the algorithms in
// process memory. It is a single node's authority; its state is lost when the
// process exits. It holds at most MemoryConfig.MaxKeys states. Safe for
// concurrent use.
type MemoryStore struct {
	now     func() time.Time
	maxKeys int64
	seed    maphash.Seed
	shards  [memoryShards]memoryShard
	// keys counts the states in all shards; a state is added only after
	// keys has made room for it.
	keys    atomic.Int64
	refused atomic.Int64
	// sweepNow asks the sweeper for an early sweep (the store is full).
	sweepNow chan struct{}
	stop     chan struct{}
	done     chan struct{}
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

// NewMemoryStore returns an empty memory store with the default key bound,
// reading time from now (nil means time.Now). It sweeps expired states
// every sweepEvery (0 means one minute) until Close.
func NewMemoryStore(now func() time.Time, sweepEvery time.Duration) *MemoryStore {
	return newMemoryStore(MemoryConfig{Now: now, SweepEvery: max(0, sweepEvery)}.withDefaults())
}

// OpenMemoryStore returns an empty memory store configured by cfg (defaulted
// and validated). It sweeps expired states until Close.
func OpenMemoryStore(cfg MemoryConfig) (*MemoryStore, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newMemoryStore(cfg.withDefaults()), nil
}

func newMemoryStore(cfg MemoryConfig) *MemoryStore {
	s := &MemoryStore{
		now: cfg.Now, maxKeys: int64(cfg.MaxKeys), seed: maphash.MakeSeed(),
		sweepNow: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].states = make(map[memoryKey]*memoryEntry)
	}
	go s.sweepLoop(cfg.SweepEvery)
	return s
}

// shard is where base's states live: chosen by its family, so that Reset
// finds every variant in one shard.
func (s *MemoryStore) shard(base string) *memoryShard {
	family, _ := splitBase(base)
	return &s.shards[maphash.String(s.seed, family)%memoryShards]
}

// Acquire implements Store. It never blocks on I/O. Its only error is
// ErrStoreFull, for a check that would add a state to a full store; a check
// that leaves nothing to remember (cost 0, a denial) never fails.
func (s *MemoryStore) Acquire(_ context.Context, base string, l algorithms.Limit, cost, want int64, hold time.Duration) (algorithms.Decision, algorithms.Grant, error) {
	nowMs := s.now().UnixMilli()
	k := memoryKey{base, l.Algorithm}
	sh := s.shard(base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, held := sh.states[k]
	if !held || e.expiresAtMs <= nowMs {
		// A fresh state: decided on a copy, so that a refusal below leaves
		// nothing behind.
		e = &memoryEntry{state: algorithms.NewState(l.Algorithm)}
	}
	if e.state == nil {
		// Concurrency: slots go through AcquireSlot.
		return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("memory check: %w %s has no State", algorithms.ErrUnknownAlgorithm, l.Algorithm)
	}
	d, g := e.state.Acquire(l, nowMs, cost, want, hold.Milliseconds())
	switch {
	case d.ResetAfter > 0 && !held:
		if !s.reserve() {
			return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("%w: it holds %d keys, its maximum; retry when some expire", ErrStoreFull, s.maxKeys)
		}
		e.expiresAtMs = nowMs + d.ResetAfter.Milliseconds()
		sh.states[k] = e
	case d.ResetAfter > 0:
		e.expiresAtMs = nowMs + d.ResetAfter.Milliseconds()
		sh.states[k] = e
	case held:
		delete(sh.states, k)
		s.keys.Add(-1)
	}
	return d, g, nil
}

// reserve makes room for one more state, or reports that the store is full
// (and asks for an early sweep).
func (s *MemoryStore) reserve() bool {
	if s.keys.Add(1) <= s.maxKeys {
		return true
	}
	s.keys.Add(-1)
	s.refused.Add(1)
	select {
	case s.sweepNow <- struct{}{}:
	default:
	}
	return false
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
		k := memoryKey{base, a}
		if _, held := sh.states[k]; held {
			delete(sh.states, k)
			s.keys.Add(-1)
		}
	}
	return nil
}

// ResetInline implements Store: it scans the family's shard (a 64th of the
// states).
func (s *MemoryStore) ResetInline(_ context.Context, family string) error {
	sh := s.shard(family)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for k := range sh.states {
		if f, variant := splitBase(k.base); f == family && variant != "" {
			delete(sh.states, k)
			s.keys.Add(-1)
		}
	}
	return nil
}

// Len returns the number of states held (expired ones not yet swept
// included), at most MaxKeys. It takes no lock.
func (s *MemoryStore) Len() int { return int(s.keys.Load()) }

// MaxKeys returns the most states the store holds.
func (s *MemoryStore) MaxKeys() int { return int(s.maxKeys) }

// Refused returns how many checks the store has refused because it was
// full.
func (s *MemoryStore) Refused() int64 { return s.refused.Load() }

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
	var last time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.sweepNow:
			// A full store asks on every refusal; one walk a second is
			// enough to find what has expired.
			if time.Since(last) < minSweepGap {
				continue
			}
		}
		s.sweep()
		last = time.Now()
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
				s.keys.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}
