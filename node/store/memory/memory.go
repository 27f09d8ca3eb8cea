// Package memory is the embedded store: the Go models of the algorithms
// (package algorithms) in process memory, a single node's authority. It
// holds:
//
//   - Store, which implements node.Store and node.SlotStore, and is never
//     shared: its state is lost when the process exits;
//   - Config, which bounds the states it holds (a full store refuses new
//     keys with node.ErrStoreFull rather than forget a limit's state).
package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/node"
)

// numShards spreads keys over independently locked maps so that checks
// for different keys rarely contend.
const numShards = 64

// DefaultMaxKeys is Config.MaxKeys's default. A state held
// costs the process about 2.6 KB of resident memory with a 1 KiB key and
// about 500 bytes with a 30-byte one (measured under a flood of checks,
// the garbage collector's headroom included), so a full store stays under
// about 650 MB: an attacker who fills it gets refusals, not an
// out-of-memory kill that would lose every limit's state.
const DefaultMaxKeys = 250_000

// Config configures the embedded store. The zero value is the
// default.
type Config struct {
	// MaxKeys bounds the states the store holds, one per key and algorithm
	// with state (expired states count until swept). At the bound a check
	// that would add a state fails with node.ErrStoreFull, and the store sweeps
	// expired states at once (at most once a second) to make room. Refusing
	// is the safe choice: evicting a state would forget what its key has
	// spent and so loosen its limit. 0 means DefaultMaxKeys.
	MaxKeys int
	// SweepEvery is how often expired states are dropped. 0 means one
	// minute.
	SweepEvery time.Duration
	// Now is the store's clock; nil means time.Now.
	Now func() time.Time
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	switch {
	case c.MaxKeys < 0:
		return fmt.Errorf("memory max keys: %w: %d must be > 0 (0 means %d)", node.ErrInvalidConfig, c.MaxKeys, DefaultMaxKeys)
	case c.SweepEvery < 0:
		return fmt.Errorf("memory sweep interval: %w: %s must not be negative", node.ErrInvalidConfig, c.SweepEvery)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultMaxKeys
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

// Store is the embedded store: the Go models of the algorithms in
// process memory. It is a single node's authority; its state is lost when the
// process exits. It holds at most Config.MaxKeys states. Safe for
// concurrent use.
type Store struct {
	now     func() time.Time
	maxKeys int64
	seed    maphash.Seed
	shards  [numShards]stateShard
	// keys counts the states in all shards; a state is added only after
	// keys has made room for it.
	keys    atomic.Int64
	refused atomic.Int64
	// shares are the members' published demand (shares.go).
	shares shareTable
	// unregister stops the store's metrics (telemetry.go); nil without.
	unregister func()
	// sweepNow asks the sweeper for an early sweep (the store is full).
	sweepNow chan struct{}
	stop     chan struct{}
	done     chan struct{}
}

type stateShard struct {
	mu     sync.Mutex
	states map[stateKey]*entry
	// reservations are the records of reservations.go, by base and id.
	reservations map[reservationKey]*heldReservation
}

type stateKey struct {
	base      string
	algorithm algorithms.Algorithm
}

type entry struct {
	state algorithms.State
	// slots replaces state for algorithms.Concurrency (memory_slots.go).
	slots *algorithms.ConcurrencyState
	// expiresAtMs is when the state became equivalent to a fresh one (the
	// decision's ResetAfter), the analogue of the Redis TTL.
	expiresAtMs int64
}

// New returns an empty memory store with the default key bound,
// reading time from now (nil means time.Now). It sweeps expired states
// every sweepEvery (0 means one minute) until Close.
func New(now func() time.Time, sweepEvery time.Duration) *Store {
	return newStore(Config{Now: now, SweepEvery: max(0, sweepEvery)}.withDefaults())
}

// Open returns an empty memory store configured by cfg (defaulted
// and validated). It sweeps expired states until Close.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newStore(cfg.withDefaults()), nil
}

func newStore(cfg Config) *Store {
	s := &Store{
		now: cfg.Now, maxKeys: int64(cfg.MaxKeys), seed: maphash.MakeSeed(),
		sweepNow: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	for i := range s.shards {
		s.shards[i].states = make(map[stateKey]*entry)
		s.shards[i].reservations = make(map[reservationKey]*heldReservation)
	}
	go s.sweepLoop(cfg.SweepEvery)
	return s
}

// shard is where base's states live: chosen by its family, so that Reset
// finds every variant in one shard.
func (s *Store) shard(base string) *stateShard {
	family, _ := node.SplitBase(base)
	return &s.shards[maphash.String(s.seed, family)%numShards]
}

// Acquire implements node.Store. It never blocks on I/O. Its only error is
// node.ErrStoreFull, for a check that would add a state to a full store; a check
// that leaves nothing to remember (cost 0, a denial that is no charge) never
// fails.
func (s *Store) Acquire(_ context.Context, r node.AcquireRequest) (algorithms.Decision, algorithms.Grant, error) {
	nowMs := s.now().UnixMilli()
	sh := s.shard(r.Base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return s.acquireLocked(sh, r, nowMs)
}

// acquireLocked is Acquire at nowMs with sh, r.Base's shard, locked.
func (s *Store) acquireLocked(sh *stateShard, r node.AcquireRequest, nowMs int64) (algorithms.Decision, algorithms.Grant, error) {
	base, l := r.Base, r.Limit
	k := stateKey{base, l.Algorithm}
	e, held := sh.states[k]
	if !held || e.expiresAtMs <= nowMs {
		// A fresh state: decided on a copy, so that a refusal below leaves
		// nothing behind.
		e = &entry{state: algorithms.NewState(l.Algorithm)}
	}
	if e.state == nil {
		// Concurrency: slots go through AcquireSlot.
		return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("memory check: %w %s has no State", algorithms.ErrUnknownAlgorithm, l.Algorithm)
	}
	decide := e.state.Acquire
	if r.Charge {
		decide = e.state.Charge
	}
	d, g := decide(l, nowMs, r.Cost, r.Want, r.Hold.Milliseconds())
	switch {
	case d.ResetAfter > 0 && !held:
		if !s.reserve() {
			return algorithms.Decision{}, algorithms.Grant{}, fmt.Errorf("%w: it holds %d keys, its maximum; retry when some expire", node.ErrStoreFull, s.maxKeys)
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
func (s *Store) reserve() bool {
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

// Release implements node.Store. Like the Redis scripts, it never brings back a
// state that has expired.
func (s *Store) Release(_ context.Context, base string, l algorithms.Limit, units int64, g algorithms.Grant) (int64, error) {
	nowMs := s.now().UnixMilli()
	sh := s.shard(base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.states[stateKey{base, l.Algorithm}]
	if e == nil || e.expiresAtMs <= nowMs || e.state == nil {
		return 0, nil
	}
	return e.state.Release(l, nowMs, units, g), nil
}

// Remote implements node.Store: the memory store is in process, as fast as a
// lease, so the node neither leases nor caches denials in front of it.
func (s *Store) Remote() bool { return false }

// Ping implements node.Store: memory always answers.
func (s *Store) Ping(context.Context) error { return nil }

// Reset implements node.Store.
func (s *Store) Reset(_ context.Context, base string) error {
	sh := s.shard(base)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, a := range append(algorithms.Algorithms(), algorithms.Concurrency) {
		k := stateKey{base, a}
		if _, held := sh.states[k]; held {
			delete(sh.states, k)
			s.keys.Add(-1)
		}
	}
	return nil
}

// ResetInline implements node.Store: it scans the family's shard (a 64th of the
// states).
func (s *Store) ResetInline(_ context.Context, family string) error {
	sh := s.shard(family)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for k := range sh.states {
		if f, variant := node.SplitBase(k.base); f == family && variant != "" {
			delete(sh.states, k)
			s.keys.Add(-1)
		}
	}
	return nil
}

// Len returns the number of states held (expired ones not yet swept
// included), at most MaxKeys. It takes no lock.
func (s *Store) Len() int { return int(s.keys.Load()) }

// MaxKeys returns the most states the store holds.
func (s *Store) MaxKeys() int { return int(s.maxKeys) }

// Refused returns how many checks the store has refused because it was
// full.
func (s *Store) Refused() int64 { return s.refused.Load() }

// Describe implements node.Store.
func (s *Store) Describe() string { return "memory (embedded, single node)" }

// Close implements node.Store: it stops the sweeper.
func (s *Store) Close() error {
	if s.unregister != nil {
		s.unregister()
	}
	close(s.stop)
	<-s.done
	return nil
}

func (s *Store) sweepLoop(every time.Duration) {
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
func (s *Store) sweep() {
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
		for k, r := range sh.reservations {
			if r.expiresAtMs <= nowMs {
				delete(sh.reservations, k)
				s.keys.Add(-1)
			}
		}
		sh.mu.Unlock()
	}
}
