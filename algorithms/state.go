package algorithms

// State is one key's state under one algorithm: the Go model of what the
// Lua script keeps in Redis. The embedded memory store holds one per key.
//
// A State is not safe for concurrent use; its owner serialises access.
type State interface {
	// Check decides whether cost units of l fit at nowMs (milliseconds since
	// the Unix epoch) and spends them if they do and cost > 0. It mutates the
	// state only when it admits a positive cost. l must be valid, cost must
	// pass l.ValidateCost. l may differ from the limit the state was last
	// used with (stores key states by policy and key, so an edited policy
	// meets old state): the state is then read clamped to the new limit's
	// bounds (use within l.MaxCharge, tokens at most the capacity) and never
	// yields a Decision outside [0, capacity].
	//
	// Once the returned Decision's ResetAfter has passed, the state is
	// equivalent to a fresh one and may be dropped.
	//
	// Check(l, nowMs, cost) is Acquire(l, nowMs, cost, cost, 0)'s Decision.
	// The state may hold more than the capacity in use: a debt Charge
	// recorded, or use spent under a larger limit; it counts in full.
	Check(l Limit, nowMs, cost int64) Decision

	// Acquire is Check for a lease: it decides for cost exactly as Check
	// does and, when it admits a positive cost, spends g = max(cost,
	// min(want, avail)) units instead, avail being the largest cost it
	// would admit now. The Decision (Remaining, ResetAfter) and the state
	// reflect g. holdMs is how long, in ms, the node may keep the units
	// (0 for a plain check); only the sliding window log uses it, and
	// grants no more than cost when it is 0. A denial, or cost 0, returns
	// Grant{} and writes nothing. The same preconditions as Check apply;
	// want < cost means cost.
	Acquire(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant)

	// Charge is Acquire for a check that counts whether or not it fits:
	// a cost that fits is admitted exactly as Acquire admits it; one that
	// does not (cost > 0) is denied and recorded all the same, so that the
	// key owes it (debt): later checks are denied until the window ends or
	// the refill pays it back. Use stays at most l.MaxCharge: a charge
	// beyond it records up to it. The denial's RetryAfter counts the debt
	// just recorded, for cost, or when cost exceeds the capacity (it never
	// fits) it is ResetAfter, the wait until the quota is whole again.
	// Remaining is never below 0. cost must pass l.ValidateCharge; the
	// other preconditions are Acquire's. docs/algorithms.md, "Counting
	// checks", gives each algorithm's rule.
	Charge(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant)

	// Release gives back up to units unused units of g, a Grant an Acquire
	// of this state returned, at nowMs, and returns how many made a
	// difference: 0 when the grant's window ended or its log entry expired
	// or is gone, for the buckets and GCRA only those that fit before the
	// state is full. It never makes the state looser than if those units
	// had never been taken, and writes only when it returns more than 0.
	// Release each grant at most once. l must be valid.
	Release(l Limit, nowMs, units int64, g Grant) (returned int64)
}

// NewState returns the fresh state of algorithm a: the state of a key that
// has never been seen, or whose quota is fully restored. It returns nil for
// an invalid algorithm and for Concurrency, whose slots are not a State (see
// ConcurrencyState).
func NewState(a Algorithm) State {
	switch a {
	case FixedWindow:
		return &FixedWindowState{}
	case SlidingWindowLog:
		return &SlidingLogState{}
	case SlidingWindowCounter:
		return &SlidingCounterState{}
	case TokenBucket:
		return &TokenBucketState{}
	case LeakyBucket:
		return &LeakyBucketState{}
	case GCRA:
		return &GCRAState{}
	}
	return nil
}
