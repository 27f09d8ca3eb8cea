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
	// meets old state): the state is then read clamped to the new limit and
	// never yields a Decision outside [0, capacity].
	//
	// Once the returned Decision's ResetAfter has passed, the state is
	// equivalent to a fresh one and may be dropped.
	Check(l Limit, nowMs, cost int64) Decision
}

// NewState returns the fresh state of algorithm a: the state of a key that
// has never been seen, or whose quota is fully restored. It returns nil for
// an invalid algorithm.
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
