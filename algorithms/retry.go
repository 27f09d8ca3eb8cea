package algorithms

import "time"

// RetryAfterFor returns the RetryAfter the authority would have given a
// check of cost at the moment it gave denied, a denial of deniedCost under
// l, and whether that follows exactly from denied. A remembered denial may
// answer a later check of cost only when ok: otherwise only the authority
// can say when cost fits, and the caller must ask it.
//
// It is ok for:
//   - the denied cost itself (costs count as max(cost, 1));
//   - any larger cost under the fixed window: the next window is empty, so
//     every cost up to the limit waits for its start;
//   - a larger cost under the token and leaky buckets and GCRA when the
//     extra units take a whole number of ms to refill: with the rate reduced
//     to a/b (a units every b ms), when a divides the extra cost, which is
//     always when a = 1 (100 per minute, 10 per second, 1,000 per second...).
//
// It is never ok for a cost below the denied one (that cost may fit now), a
// larger cost under the sliding window log or counter (the wait depends on
// entries or counts the decision does not carry), an allowed decision, or a
// decision that cannot have come from l.
//
// Under the buckets and GCRA a denial of c waits for a deficit N, in 1/a ms,
// to drain at a per ms: RetryAfter = ceil(N / a) ms (token bucket: N = (c -
// tokens) × b - frac; leaky bucket: N = (level + c - C) × b - leaked; GCRA:
// N = x - (C - c) × b), and c + k waits ceil((N + k × b) / a). RetryAfter
// pins N only to within a, so that is RetryAfter + k × b / a exactly when a
// divides k × b, that is k (gcd(a, b) = 1). Only RetryAfter is used, not
// Remaining, so a denial whose RetryAfter was counted down since (a
// gossiped one) still yields a wait no longer than the authority's.
//
// l must be valid; denied is the authority's answer under l. It does not
// allocate.
func (l Limit) RetryAfterFor(denied Decision, deniedCost, cost int64) (time.Duration, bool) {
	c, want := max(deniedCost, 1), max(cost, 1)
	if denied.Allowed || denied.RetryAfter <= 0 || want < c || want > l.Capacity() {
		return 0, false
	}
	if want == c {
		return denied.RetryAfter, true
	}
	switch l.Algorithm {
	case FixedWindow:
		return denied.RetryAfter, true
	case TokenBucket, LeakyBucket, GCRA:
		return l.bucketRetryFor(denied.RetryAfter, want-c)
	}
	return 0, false
}

// bucketRetryFor is RetryAfterFor for k more units than a denial that
// waits retry under the buckets and GCRA; 0 < k < capacity.
func (l Limit) bucketRetryFor(retry time.Duration, k int64) (time.Duration, bool) {
	a, b := l.Rate()
	if k%a != 0 || retry%time.Millisecond != 0 {
		return 0, false
	}
	// No valid denial waits longer than refilling the whole capacity,
	// ceil(C × b / a) ms; refusing more keeps the sum below 2^53
	// (Limit.Validate bounds C × b).
	retryMs := retry.Milliseconds()
	if retryMs > ceilDiv(l.Capacity()*b, a) {
		return 0, false
	}
	return waitDuration(retryMs + k/a*b), true
}
