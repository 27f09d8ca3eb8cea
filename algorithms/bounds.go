package algorithms

import "time"

// MaxRetryAfter is the longest RetryAfter that any denial of cost units
// under l can carry, whatever the key's state, when leases of the limit
// are held at most hold (the holdMs of Acquire; it matters only to the
// sliding window log, which records leased units at the lease's end):
//
//   - fixed window: Period (the window ends by then);
//   - sliding window log: Period + hold (the newest entry expires by then);
//   - sliding window counter: 2 × Period (the next window has room by the
//     end of the one after);
//   - token bucket, leaky bucket and GCRA: cost × Period / Limit, rounded up
//     to the millisecond (cost units refill, drain or are emitted by then).
//
// A node holds a RetryAfter that someone else reports (a peer's gossip) to
// it: a longer one cannot have come from the authority, except for a key
// that owes a debt State.Charge recorded, which may wait up to MaxCharge
// units' refill. Holding such a denial to the bound only ends it sooner at
// the peers, which then ask the authority. l must be valid and
// cost within 0..Capacity (0 counts as 1, as in Acquire); hold is clamped to
// 0..MaxPeriod. Waits too long for a Duration saturate as Acquire's do.
func (l Limit) MaxRetryAfter(cost int64, hold time.Duration) time.Duration {
	p := l.PeriodMillis()
	switch l.Algorithm {
	case FixedWindow:
		return time.Duration(p) * time.Millisecond
	case SlidingWindowLog:
		return time.Duration(p+clampHold(hold.Milliseconds())) * time.Millisecond
	case SlidingWindowCounter:
		return time.Duration(2*p) * time.Millisecond
	}
	// The buckets and GCRA: c × b ≤ Capacity × b ≤ MaxExact (Validate).
	a, b := l.Rate()
	return waitDuration(ceilDiv(max(cost, 1)*b, a))
}

// MaxResetAfter is the longest ResetAfter that any decision under l can
// carry, with leases held at most hold: the time after which a key at its
// fullest is fresh again. It is MaxRetryAfter for the window algorithms and
// MaxRetryAfter(Capacity) for the others. The same preconditions apply.
func (l Limit) MaxResetAfter(hold time.Duration) time.Duration {
	return l.MaxRetryAfter(l.Capacity(), hold)
}
