package algorithms

// LeakyBucketState is one key's leaky bucket in its meter form: each
// admitted unit raises the level by one, and the level drains continuously
// at Limit units per Period; a cost is admitted only if the level stays
// within Limit.Capacity. With the rate reduced to a/b (a units every b ms,
// see Limit.Rate) the exact level is level - leaked/b, so draining is exact
// integer arithmetic. The integer level is the exact level rounded up, so
// checks against it are conservative.
//
// The meter is the token bucket upside down (free space = capacity - level
// behaves exactly like the tokens); it is kept as its own state because its
// stored form, and the reading of a state written under another limit,
// differ.
//
// The zero value is a fresh state: an empty bucket, as for a key never seen.
//
// It mirrors scripts/leaky_bucket.lua (HASH base:lb, fields l, d and ts); the
// rules are docs/algorithms.md, "Leaky bucket".
type LeakyBucketState struct {
	level  int64 // units in the bucket, rounded up, 0 to capacity
	leaked int64 // how much of the top unit has drained, in 1/b units, 0 ≤ leaked < b
	lastMs int64 // time of the last drain, ms since the Unix epoch; never decreases
}

// Check implements State. It writes only when it admits a positive cost.
func (s *LeakyBucketState) Check(l Limit, nowMs, cost int64) Decision {
	capacity := l.Capacity()
	a, b := l.Rate()
	c := max(cost, 1)

	// A state written under another limit (the policy changed) is read
	// clamped to this one, so remaining stays in [0, capacity] and every
	// product stays within the bounds Limit.Validate guarantees. The zero
	// value needs no special case: level 0 drains to empty at any time.
	level, leaked, last := min(s.level, capacity), min(s.leaked, b-1), s.lastMs

	// Drain. Comparing the elapsed time with the time to empty before
	// multiplying keeps e × a below capacity × b + a however long the key
	// sat idle. A clock that went backwards drains nothing.
	e := max(0, nowMs-last)
	if e >= ceilDiv(level*b-leaked, a) {
		level, leaked = 0, 0
	} else {
		acc := leaked + e*a
		level, leaked = level-acc/b, acc%b
	}
	last = max(last, nowMs)

	d := Decision{Limit: capacity}
	if level+c <= capacity {
		d.Allowed = true
		if cost > 0 {
			level += cost
			*s = LeakyBucketState{level: level, leaked: leaked, lastMs: last}
		}
	} else {
		// The time for the exact level to drop to capacity - c.
		d.RetryAfter = waitDuration(ceilDiv((level+c-capacity)*b-leaked, a))
	}
	d.Remaining = capacity - level
	d.ResetAfter = waitDuration(ceilDiv(level*b-leaked, a))
	return d
}
