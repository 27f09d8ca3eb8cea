// Package algorithms defines what a rate limit is and how each of quotad's
// seven algorithms decides, twice: as a pure Go model (the embedded store and the
// executable specification) and as a Redis Lua script (the authority when
// Redis is configured). A differential test keeps the two identical.
//
// The package does no I/O and reads no clock: every decision takes the current
// time as an argument, in whole milliseconds since the Unix epoch.
package algorithms

import (
	"fmt"
	"time"
)

// Algorithm selects how a limit counts. The zero value is not a valid
// algorithm.
type Algorithm int

// The algorithms, numbered as in the public API.
const (
	FixedWindow Algorithm = iota + 1
	SlidingWindowLog
	SlidingWindowCounter
	TokenBucket
	LeakyBucket
	GCRA
	// Concurrency holds slots rather than spending units: at most Limit
	// held at once, each alive for Period unless renewed (concurrency.go).
	Concurrency
)

var algorithmNames = map[Algorithm]string{
	FixedWindow:          "fixed_window",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
	TokenBucket:          "token_bucket",
	LeakyBucket:          "leaky_bucket",
	GCRA:                 "gcra",
	Concurrency:          "concurrency",
}

// Algorithms lists the rate algorithms in API order: every valid algorithm
// but Concurrency, which has no State and no check script (its slots have
// their own model and scripts, see ConcurrencyState).
func Algorithms() []Algorithm {
	return []Algorithm{FixedWindow, SlidingWindowLog, SlidingWindowCounter, TokenBucket, LeakyBucket, GCRA}
}

