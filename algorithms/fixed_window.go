package algorithms

import "time"

// FixedWindowState is one key's fixed window: the units spent in each
// window that has not ended yet. Windows are aligned to multiples of the
// period since the Unix epoch, and each keeps its own count: a window is
// named by its period and its start, as its Redis key is (WindowKey), so a
// window of another period (the key's policy changed) starts empty. A
// window's count is forgotten once its end has come, as its key expires
// then. The zero value is a fresh state (nothing spent). Like every State,
// it is not safe for concurrent use.
//
// It mirrors scripts/fixed_window.lua and scripts/release_fixed_window.lua
// (one integer STRING per window) and the plain commands a node sends far
// from a window's edge (WindowIncrement); the rules are docs/algorithms.md,
// "Fixed window" and "Leases".
type FixedWindowState struct {
	// windows are the counts of the windows not ended at the newest time
	// seen: one, unless the clock went back or the period changed.
	windows windowCounts
}

// Check implements State. It writes only when it admits a positive cost.
func (s *FixedWindowState) Check(l Limit, nowMs, cost int64) Decision {
	d, _ := s.Acquire(l, nowMs, cost, cost, 0)
	return d
}

// window returns the window a check at nowMs counts in and the units spent
// in it so far, after forgetting the windows that have ended (their keys
// have expired).
func (s *FixedWindowState) window(p, nowMs int64) (w, used int64) {
	s.windows.forget(nowMs, 1)
	w = nowMs - nowMs%p
	return w, s.windows.get(p, w)
}

// Acquire implements State. Granted units must be spent within the window
// they were taken in: the next one would admit them on top of its own limit.
func (s *FixedWindowState) Acquire(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	return s.acquire(l, nowMs, cost, want, false)
}

// Charge implements State: a cost that does not fit still adds to the
// window's count, above the limit, until the window ends.
func (s *FixedWindowState) Charge(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	return s.acquire(l, nowMs, cost, want, true)
}

// acquire is Acquire, or Charge when charge.
func (s *FixedWindowState) acquire(l Limit, nowMs, cost, want int64, charge bool) (Decision, Grant) {
	p := l.PeriodMillis()
	w, used := s.window(p, nowMs)
	d, g, after := fixedWindowDecide(l, w, used, nowMs, cost, want, charge)
	if after != used {
		s.windows.set(p, w, after)
	}
	return d, g
}

// fixedWindowDecide is the fixed window's decision for a check at nowMs in
// the window starting at w, in which used units are spent (clamped to
// [0, MaxCharge]: a count plain commands wrote may lie outside), and the
// window's count after it: what the script and the model decide, and what
// the plain commands' outcome is computed with (WindowIncrement).
func fixedWindowDecide(l Limit, w, used, nowMs, cost, want int64, charge bool) (Decision, Grant, int64) {
	lim, p := l.Limit, l.PeriodMillis()
	c := max(cost, 1)
	used = min(max(used, 0), l.MaxCharge())

	var g Grant
	allowed := used+c <= lim
	if allowed && cost > 0 {
		g = Grant{Units: grantSize(cost, want, lim-used), UseWithin: time.Duration(w+p-nowMs) * time.Millisecond, Ref: w}
		used += g.Units
	}
	if !allowed && charge && cost > 0 {
		used = min(used+cost, l.MaxCharge())
	}

	// used exceeds lim after a charge, or when the key's limit shrank since
	// it was spent.
	d := Decision{Allowed: allowed, Limit: lim, Remaining: max(0, lim-used)}
	if used > 0 {
		d.ResetAfter = time.Duration(w+p-nowMs) * time.Millisecond
	}
	if !allowed {
		// The next window is empty, so its start is the earliest moment
		// the same cost fits, or (c > limit, a charge) the quota is whole.
		d.RetryAfter = time.Duration(w+p-nowMs) * time.Millisecond
	}
	return d, g, used
}

// Release implements State: units go back only to the window they were
// taken in, while it is the current one; once it has ended they are gone
// with it.
func (s *FixedWindowState) Release(l Limit, nowMs, units int64, g Grant) int64 {
	u := releaseUnits(l, units, g)
	p := l.PeriodMillis()
	w, used := s.window(p, nowMs)
	used = min(used, l.MaxCharge())
	if u <= 0 || w != g.Ref || used <= 0 {
		return 0
	}
	returned := min(u, used)
	s.windows.set(p, w, used-returned)
	return returned
}
