package algorithms

import "strconv"

// freshBaseMs is the clock a fresh write is decided at: any time decides
// the same (a fresh state's decision does not depend on the time), and
// this one is far from 0 and from 2^53, so no clamp or bound acts on it.
const freshBaseMs = 1 << 42

// FreshWrite is what a check of a key that holds no state decides and
// writes, for a store that writes it with a plain command instead of a
// script: SET key Value PX TTLMillis NX. If that SET finds the key
// missing (it replies OK), it wrote Value and the check's outcome is
// Decision and Grant, exactly what the check script would have decided
// and written then. If it finds a value (a nil reply), it wrote nothing,
// and the check must go to the script.
//
// Value is the state with its time written relative to the SET's own
// time, which the scripts recover from the key's expire time
// (scripts/prelude.lua, parse): the node needs no clock, and a plain SET
// costs Redis less than half of what a script call deciding the same check
// does (README, "Benchmarks").
type FreshWrite struct {
	Decision  Decision
	Grant     Grant
	Value     string
	TTLMillis int64
}

// Fresh returns the write a check of cost (a lease would like want) makes
// on a key of limit l that holds no state, and true; or false when the
// check must go to the script: l's algorithm keeps no state that can be
// written without knowing the time (the token bucket, the leaky bucket,
// GCRA and the sliding log have one; windows must be aligned to the clock,
// see WindowIncrement), or the check writes nothing (cost 0, or a cost above
// the capacity, denied even on a fresh state). l and cost must be valid
// (Limit.Validate, Limit.ValidateCost) and want ≥ cost.
//
// The sliding log's fresh form is its one entry, written into its meta key
// alone (its second key, Keys): "r<ttl> sum seq ts", which the check
// script reads where it is and moves into the log when it writes, and the
// release turns into the log's entry first (scripts/prelude.lua,
// log_fresh). Without a hold a check takes only its cost, so Fresh
// decides a plain check of cost, whatever want is; a lease of a sliding
// log, held until its end, must go to the script.
func Fresh(l Limit, cost, want int64) (FreshWrite, bool) {
	if cost <= 0 || !HasFreshForm(l.Algorithm) {
		return FreshWrite{}, false
	}
	capacity := l.Capacity()
	a, b := l.Rate()
	var w FreshWrite
	var fields [3]int64
	n := 0
	switch l.Algorithm {
	case TokenBucket:
		var s TokenBucketState
		w.Decision, w.Grant = s.Acquire(l, freshBaseMs, cost, want, 0)
		// As scripts/token_bucket.lua: TTL the time to fill up again.
		w.TTLMillis = ceilDiv((capacity-s.tokens)*b-s.frac, a)
		fields, n = [3]int64{s.tokens, s.frac, s.lastMs - freshBaseMs}, 3
	case LeakyBucket:
		var s LeakyBucketState
		w.Decision, w.Grant = s.Acquire(l, freshBaseMs, cost, want, 0)
		// As scripts/leaky_bucket.lua: TTL the time to drain.
		w.TTLMillis = ceilDiv(s.level*b-s.leaked, a)
		fields, n = [3]int64{s.level, s.leaked, s.lastMs - freshBaseMs}, 3
	case SlidingWindowLog:
		var s SlidingLogState
		w.Decision, w.Grant = s.Acquire(l, freshBaseMs, cost, cost, 0)
		// As scripts/sliding_window_log.lua: TTL the entry's time in the
		// log.
		w.TTLMillis = l.PeriodMillis()
		fields, n = [3]int64{cost, w.Grant.Ref, 0}, 3
	case GCRA:
		var s GCRAState
		w.Decision, w.Grant = s.Acquire(l, freshBaseMs, cost, want, 0)
		// As scripts/gcra.lua: TTL the time until tat has passed.
		w.TTLMillis = ceilDiv((s.tatMs-freshBaseMs)*a+s.tatFrac, a)
		fields, n = [3]int64{s.tatMs - freshBaseMs, s.tatFrac}, 2
	default:
		return FreshWrite{}, false
	}
	if !w.Decision.Allowed {
		return FreshWrite{}, false
	}
	w.TTLMillis = max(w.TTLMillis, 1)
	v := make([]byte, 0, 48)
	v = append(v, 'r')
	v = strconv.AppendInt(v, w.TTLMillis, 10)
	for _, f := range fields[:n] {
		v = append(v, ' ')
		v = strconv.AppendInt(v, f, 10)
	}
	w.Value = string(v)
	return w, true
}

// HasFreshForm reports whether Fresh can write a state of algorithm a:
// the token bucket, the leaky bucket, GCRA and the sliding log, whose
// states hold a time only as the last write's or an entry's (windows must
// be aligned to the clock: WindowIncrement).
func HasFreshForm(a Algorithm) bool {
	return a == TokenBucket || a == LeakyBucket || a == GCRA || a == SlidingWindowLog
}

// FreshKey is the key of Keys(a, base) that a fresh write of algorithm a
// writes: the state's, or the sliding log's meta key.
func FreshKey(a Algorithm, keys []string) string {
	if a == SlidingWindowLog {
		return keys[1]
	}
	return keys[0]
}
