package algorithms

import "time"

// FixedWindowState is one key's fixed window: the units spent in the window
// that starts at w. Windows are aligned to multiples of the period since the
// Unix epoch. The zero value is a fresh state (nothing spent). Like every
// State, it is not safe for concurrent use.
//
// It mirrors scripts/fixed_window.lua and scripts/release_fixed_window.lua
// (STRING base:fw3, "w n"); the rules are docs/algorithms.md, "Fixed
// window" and "Leases".
type FixedWindowState struct {
	w    int64 // start of the window used counts, ms since the Unix epoch
	used int64 // units spent in window w
}

// Check implements State. It writes only when it admits a positive cost.
func (s *FixedWindowState) Check(l Limit, nowMs, cost int64) Decision {
	d, _ := s.Acquire(l, nowMs, cost, cost, 0)
	return d
}

// window returns the window a check at nowMs counts in and the units spent
// in it so far.
func (s *FixedWindowState) window(p, nowMs int64) (w, used int64) {
	// The stored window, aligned to this limit's period: a no-op unless the
	// key's period changed. A clock that went backwards stays in the newest
	// window written, so it can never reopen (and spend again) an earlier one.
	sw := s.w - s.w%p
	w = max(nowMs-nowMs%p, sw)
	if w == sw {
		used = s.used
	}
	return w, used
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
	lim, p := l.Limit, l.PeriodMillis()
	c := max(cost, 1)
	w, used := s.window(p, nowMs)

	var g Grant
	allowed := used+c <= lim
	if allowed && cost > 0 {
		g = Grant{Units: grantSize(cost, want, lim-used), UseWithin: time.Duration(w+p-nowMs) * time.Millisecond, Ref: w}
		used += g.Units
		s.w, s.used = w, used
	}
	if !allowed && charge && cost > 0 {
		used = min(used+cost, l.MaxCharge())
		s.w, s.used = w, used
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
	return d, g
}

// Release implements State: units go back only to the window they were
// taken in; once it has ended they are gone with it.
func (s *FixedWindowState) Release(l Limit, nowMs, units int64, g Grant) int64 {
	u := releaseUnits(l, units, g)
	w, used := s.window(l.PeriodMillis(), nowMs)
	if u <= 0 || w != g.Ref || used <= 0 {
		return 0
	}
	returned := min(u, used)
	s.used = used - returned
	return returned
}
