package rpc

import (
	"fmt"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// DefaultMaxInlinePeriod is Config.MaxInlinePeriod's default. Every state
// an inline limit creates costs the store memory (about 1.2 KB in Redis
// with a 1 KiB key) for as long as it can live, and anyone who may send
// inline limits picks that time; a day covers per-second to per-day limits,
// and longer quotas belong in configured policies, which the operator
// chooses.
const DefaultMaxInlinePeriod = 24 * time.Hour

// inlineLifetime is how long the state of l can outlive the check that
// wrote it, as the stores keep it: its period for the window algorithms
// (the sliding window counter keeps the previous window too, so up to two),
// and for the buckets and GCRA the time to restore a full burst, capacity ×
// period / limit, rounded up to a millisecond. l must be valid.
func inlineLifetime(l algorithms.Limit) time.Duration {
	switch l.Algorithm {
	case algorithms.TokenBucket, algorithms.LeakyBucket, algorithms.GCRA:
		a, b := l.Rate() // a units every b ms; capacity × b fits in 2^52
		ms := (l.Capacity()*b + a - 1) / a
		return max(l.Period, time.Duration(ms)*time.Millisecond)
	}
	return l.Period
}

// checkInlineLifetime refuses an inline limit whose state could live longer
// than maxPeriod. The error names the field that makes it so and wraps an
// algorithms sentinel, so that it is InvalidArgument.
func checkInlineLifetime(l algorithms.Limit, maxPeriod time.Duration) error {
	if l.Period > maxPeriod {
		return fmt.Errorf("limit.period: %w: %s exceeds this server's longest inline period %s; use a configured policy for longer limits", algorithms.ErrInvalidPeriod, l.Period, maxPeriod)
	}
	if life := inlineLifetime(l); life > maxPeriod {
		return fmt.Errorf("limit.burst: %w: a full burst of %d takes %s to restore at %d per %s, longer than this server's longest inline period %s; use a configured policy for longer limits", algorithms.ErrInvalidBurst, l.Capacity(), life, l.Limit, l.Period, maxPeriod)
	}
	return nil
}
