package algorithms

// TokenBucketState is one key's token bucket: a bucket of Limit.Capacity
// tokens, refilled continuously at Limit units per Period; an admitted
// request takes its cost in tokens. With the rate reduced to a/b (a units
// every b ms, see Limit.Rate) the exact token count is tokens + frac/b, so
// refills are exact integer arithmetic.
//
// The zero value is a fresh state: a full bucket, as for a key never seen.
//
// It mirrors scripts/token_bucket.lua and scripts/release_token_bucket.lua
// (STRING base:tb3, "t r ts"); the rules are docs/algorithms.md,
// "Token bucket" and "Leases".
type TokenBucketState struct {
	tokens  int64 // whole tokens, capacity - MaxCharge to capacity (below 0: a debt)
	frac    int64 // the part of the next token refilled so far, in 1/b tokens, 0 ≤ frac < b
	lastMs  int64 // time of the last refill, ms since the Unix epoch; never decreases
	written bool  // false until the first admitted cost: the bucket is full
}

// Check implements State. It writes only when it admits a positive cost.
func (s *TokenBucketState) Check(l Limit, nowMs, cost int64) Decision {
	d, _ := s.Acquire(l, nowMs, cost, cost, 0)
	return d
}

// refill returns the bucket at nowMs: whole tokens, the fraction of the next
// one in 1/b tokens, and the time of this refill. most is l.MaxCharge.
func (s *TokenBucketState) refill(capacity, most, a, b, nowMs int64) (tokens, frac, last int64) {
	tokens, frac, last = capacity, 0, nowMs
	if s.written {
		// A state written under another limit (the policy changed) is read
		// clamped to this one, so remaining stays in [0, capacity] and every
		// product stays within the bounds MaxCharge guarantees: a debt of
		// at most MaxCharge.
		tokens, frac, last = max(min(s.tokens, capacity), capacity-most), min(s.frac, b-1), s.lastMs
	}

	// Comparing the elapsed time with the time to fill up before
	// multiplying keeps e × a below capacity × b + a however long the key
	// sat idle. A clock that went backwards refills nothing.
	e := max(0, nowMs-last)
	if e >= ceilDiv((capacity-tokens)*b-frac, a) {
		tokens, frac = capacity, 0
	} else {
		acc := frac + e*a
		tokens, frac = tokens+acc/b, acc%b
	}
	return tokens, frac, max(last, nowMs)
}

// Acquire implements State. It sets no bound on when granted units are
// spent: tokens taken early are only ever more conservative.
func (s *TokenBucketState) Acquire(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	return s.acquire(l, nowMs, cost, want, false)
}

// Charge implements State: a cost that does not fit still takes its
// tokens, leaving the bucket below empty; the refill pays the debt back
// before any cost fits again.
func (s *TokenBucketState) Charge(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	return s.acquire(l, nowMs, cost, want, true)
}

// acquire is Acquire, or Charge when charge.
func (s *TokenBucketState) acquire(l Limit, nowMs, cost, want int64, charge bool) (Decision, Grant) {
	capacity, most := l.Capacity(), l.MaxCharge()
	a, b := l.Rate()
	c := max(cost, 1)
	tokens, frac, last := s.refill(capacity, most, a, b, nowMs)

	var g Grant
	d := Decision{Limit: capacity}
	if tokens >= c {
		d.Allowed = true
		if cost > 0 {
			g.Units = grantSize(cost, want, tokens)
			tokens -= g.Units
			*s = TokenBucketState{tokens: tokens, frac: frac, lastMs: last, written: true}
		}
	} else if charge && cost > 0 {
		tokens = max(tokens-cost, capacity-most)
		*s = TokenBucketState{tokens: tokens, frac: frac, lastMs: last, written: true}
	}
	d.Remaining = max(0, tokens)
	d.ResetAfter = waitDuration(ceilDiv((capacity-tokens)*b-frac, a))
	switch {
	case d.Allowed:
	case c > capacity:
		// A charge that can never fit: when the quota is whole again.
		d.RetryAfter = d.ResetAfter
	default:
		// c - tokens ≤ MaxCharge, so the product stays within MaxExact.
		d.RetryAfter = waitDuration(ceilDiv((c-tokens)*b-frac, a))
	}
	return d, g
}

// Release implements State: it refills to nowMs as a check does, then puts
// the units back, up to a full bucket.
func (s *TokenBucketState) Release(l Limit, nowMs, units int64, g Grant) int64 {
	capacity := l.Capacity()
	a, b := l.Rate()
	u := releaseUnits(l, units, g)
	if u <= 0 || !s.written {
		// A bucket never written is full.
		return 0
	}
	tokens, frac, last := s.refill(capacity, l.MaxCharge(), a, b, nowMs)
	returned := min(u, capacity-tokens)
	if returned <= 0 {
		return 0
	}
	if tokens += u; tokens >= capacity {
		tokens, frac = capacity, 0
	}
	*s = TokenBucketState{tokens: tokens, frac: frac, lastMs: last, written: true}
	return returned
}
