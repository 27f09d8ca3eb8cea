package algorithms

import (
	"strconv"
	"time"
)

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
	windows []fixedWindow
}

// fixedWindow is the count of the window of period p that starts at w.
type fixedWindow struct {
	p, w, used int64
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
	kept := s.windows[:0]
	for _, fw := range s.windows {
		if fw.w+fw.p > nowMs {
			kept = append(kept, fw)
		}
	}
	clear(s.windows[len(kept):])
	s.windows = kept
	w = nowMs - nowMs%p
	for _, fw := range s.windows {
		if fw.p == p && fw.w == w {
			return w, fw.used
		}
	}
	return w, 0
}

// set records used as the count of the window of period p starting at w.
func (s *FixedWindowState) set(p, w, used int64) {
	for i := range s.windows {
		if s.windows[i].p == p && s.windows[i].w == w {
			s.windows[i].used = used
			return
		}
	}
	s.windows = append(s.windows, fixedWindow{p: p, w: w, used: used})
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
		s.set(p, w, after)
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
	s.set(p, w, used-returned)
	return returned
}

// WindowKey is the Redis key of the window of period periodMs starting at
// startMs, for a window algorithm whose key prefix is prefix (Keys: the
// prefix is in the limit's hash tag, so every window is in its slot):
// "prefix:period:start".
func WindowKey(prefix string, periodMs, startMs int64) string {
	b := make([]byte, 0, len(prefix)+32)
	b = append(b, prefix...)
	b = append(b, ':')
	b = strconv.AppendInt(b, periodMs, 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, startMs, 10)
	return string(b)
}

// ScriptKeys returns the KEYS of a check script call of limit l stored
// under base, made at about nowMs on Redis's clock: Keys, except for a
// fixed window, whose state is one key per window: the key of the window
// of nowMs. Redis Cluster routes a script by the keys it names (while a
// slot moves, to where they are), so a fixed window's check names the
// window it will most likely count in; near an edge the script counts in
// the window of its own clock, the one beside it, in the same slot.
func ScriptKeys(l Limit, base string, nowMs int64) []string {
	keys := Keys(l.Algorithm, base)
	if l.Algorithm == FixedWindow {
		p := l.PeriodMillis()
		keys[0] = WindowKey(keys[0], p, nowMs-nowMs%p)
	}
	return keys
}

// ReleaseKeys returns the KEYS of a release script call giving back units
// of grant g of limit l stored under base: Keys, except for a fixed
// window: the key of the grant's window, the only one it can go back to.
func ReleaseKeys(l Limit, base string, g Grant) []string {
	keys := Keys(l.Algorithm, base)
	if l.Algorithm == FixedWindow {
		keys[0] = WindowKey(keys[0], l.PeriodMillis(), g.Ref)
	}
	return keys
}
