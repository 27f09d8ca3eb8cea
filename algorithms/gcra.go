package algorithms

// GCRAState is one key's generic cell rate algorithm state: the theoretical
// arrival time (tat) of the next request if requests came exactly at the
// rate. Each admitted unit pushes tat one emission interval T = Period/Limit
// later; a cost is admitted while tat stays within Limit.Capacity intervals
// of now. With the rate reduced to a/b (a units every b ms, see Limit.Rate),
// T = b/a ms and tat = tatMs + tatFrac/a exactly.
//
// The zero value is a fresh state: tat in the past, as for a key never seen
// (the scripts read a missing key as tat = now, which decides the same).
//
// It mirrors scripts/gcra.lua (HASH base:gc, fields tat and r); the rules are
// docs/algorithms.md, "GCRA". Decisions equal go-redis/redis_rate's for the
// same rate, period and burst, with waits rounded up to whole ms and without
// its -1 sentinels, except that a denied cost reports the units that do
// remain (redis_rate reports 0) and cost 0 asks whether one unit fits.
type GCRAState struct {
	tatMs   int64 // tat's whole ms since the Unix epoch; never decreases
	tatFrac int64 // tat's fraction of a ms, in 1/a ms, 0 ≤ tatFrac < a
}

// Check implements State. It writes only when it admits a positive cost.
func (s *GCRAState) Check(l Limit, nowMs, cost int64) Decision {
	capacity := l.Capacity()
	a, b := l.Rate()
	c := max(cost, 1)
	// full is the whole burst tolerance, capacity × T, in 1/a ms.
	full := capacity * b

	// x is how far tat lies beyond now, in 1/a ms; 0 once tat has passed.
	var x int64
	if ahead := s.tatMs - nowMs; ahead >= 0 {
		// A write never puts tat more than full beyond the now it was made
		// at, so it lies further only if the clock went backwards or the
		// limit shrank. Capping there reads the bucket as exhausted, and
		// checking before multiplying keeps ahead × a ≤ full.
		if ahead > full/a {
			x = full
		} else {
			x = min(full, ahead*a+min(s.tatFrac, a-1))
		}
	}

	// room is how far tat may lie beyond now for c more units to fit:
	// allowed ⇔ x + c × b ≤ full, rearranged so no sum exceeds full.
	room := (capacity - c) * b
	d := Decision{Limit: capacity}
	if x <= room {
		d.Allowed = true
		if cost > 0 {
			x += cost * b
			s.tatMs, s.tatFrac = nowMs+x/a, x%a
		}
	} else {
		d.RetryAfter = waitDuration(ceilDiv(x-room, a))
	}
	d.Remaining = (full - x) / b
	d.ResetAfter = waitDuration(ceilDiv(x, a))
	return d
}
