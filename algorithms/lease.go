package algorithms

import "time"

// Grant is what an Acquire took at the authority for a lease: the units
// spent there ahead of time, which the node may spend locally, one check at
// a time, and give back with Release when the lease ends. It is a value; the
// zero value is "nothing granted" (a denial, or a cost of 0).
//
// The rules are docs/algorithms.md, "Leases: taking a batch, giving back the
// rest".
type Grant struct {
	// Units is g, the units spent at the authority: the cost asked for plus
	// those taken ahead for the lease; 0 when nothing was admitted.
	Units int64
	// UseWithin is how long, from the moment of the Acquire, the units may
	// be spent; 0 means the algorithm sets no bound. Whole ms. Spending a
	// unit later could admit it on top of a later window's own limit.
	UseWithin time.Duration
	// Ref is what Release needs to find the grant again: the window start
	// in ms (fixed window, sliding window counter) or the log entry's seq
	// (sliding window log); 0 otherwise.
	Ref int64
}

// maxHoldMs bounds an Acquire's hold, in ms, to the longest period: it keeps
// the sliding log's timestamps (now + hold) exact in Lua, and a lease held
// longer than any period serves no purpose.
var maxHoldMs = MaxPeriod.Milliseconds()

// clampHold returns holdMs within [0, maxHoldMs], as the scripts read it.
func clampHold(holdMs int64) int64 { return min(max(holdMs, 0), maxHoldMs) }

// grantSize is g = max(cost, min(want, avail)): the units an Acquire spends
// once it admits a positive cost, avail being the largest cost it would
// admit now (≥ cost then).
func grantSize(cost, want, avail int64) int64 { return max(cost, min(want, avail)) }

// releaseUnits is how many units a Release of units from g may give back:
// never more than the grant took, nor than any grant of l can hold (which
// keeps the scripts' products exact whatever a caller passes); ≤ 0 means
// none.
func releaseUnits(l Limit, units int64, g Grant) int64 {
	return min(units, g.Units, l.Capacity())
}
