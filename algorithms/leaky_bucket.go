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
// It mirrors scripts/leaky_bucket.lua and scripts/release_leaky_bucket.lua
// (STRING base:lb3, "l d ts"); the rules are docs/algorithms.md,
// "Leaky bucket" and "Leases".
type LeakyBucketState struct {
	level  int64 // units in the bucket, rounded up, 0 to MaxCharge (above capacity: a debt)
	leaked int64 // how much of the top unit has drained, in 1/b units, 0 ≤ leaked < b
	lastMs int64 // time of the last drain, ms since the Unix epoch; never decreases
}

// Check implements State. It writes only when it admits a positive cost.
func (s *LeakyBucketState) Check(l Limit, nowMs, cost int64) Decision {
	d, _ := s.Acquire(l, nowMs, cost, cost, 0)
	return d
}

// drain returns the bucket at nowMs: the level rounded up, how much of the
// top unit has drained in 1/b units, and the time of this drain. most is
// l.MaxCharge.
func (s *LeakyBucketState) drain(most, a, b, nowMs int64) (level, leaked, last int64) {
	// A level above the capacity is a charge's debt, or was poured under a
	// larger limit (the policy changed); it counts in full, up to MaxCharge,
	// which keeps every product within MaxExact. The zero value needs no
	// special case: level 0 drains to empty at any time.
	level, leaked, last = min(s.level, most), min(s.leaked, b-1), s.lastMs

	// Comparing the elapsed time with the time to empty before multiplying
	// keeps e × a below capacity × b + a however long the key sat idle. A
	// clock that went backwards drains nothing.
	e := max(0, nowMs-last)
	if e >= ceilDiv(level*b-leaked, a) {
		level, leaked = 0, 0
	} else {
		acc := leaked + e*a
		level, leaked = level-acc/b, acc%b
	}
	return level, leaked, max(last, nowMs)
}

// Acquire implements State. It sets no bound on when granted units are
// spent: units poured in early are only ever more conservative.
func (s *LeakyBucketState) Acquire(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	return s.acquire(l, nowMs, cost, want, false)
}

// Charge implements State: a cost that does not fit is poured in all the
// same, above the capacity; the drain empties the excess before any cost
// fits again.
func (s *LeakyBucketState) Charge(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	return s.acquire(l, nowMs, cost, want, true)
}

// acquire is Acquire, or Charge when charge.
func (s *LeakyBucketState) acquire(l Limit, nowMs, cost, want int64, charge bool) (Decision, Grant) {
	capacity, most := l.Capacity(), l.MaxCharge()
	a, b := l.Rate()
	c := max(cost, 1)
	level, leaked, last := s.drain(most, a, b, nowMs)

	var g Grant
	d := Decision{Limit: capacity}
	if level+c <= capacity {
		d.Allowed = true
		if cost > 0 {
			g.Units = grantSize(cost, want, capacity-level)
			level += g.Units
			*s = LeakyBucketState{level: level, leaked: leaked, lastMs: last}
		}
	} else if charge && cost > 0 {
		level = min(level+cost, most)
		*s = LeakyBucketState{level: level, leaked: leaked, lastMs: last}
	}
	d.Remaining = max(0, capacity-level)
	d.ResetAfter = waitDuration(ceilDiv(level*b-leaked, a))
	switch {
	case d.Allowed:
	case c > capacity:
		// A charge that can never fit: when the quota is whole again.
		d.RetryAfter = d.ResetAfter
	default:
		// The time for the exact level to drop to capacity - c; level + c
		// - capacity ≤ MaxCharge keeps the product within MaxExact.
		d.RetryAfter = waitDuration(ceilDiv((level+c-capacity)*b-leaked, a))
	}
	return d, g
}

// Release implements State: it drains to nowMs as a check does, then takes
// the units out, down to an empty bucket. A level above MaxCharge was
// written under another limit and is read clamped; taking units from the
// clamped level could read looser than the level without them, so such a
// state is left alone.
func (s *LeakyBucketState) Release(l Limit, nowMs, units int64, g Grant) int64 {
	a, b := l.Rate()
	u := releaseUnits(l, units, g)
	most := l.MaxCharge()
	if u <= 0 || s.level > most {
		return 0
	}
	level, leaked, last := s.drain(most, a, b, nowMs)
	if level <= 0 {
		return 0
	}
	returned := min(u, level)
	if level -= u; level <= 0 {
		level, leaked = 0, 0
	}
	*s = LeakyBucketState{level: level, leaked: leaked, lastMs: last}
	return returned
}
