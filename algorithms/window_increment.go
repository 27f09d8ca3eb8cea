package algorithms

// WindowIncrement is a fixed window check made with plain commands instead
// of the script, by a node that knows which window Redis's clock is in for
// the whole time the check may take (far from the window's edges):
//
//	INCRBY Key By
//	PEXPIREAT Key ExpireAtMs NX
//
// sent together, or GET Key alone when By is 0 (a check of cost 0). The
// window's key holds the integer count the script reads and writes (see
// scripts/fixed_window.lua), so INCRBY adds to what every node and script
// counts, and the reply, less By, is what was spent before. Outcome
// decides the check on that count exactly as the script would have on the
// same count; what the check took beyond its decision (all of By for a
// denial, the rest of a lease's want beyond its grant) must then be given
// back with GiveBack's commands. Until it is, the count is higher than what
// was spent, so other checks meanwhile are decided stricter, never looser:
// no window ever admits more than its limit.
//
// PEXPIREAT ... NX gives a key the INCRBY created its TTL, the window's
// end, and leaves a key that has one as it is.
type WindowIncrement struct {
	l          Limit
	w          int64
	cost, want int64
	charge     bool
	Key        string
	By         int64
	ExpireAtMs int64
}

// FixedWindowIncrement returns the plain commands of a check of cost (a
// lease would like want ≥ cost; a charge when charge) of fixed window limit
// l, whose window keys have the prefix Keys(FixedWindow, base)[0], in the
// window that starts at windowStartMs, and true; or false when the check
// must go to the script: l is not a fixed window, or the cost is above the
// capacity (a plain check of it is denied without writing; a charge of it
// is capped at MaxCharge, which INCRBY cannot do). l and cost must be valid
// and windowStartMs a multiple of l's period.
func FixedWindowIncrement(l Limit, prefix string, windowStartMs, cost, want int64, charge bool) (WindowIncrement, bool) {
	if l.Algorithm != FixedWindow || cost < 0 || cost > l.Capacity() {
		return WindowIncrement{}, false
	}
	p := l.PeriodMillis()
	wi := WindowIncrement{l: l, w: windowStartMs, cost: cost, want: max(want, cost), charge: charge,
		Key: WindowKey(prefix, p, windowStartMs), ExpireAtMs: windowStartMs + p}
	if cost > 0 {
		wi.By = min(wi.want, l.Capacity())
	}
	return wi, true
}

// Commands are the check's commands: INCRBY and PEXPIREAT ... NX, or (By
// 0) GET and nil.
func (wi WindowIncrement) Commands() (first, then []any) {
	if wi.By == 0 {
		return []any{"get", wi.Key}, nil
	}
	return []any{"incrby", wi.Key, wi.By}, wi.Expire()
}

// Expire is PEXPIREAT ... NX alone: for a node that sent the INCRBY alone,
// guessing the key had its TTL, and found by the reply (By: the count was
// 0) that the INCRBY created it.
func (wi WindowIncrement) Expire() []any {
	return []any{"pexpireat", wi.Key, wi.ExpireAtMs, "nx"}
}

// Outcome is the check's decision and grant at nowMs, a time in the
// window, given count, the reply of INCRBY (or of GET: the count, 0 for a
// missing key), and how many of the By units it took must go back
// (GiveBack).
func (wi WindowIncrement) Outcome(count, nowMs int64) (d Decision, g Grant, giveBack int64) {
	before := count - wi.By
	d, g, after := fixedWindowDecide(wi.l, wi.w, before, nowMs, wi.cost, wi.want, wi.charge)
	kept := after - min(max(before, 0), wi.l.MaxCharge())
	return d, g, wi.By - kept
}

// GiveBack is the commands that give units back to the window:
// DECRBY and PEXPIREAT ... NX, so that a DECRBY that comes after the
// window's key expired leaves nothing behind (the key it creates has its
// end in the past, and goes at once).
func (wi WindowIncrement) GiveBack(units int64) (first, then []any) {
	return []any{"decrby", wi.Key, units}, []any{"pexpireat", wi.Key, wi.ExpireAtMs, "nx"}
}

// Window is the window's start and end, in ms since the Unix epoch.
func (wi WindowIncrement) Window() (startMs, endMs int64) { return wi.w, wi.ExpireAtMs }
