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
// It mirrors scripts/gcra.lua and scripts/release_gcra.lua (STRING
// base:gc3, "tat r"); the rules are docs/algorithms.md, "GCRA" and "Leases". Decisions equal go-redis/redis_rate's for the
// same rate, period and burst, with waits rounded up to whole ms and without
// its -1 sentinels, except that a denied cost reports the units that do
// remain (redis_rate reports 0) and cost 0 asks whether one unit fits.
type GCRAState struct {
	tatMs   int64 // tat's whole ms since the Unix epoch; only a Release moves it back
	tatFrac int64 // tat's fraction of a ms, in 1/a ms, 0 ≤ tatFrac < a
}

// Check implements State. It writes only when it admits a positive cost.
func (s *GCRAState) Check(l Limit, nowMs, cost int64) Decision {
	d, _ := s.Acquire(l, nowMs, cost, cost, 0)
	return d
}

// ahead returns x, how far tat lies beyond nowMs in 1/a ms (0 once tat has
// passed), capped at top, and whether the cap acted.
func (s *GCRAState) ahead(a, top, nowMs int64) (x int64, capped bool) {
	ahead := s.tatMs - nowMs
	if ahead < 0 {
		return 0, false
	}
	// A write never puts tat more than top (MaxCharge × b, a charge's
	// deepest debt) beyond the now it was made at, so it lies further only
	// if the clock went backwards or the limit changed. Capping there reads
	// the key as owing its most, and checking before multiplying keeps
	// ahead × a ≤ top.
	if ahead > top/a {
		return top, true
	}
	x = ahead*a + min(s.tatFrac, a-1)
	return min(top, x), x > top
}

// Acquire implements State. It sets no bound on when granted units are
// spent: emissions taken early are only ever more conservative.
func (s *GCRAState) Acquire(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	return s.acquire(l, nowMs, cost, want, false)
}

// Charge implements State: a cost that does not fit pushes tat on all the
// same, beyond the burst tolerance; time catches up with the excess before
// any cost fits again.
func (s *GCRAState) Charge(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	return s.acquire(l, nowMs, cost, want, true)
}

// acquire is Acquire, or Charge when charge.
func (s *GCRAState) acquire(l Limit, nowMs, cost, want int64, charge bool) (Decision, Grant) {
	capacity := l.Capacity()
	a, b := l.Rate()
	c := max(cost, 1)
	// full is the whole burst tolerance, capacity × T, in 1/a ms; top the
	// furthest a charge may push tat, MaxCharge × T.
	full, top := capacity*b, l.MaxCharge()*b
	x, _ := s.ahead(a, top, nowMs)

	// room is how far tat may lie beyond now for c more units to fit:
	// allowed ⇔ x + c × b ≤ full, rearranged so no sum exceeds full.
	room := (capacity - c) * b
	var g Grant
	d := Decision{Limit: capacity}
	if x <= room {
		d.Allowed = true
		if cost > 0 {
			g.Units = grantSize(cost, want, (full-x)/b)
			x += g.Units * b
			s.tatMs, s.tatFrac = nowMs+x/a, x%a
		}
	} else if charge && cost > 0 {
		// x, cost × b ≤ 2^52 each: the sum is exact in Lua too.
		x = min(x+cost*b, top)
		s.tatMs, s.tatFrac = nowMs+x/a, x%a
	}
	d.Remaining = max(0, full-x) / b
	d.ResetAfter = waitDuration(ceilDiv(x, a))
	switch {
	case d.Allowed:
	case c > capacity:
		// A charge that can never fit: when the quota is whole again.
		d.RetryAfter = d.ResetAfter
	default:
		d.RetryAfter = waitDuration(ceilDiv(x-room, a))
	}
	return d, g
}

// Release implements State: it moves tat back by the units' emission
// intervals, but not before nowMs. A tat the check reads capped (the clock
// went backwards or the limit changed) is left alone: moving it back from
// the cap could read looser than the tat without those units.
func (s *GCRAState) Release(l Limit, nowMs, units int64, g Grant) int64 {
	a, b := l.Rate()
	u := releaseUnits(l, units, g)
	x, capped := s.ahead(a, l.MaxCharge()*b, nowMs)
	if u <= 0 || capped || x <= 0 {
		return 0
	}
	// A partly emitted unit still counts as one given back.
	returned := min(u, ceilDiv(x, b))
	x = max(0, x-u*b)
	s.tatMs, s.tatFrac = nowMs+x/a, x%a
	return returned
}
