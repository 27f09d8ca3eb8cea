package algorithms

import "strconv"

// FreshWindowWrite is the fresh form of the sliding window counter's
// state: what a check of a key that
// holds no state writes with plain commands instead of a script, as
// FreshWrite does for the buckets and GCRA. A window's state needs its
// window's start, which depends on Redis's clock at the write; the node
// has no such clock, so the value leaves it to the write's own time:
//
//	SET key Value PX TTLMillis NX
//	PEXPIRETIME key
//
// sent together. If the SET replies OK it wrote Value at Redis's time
// PEXPIRETIME - TTLMillis (the write's ms, the clock TIME reads), and
// Outcome of that time is exactly what the check script would have
// decided and written then: the scripts read Value's window field as that
// time (scripts/prelude.lua, parse) and align it to the period, as they
// align every stored window. If the SET replies nil the key holds state
// and the check must go to the script.
//
// TTLMillis outlives the state a script would write (the rest of the
// window, or of the next one for the sliding counter): a key kept longer
// reads as fresh again once its window has passed, so it decides nothing
// differently.
type FreshWindowWrite struct {
	l          Limit
	cost, want int64
	Value      string
	TTLMillis  int64
}

// FreshWindow returns the fresh write of a check of cost (a lease would
// like want) on a key of window limit l that holds no state, and true; or
// false when the check must go to the script: l is not a sliding window
// counter, or the check writes nothing (cost 0, or a cost
// above the limit, denied even on a fresh state). l and cost must be valid
// (Limit.Validate, Limit.ValidateCost) and want ≥ cost.
func FreshWindow(l Limit, cost, want int64) (FreshWindowWrite, bool) {
	if cost <= 0 || cost > l.Limit || !HasFreshWindowForm(l.Algorithm) {
		return FreshWindowWrite{}, false
	}
	g := grantSize(cost, want, l.Limit)
	w := FreshWindowWrite{l: l, cost: cost, want: want}
	v := make([]byte, 0, 40)
	v = append(v, 'r')
	switch l.Algorithm {
	case SlidingWindowCounter:
		// "w cur prev": cur counts until the end of the next window.
		w.TTLMillis = 2 * l.PeriodMillis()
		v = strconv.AppendInt(v, w.TTLMillis, 10)
		v = append(v, " 0 "...)
		v = strconv.AppendInt(v, g, 10)
		v = append(v, " 0"...)
	}
	w.Value = string(v)
	return w, true
}

// Outcome is the decision and grant of the write, had it been made at
// Redis's time setMs: the check script's on a missing key at that time
// (the Go model's, which the scripts follow).
func (w FreshWindowWrite) Outcome(setMs int64) (Decision, Grant) {
	var s SlidingCounterState
	return s.Acquire(w.l, setMs, w.cost, w.want, 0)
}

// HasFreshWindowForm reports whether FreshWindow can write a state of
// algorithm a: the sliding window counter. (The fixed window's counts are
// plain integers, which a node far from a window's edge writes with plain
// commands whether the key is fresh or not: WindowIncrement.)
func HasFreshWindowForm(a Algorithm) bool {
	return a == SlidingWindowCounter
}
