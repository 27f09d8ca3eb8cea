package cluster

import "time"

// The receiving side's memory of what it has already taken: which packet
// numbers of each sender (so that a captured packet played again is
// refused) and which reset ids (so that a reset's retransmission does not
// reset the key again). Both are bounded: the first by the members, the
// second by a count.

// replayWindowLen is how many of a sender's most recent packet numbers a
// receiver remembers. A packet numbered further back than that is refused
// as a replay: senders number their packets in the order they send them,
// and one arriving that late (after 1024 newer ones from the same node) is
// of no use anyway.
const replayWindowLen = 1024

// replayWindow is one sender's packet numbers already taken, as in IPsec's
// anti-replay window: the highest, and a bitmap of the replayWindowLen
// numbers up to it. It is not safe for concurrent use.
type replayWindow struct {
	// top is the highest number taken; 0 before the first (numbers start
	// at 1).
	top uint64
	// seen has bit seq % replayWindowLen set for each number in
	// (top - replayWindowLen, top] taken.
	seen [replayWindowLen / 64]uint64
	// goneAt is when the sender stopped being a member; zero while it is
	// one.
	goneAt time.Time
}

func (w *replayWindow) bit(seq uint64) (word int, mask uint64) {
	i := seq % replayWindowLen
	return int(i / 64), 1 << (i % 64)
}

// take records seq and reports whether it was new: above the window, or
// inside it and not yet taken. It costs at most replayWindowLen/64 word
// operations.
func (w *replayWindow) take(seq uint64) bool {
	switch {
	case seq == 0:
		return false
	case seq > w.top:
		if seq-w.top >= replayWindowLen {
			clear(w.seen[:])
		} else {
			for s := w.top + 1; s <= seq; s++ {
				word, mask := w.bit(s)
				w.seen[word] &^= mask
			}
		}
		w.top = seq
	case w.top-seq >= replayWindowLen:
		return false
	default:
		if word, mask := w.bit(seq); w.seen[word]&mask != 0 {
			return false
		}
	}
	word, mask := w.bit(seq)
	w.seen[word] |= mask
	return true
}

const (
	// resetMemory is how long a reset's id is remembered, so that
	// retransmissions do not reset the key again and drop leases taken
	// since; memberlist stops retransmitting within seconds.
	resetMemory = time.Minute
	// maxResetIDs bounds the reset ids remembered. Beyond it the oldest
	// is forgotten early: at worst a retransmission of that reset, if one
	// is still coming, resets the key again (dropping a lease, which only
	// costs a store call).
	maxResetIDs = 4096
)

// recentIDs remembers ids for resetMemory, at most maxResetIDs of them,
// oldest first out. Each add costs O(1) amortised time and the memory is
// fixed once full, whatever arrives. It is not safe for concurrent use.
type recentIDs struct {
	set map[uint64]struct{}
	// ring holds the ids in arrival order: n of them from head, wrapping.
	ring    []idAt
	head, n int
}

type idAt struct {
	id uint64
	at time.Time
}

// add records id at now and reports whether it was new. now must not go
// backwards between calls (a monotonic reading).
func (r *recentIDs) add(id uint64, now time.Time) bool {
	if r.set == nil {
		r.set = make(map[uint64]struct{})
		r.ring = make([]idAt, maxResetIDs)
	}
	if _, ok := r.set[id]; ok {
		return false
	}
	for r.n > 0 && (r.n == len(r.ring) || now.Sub(r.ring[r.head].at) > resetMemory) {
		delete(r.set, r.ring[r.head].id)
		r.head = (r.head + 1) % len(r.ring)
		r.n--
	}
	r.ring[(r.head+r.n)%len(r.ring)] = idAt{id, now}
	r.n++
	r.set[id] = struct{}{}
	return true
}

// len is the number of ids remembered.
func (r *recentIDs) len() int { return r.n }
