package algorithms

import (
	"math"
	"time"
)

// floorDiv returns ⌊x / y⌋ for y > 0, rounding towards minus infinity like
// the scripts' math.floor(x / y); Go's / truncates towards zero, which
// differs for negative x.
func floorDiv(x, y int64) int64 {
	q := x / y
	if x%y != 0 && x < 0 {
		q--
	}
	return q
}

// ceilDiv returns ⌈x / y⌉ for y > 0, computed as the scripts do:
// math.floor((x + y - 1) / y).
func ceilDiv(x, y int64) int64 { return floorDiv(x+y-1, y) }

// maxWaitMs is the longest wait, in ms, that a time.Duration holds (about
// 292 years).
const maxWaitMs = math.MaxInt64 / int64(time.Millisecond)

// waitDuration converts a wait in whole ms to a Duration. A valid limit with
// a tiny rate and a large burst can need up to 2^52 ms to refill, more than a
// Duration holds; such waits saturate at maxWaitMs instead of overflowing.
func waitDuration(ms int64) time.Duration {
	return time.Duration(min(ms, maxWaitMs)) * time.Millisecond
}
