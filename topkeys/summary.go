package topkeys

// summary is a Space-Saving summary (Metwally, Agrawal and El Abbadi,
// "Efficient computation of frequent and top-k elements in data streams",
// 2005) of the keys added during one interval. It holds at most m keys, m
// fixed when it is made. A tracked key's count over-estimates its true count
// by at most its err; a key that is not tracked was added at most minCount
// times. Every key added more than total/m times is tracked.
//
// Its slices are allocated once, so adding never allocates. It is not safe
// for concurrent use: the policy that owns it holds its lock.
type summary struct {
	// epoch is the interval the summary counts (see Tracker.Advance).
	epoch uint64
	// n slots are in use; total keys were added.
	n     int
	total uint64
	// Slot i tracks keys[i] (hash hashes[i]): counted counts[i] times, of
	// which up to errs[i] may belong to keys it replaced.
	hashes []uint64
	keys   []string
	counts []uint64
	errs   []uint64
}

func newSummary(m int) summary {
	return summary{
		hashes: make([]uint64, m),
		keys:   make([]string, m),
		counts: make([]uint64, m),
		errs:   make([]uint64, m),
	}
}

// reset empties the summary for interval epoch. Forgotten keys are cleared
// so the summary does not keep their bytes alive.
func (s *summary) reset(epoch uint64) {
	clear(s.keys[:s.n])
	s.n, s.total, s.epoch = 0, 0, epoch
}

// add counts one occurrence of key, whose hash is h.
func (s *summary) add(key string, h uint64) {
	s.total++
	for i := range s.n {
		if s.hashes[i] == h && s.keys[i] == key {
			s.counts[i]++
			return
		}
	}
	if s.n < len(s.counts) {
		i := s.n
		s.n++
		s.hashes[i], s.keys[i], s.counts[i], s.errs[i] = h, key, 1, 0
		return
	}
	// Full: the newcomer takes the slot of the least counted key and
	// inherits its count, which is all it may have missed while untracked.
	low := s.minSlot()
	s.hashes[low], s.keys[low] = h, key
	s.errs[low] = s.counts[low]
	s.counts[low]++
}

// minSlot is the slot with the lowest count; the summary must not be empty.
func (s *summary) minSlot() int {
	low := 0
	for i := 1; i < s.n; i++ {
		if s.counts[i] < s.counts[low] {
			low = i
		}
	}
	return low
}

// minCount bounds how often an untracked key was added: the lowest count
// when the summary is full, else 0 (every key added is then tracked).
func (s *summary) minCount() uint64 {
	if s.n < len(s.counts) {
		return 0
	}
	return s.counts[s.minSlot()]
}
