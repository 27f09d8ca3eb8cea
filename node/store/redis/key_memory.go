package redis

import (
	"hash/maphash"
	"sync/atomic"
	"time"
)

// keyMemory remembers, roughly, which state keys this node saw holding
// state and until when they will: a check of a key it does not remember
// tries a fresh write (one plain SET, algorithms.Fresh) before the script,
// and one of a key it remembers goes straight to the script. It is only a
// guess, either way safe: a fresh write that finds state writes nothing
// and the check goes to the script, one round trip later; a check sent to
// the script for a key that expired is decided as the script decides
// any. A guess wrong one way costs a round trip, the other way Redis CPU.
// The window algorithms' plain checks (windows.go) use it the same way for
// a window's key (which has its TTL once seen counting) and for a previous
// window read empty.
//
// It is a fixed table of keyMemorySlots words, each a key hash's top bits
// and a time, written and read with atomics: no lock, no allocation, and a
// bound on memory however many keys pass. Two keys sharing a slot evict
// each other; a key another key's tag matches by chance (1 in 2^24) is
// remembered wrongly, which costs only the script call.
type keyMemory struct {
	seed  maphash.Seed
	epoch time.Time
	slots []atomic.Uint64
}

const (
	// keyMemorySlots is the table's size, a power of two: 8 MiB, so that
	// a node checking a hundred thousand keys again and again within their
	// windows (keys that stay warm for an hour) still knows most of them
	// (a slot shared 1 time in 20); beyond, freshGuard limits the cost of
	// wrong guesses.
	keyMemorySlots = 1 << 20
	// untilBits hold a slot's time, in ms since the table's epoch (34
	// years); the bits above hold its key's tag.
	untilBits = 40
	untilMask = 1<<untilBits - 1
)

func newKeyMemory() *keyMemory {
	return &keyMemory{seed: maphash.MakeSeed(), epoch: time.Now(), slots: make([]atomic.Uint64, keyMemorySlots)}
}

// slot returns key's slot and its tag.
func (m *keyMemory) slot(key string) (*atomic.Uint64, uint64) {
	h := maphash.String(m.seed, key)
	return &m.slots[h&(keyMemorySlots-1)], h >> untilBits
}

// since returns t in ms since the epoch, at least 1, at most untilMask.
func (m *keyMemory) since(t time.Time) uint64 {
	return uint64(min(max(t.Sub(m.epoch).Milliseconds(), 1), untilMask))
}

// holds reports whether key was last seen holding state that lives past
// now.
func (m *keyMemory) holds(key string, now time.Time) bool {
	s, tag := m.slot(key)
	v := s.Load()
	return v>>untilBits == tag && v&untilMask > m.since(now)
}

// note remembers that key holds state for about lifeMs ms from now (its
// TTL as last seen): past that, the key is likely gone. Any lifeMs ≥ 0
// does, however long (a TTL of centuries is remembered for 34 years).
func (m *keyMemory) note(key string, now time.Time, lifeMs int64) {
	s, tag := m.slot(key)
	until := m.since(now) + uint64(min(max(lifeMs, 0), untilMask))
	s.Store(tag<<untilBits | min(until, untilMask))
}
