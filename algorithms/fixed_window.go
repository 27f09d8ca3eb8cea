package algorithms

import "time"

// FixedWindowState is one key's fixed window: the units spent in the window
// that starts at w. Windows are aligned to multiples of the period since the
// Unix epoch. The zero value is a fresh state (nothing spent). Like every
// State, it is not safe for concurrent use.
//
// It mirrors scripts/fixed_window.lua (HASH base:fw, fields w and n); the
// rules are docs/algorithms.md, "Fixed window".
type FixedWindowState struct {
	w    int64 // start of the window used counts, ms since the Unix epoch
	used int64 // units spent in window w
}

// Check implements State. It writes only when it admits a positive cost.
func (s *FixedWindowState) Check(l Limit, nowMs, cost int64) Decision {
	lim, p := l.Limit, l.PeriodMillis()
	c := max(cost, 1)

	// The stored window, aligned to this limit's period: a no-op unless the
	// key's period changed. A clock that went backwards stays in the newest
	// window written, so it can never reopen (and spend again) an earlier one.
	sw := s.w - s.w%p
	w := max(nowMs-nowMs%p, sw)
	used := int64(0)
	if w == sw {
		used = s.used
	}

	allowed := used+c <= lim
	if allowed && cost > 0 {
		used += cost
		s.w, s.used = w, used
	}

	// used exceeds lim only when the key's limit shrank since it was spent.
	d := Decision{Allowed: allowed, Limit: lim, Remaining: max(0, lim-used)}
	if used > 0 {
		d.ResetAfter = time.Duration(w+p-nowMs) * time.Millisecond
	}
	if !allowed {
		// The next window is empty and c ≤ limit, so its start is the
		// earliest moment the same cost fits.
		d.RetryAfter = time.Duration(w+p-nowMs) * time.Millisecond
	}
	return d
}