// String returns the algorithm's configuration name, e.g. "token_bucket".
func (a Algorithm) String() string {
	if n, ok := algorithmNames[a]; ok {
		return n
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

// ParseAlgorithm is the inverse of String.
func ParseAlgorithm(name string) (Algorithm, error) {
	for a, n := range algorithmNames {
		if n == name {
			return a, nil
		}
	}
	return 0, fmt.Errorf("%w %q (want one of fixed_window, sliding_window_log, sliding_window_counter, token_bucket, leaky_bucket, gcra, concurrency)", ErrUnknownAlgorithm, name)
}

// Valid reports whether a is one of the seven algorithms.
func (a Algorithm) Valid() bool {
	_, ok := algorithmNames[a]
	return ok
}

// usesBurst reports whether the algorithm has a capacity distinct from its
// rate (the buckets and GCRA).
func (a Algorithm) usesBurst() bool {
	return a == TokenBucket || a == LeakyBucket || a == GCRA
}

// Bounds on a Limit. They keep every intermediate value of the integer
// arithmetic below 2^53, the largest integer a Lua (double) number holds
// exactly, so the Go models and the Lua scripts agree to the unit.
const (
	// MinPeriod is the shortest period: one millisecond, the clock's unit.
	MinPeriod = time.Millisecond
	// MaxPeriod is the longest period: 365 days.
	MaxPeriod = 365 * 24 * time.Hour
	// MaxExact bounds every product the algorithms compute.
	MaxExact = int64(1) << 52
	// MaxSlidingLogLimit bounds the sliding window log, which stores one
	// Redis sorted-set member per admitted request.
	MaxSlidingLogLimit = 1_000_000
)

// Errors returned by Validate and ValidateCost. Each is wrapped with the
// offending field and value; test with errors.Is. Each wraps
// ErrInvalidInput.
var (
	ErrUnknownAlgorithm = NewInputError("unknown algorithm")
	ErrInvalidLimit     = NewInputError("invalid limit")
	ErrInvalidPeriod    = NewInputError("invalid period")
	ErrInvalidBurst     = NewInputError("invalid burst")
	ErrInvalidCost      = NewInputError("invalid cost")
	ErrTooLarge         = NewInputError("limit too large for exact arithmetic")
	// ErrCannotCharge is a charge (State.Charge) of a limit that has no
	// debt to record: concurrency.
	ErrCannotCharge = NewInputError("cannot charge over the limit")
)

// Limit is one rate limit. It is a value; the zero value is invalid.
type Limit struct {
	// Algorithm selects how the limit counts.
	Algorithm Algorithm
	// Limit is the number of units admitted per Period; > 0. For
	// Concurrency it is the number of slots that may be held at once.
	Limit int64
	// Period is the window length (window algorithms) or the time in which
	// Limit units are refilled, drained or emitted (the others); for
	// Concurrency, how long a slot lives unless renewed. Whole
	// milliseconds from MinPeriod to MaxPeriod.
	Period time.Duration
	// Burst is the capacity of the buckets and the burst tolerance of GCRA,
	// in units; 0 means Limit. It must be 0 for the window algorithms.
	Burst int64
}

// Capacity is the most units the limit can hold at once, and so the largest
// cost it can ever admit: Burst for the buckets and GCRA when set, else Limit.
func (l Limit) Capacity() int64 {
	if l.Algorithm.usesBurst() && l.Burst > 0 {
		return l.Burst
	}
	return l.Limit
}

// PeriodMillis returns Period in whole milliseconds.
func (l Limit) PeriodMillis() int64 { return l.Period.Milliseconds() }

// Validate reports the first problem with l, naming the field. A valid
// limit's arithmetic is exact in both the Go models and the Lua scripts.
func (l Limit) Validate() error {
	if !l.Algorithm.Valid() {
		return fmt.Errorf("algorithm: %w %d", ErrUnknownAlgorithm, int(l.Algorithm))
	}
	if l.Limit <= 0 {
		return fmt.Errorf("limit: %w: %d must be > 0", ErrInvalidLimit, l.Limit)
	}
	if l.Limit > MaxExact {
		return fmt.Errorf("limit: %w: %d exceeds %d", ErrTooLarge, l.Limit, MaxExact)
	}
	switch {
	case l.Period < MinPeriod:
		return fmt.Errorf("period: %w: %s must be at least %s", ErrInvalidPeriod, l.Period, MinPeriod)
	case l.Period > MaxPeriod:
		return fmt.Errorf("period: %w: %s exceeds 365 days", ErrInvalidPeriod, l.Period)
	case l.Period%time.Millisecond != 0:
		return fmt.Errorf("period: %w: %s is not a whole number of milliseconds", ErrInvalidPeriod, l.Period)
	}
	if l.Burst < 0 {
		return fmt.Errorf("burst: %w: %d must be >= 0", ErrInvalidBurst, l.Burst)
	}
	if l.Burst != 0 && !l.Algorithm.usesBurst() {
		return fmt.Errorf("burst: %w: %s has no burst; leave it 0", ErrInvalidBurst, l.Algorithm)
	}
	p := l.PeriodMillis()
	switch l.Algorithm {
	case SlidingWindowLog:
		if l.Limit > MaxSlidingLogLimit {
			return fmt.Errorf("limit: %w: sliding_window_log stores one entry per request and allows at most %d, got %d", ErrInvalidLimit, MaxSlidingLogLimit, l.Limit)
		}
	case Concurrency:
		if l.Limit > MaxConcurrencySlots {
			return fmt.Errorf("limit: %w: concurrency stores one entry per held slot and allows at most %d, got %d", ErrInvalidLimit, MaxConcurrencySlots, l.Limit)
		}
	case SlidingWindowCounter:
		if l.Limit > MaxExact/p {
			return fmt.Errorf("limit: %w: limit × period in ms (%d × %d) exceeds %d", ErrTooLarge, l.Limit, p, MaxExact)
		}
	case TokenBucket, LeakyBucket, GCRA:
		if l.Burst > MaxExact {
			return fmt.Errorf("burst: %w: %d exceeds %d", ErrTooLarge, l.Burst, MaxExact)
		}
		_, b := l.Rate()
		if l.Capacity() > MaxExact/b {
			return fmt.Errorf("burst: %w: capacity × period in ms / gcd(limit, period in ms) (%d × %d) exceeds %d", ErrTooLarge, l.Capacity(), b, MaxExact)
		}
	}
	return nil
}

// ValidateCost reports whether cost can ever be admitted by l: 0 to
// Capacity, and for Concurrency 0 or 1 (a check takes one slot). l must be
// valid.
func (l Limit) ValidateCost(cost int64) error {
	if cost < 0 {
		return fmt.Errorf("cost: %w: %d must be >= 0", ErrInvalidCost, cost)
	}
	if l.Algorithm == Concurrency && cost > 1 {
		return fmt.Errorf("cost: %w: %d; a concurrency check takes one slot (cost 1) or reports whether one is free (cost 0)", ErrInvalidCost, cost)
	}
	if c := l.Capacity(); cost > c {
		return fmt.Errorf("cost: %w: %d exceeds what the limit can ever admit (%d)", ErrInvalidCost, cost, c)
	}
	return nil
}

// MaxCharge is the most units a key of l may owe, and the largest cost a
// check that counts (State.Charge) may charge: a charge that does not fit
// is recorded up to this much in use (debt included), and beyond it the
// key stays at it. The bound keeps every product the models and scripts
// compute below 2^53 (so the Lua doubles stay exact):
//
//   - fixed window and sliding window log: MaxExact units;
//   - sliding window counter: MaxExact / period in ms;
//   - token bucket, leaky bucket and GCRA: MaxExact / b, with the rate
//     reduced to a/b (Rate).
//
// It is at least Capacity for a valid l (Validate bounds the products the
// same way), and 0 for Concurrency, whose slots cannot be owed.
func (l Limit) MaxCharge() int64 {
	switch l.Algorithm {
	case FixedWindow, SlidingWindowLog:
		return MaxExact
	case SlidingWindowCounter:
		return MaxExact / l.PeriodMillis()
	case TokenBucket, LeakyBucket, GCRA:
		_, b := l.Rate()
		return MaxExact / b
	}
	return 0
}

// ValidateCharge is ValidateCost for a check that counts whether or not
// it fits (State.Charge): cost from 0 to MaxCharge, so above the capacity
// too (such a cost is always denied, and recorded). A concurrency limit
// refuses it: a slot is taken only when one is free, so there is nothing
// to owe. l must be valid.
func (l Limit) ValidateCharge(cost int64) error {
	if l.Algorithm == Concurrency {
		return fmt.Errorf("charge: %w: a concurrency limit holds slots, taken only while one is free, so a check cannot go over it; check it without charging", ErrCannotCharge)
	}
	if cost < 0 {
		return fmt.Errorf("cost: %w: %d must be >= 0", ErrInvalidCost, cost)
	}
	if m := l.MaxCharge(); cost > m {
		return fmt.Errorf("cost: %w: %d exceeds the most a key of this limit can be charged (%d)", ErrInvalidCost, cost, m)
	}
	return nil
}

// Rate returns the refill (drain, emission) rate Limit/Period as the reduced
// fraction a/b: a units every b milliseconds, gcd(a, b) = 1.
func (l Limit) Rate() (a, b int64) {
	p := l.PeriodMillis()
	g := gcd(l.Limit, p)
	if g == 0 {
		return l.Limit, p
	}
	return l.Limit / g, p / g
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
