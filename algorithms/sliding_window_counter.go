package algorithms

import "time"

// SlidingCounterState is one key's sliding window counter: the units
// spent in each aligned window, of which a check reads the current one and
// the one before it, weighted by how much of it still overlaps the rolling
// period. Each window keeps its own count, named by its period and its
// start as its Redis key is (WindowKey); a window's count is forgotten a
// period after its end, as its key expires then. The zero value is a fresh
// state (nothing spent). Like every State, it is not safe for concurrent
// use.
//
// It mirrors scripts/sliding_window_counter.lua and
// scripts/release_sliding_window_counter.lua (one integer STRING per
// window) and the plain commands a node sends far from a window's edge
// (WindowIncrement); the rules are docs/algorithms.md, "Sliding window
// counter" and "Leases".
type SlidingCounterState struct {
	windows windowCounts
}

// Check implements State. It writes only when it admits a positive cost.
func (s *SlidingCounterState) Check(l Limit, nowMs, cost int64) Decision {
	d, _ := s.Acquire(l, nowMs, cost, cost, 0)
	return d
}

// Acquire implements State. Granted units must be spent within the window
// they were taken in: in the next one they would count only as a weighted
// share of the previous window, on top of its own limit.
func (s *SlidingCounterState) Acquire(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	return s.acquire(l, nowMs, cost, want, false)
}

// Charge implements State: a cost that does not fit still adds to the
// current window's count, above the limit; it weighs on the next window
// as its previous one, fading out over it.
func (s *SlidingCounterState) Charge(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	return s.acquire(l, nowMs, cost, want, true)
}

// acquire is Acquire, or Charge when charge.
func (s *SlidingCounterState) acquire(l Limit, nowMs, cost, want int64, charge bool) (Decision, Grant) {
	p := l.PeriodMillis()
	s.windows.forget(nowMs, 2)
	w := nowMs - nowMs%p
	cur, prev := s.windows.get(p, w), s.windows.get(p, w-p)
	d, g, after := slidingCounterDecide(l, w, cur, prev, nowMs, cost, want, charge)
	if after != cur {
		s.windows.set(p, w, after)
	}
	return d, g
}

// slidingCounterDecide is the sliding counter's decision for a check at
// nowMs in the window starting at w, whose count is cur and the previous
// window's prev (each clamped to [0, MaxCharge]: a count plain commands
// wrote may lie outside), and the window's count after it: what the
// script and the model decide, and what the plain commands' outcome is
// computed with (WindowIncrement).
func slidingCounterDecide(l Limit, w, cur, prev, nowMs, cost, want int64, charge bool) (Decision, Grant, int64) {
	lim, p, most := l.Limit, l.PeriodMillis(), l.MaxCharge()
	c := max(cost, 1)
	// Counts above the limit are a charge's debt, or were spent under a
	// larger limit (the key's limit changed); capping them at MaxCharge
	// keeps prev × period within MaxExact.
	cur, prev = min(max(cur, 0), most), min(max(prev, 0), most)

	// The previous window's share, rounded up so the estimate errs strict.
	// prev × (p - e) ≤ MaxCharge × period ≤ MaxExact.
	e := max(0, nowMs-w)
	pw := (prev*(p-e) + p - 1) / p

	var g Grant
	allowed := pw+cur+c <= lim
	if allowed && cost > 0 {
		g = Grant{Units: grantSize(cost, want, lim-pw-cur), UseWithin: time.Duration(w+p-nowMs) * time.Millisecond, Ref: w}
		cur += g.Units
	}
	if !allowed && charge && cost > 0 {
		cur = min(cur+cost, most)
	}

	d := Decision{Allowed: allowed, Limit: lim, Remaining: max(0, lim-pw-cur)}
	switch {
	case cur > 0:
		d.ResetAfter = time.Duration(w+2*p-nowMs) * time.Millisecond
	case prev > 0:
		d.ResetAfter = time.Duration(w+p-nowMs) * time.Millisecond
	}
	switch {
	case !allowed && c > lim:
		// A charge that can never fit: when the quota is whole again.
		d.RetryAfter = d.ResetAfter
	case !allowed:
		// The cost fits at the first e where ceil(n × (p - e) / p) ≤ room,
		// i.e. e ≥ p - floor(room × p / n), n being the count that is
		// fading out (a charge's debt included). room ≥ 0 makes prev > 0
		// here (pw > room), room < 0 makes cur > 0, so neither division
		// is by zero.
		if room := lim - cur - c; room >= 0 {
			k := room * p / prev
			d.RetryAfter = time.Duration(w+p-k-nowMs) * time.Millisecond
		} else {
			// Only the next window, where prev = cur and cur = 0, has room.
			k := (lim - c) * p / cur
			d.RetryAfter = time.Duration(w+p+max(0, p-k)-nowMs) * time.Millisecond
		}
	}
	return d, g, cur
}

// Release implements State: units go back only to the window they were
// taken in, while it is the current one. The stored count is reduced as
// stored (not as read capped under a smaller limit), so a release never
// reads looser than the count without those units.
func (s *SlidingCounterState) Release(l Limit, nowMs, units int64, g Grant) int64 {
	p := l.PeriodMillis()
	u := releaseUnits(l, units, g)
	s.windows.forget(nowMs, 2)
	w := nowMs - nowMs%p
	cur := s.windows.get(p, w)
	if u <= 0 || w != g.Ref || cur <= 0 {
		return 0
	}
	returned := min(u, cur)
	s.windows.set(p, w, cur-returned)
	return returned
}
