package algorithms

import "time"

// Decision is the answer to one check. It is a value: a denial is data, not
// an error.
type Decision struct {
	// Allowed reports whether the cost was admitted and spent. For cost 0 it
	// reports whether one unit would be admitted now; nothing is spent.
	Allowed bool
	// Limit is the most units the limit can hold (Limit.Capacity).
	Limit int64
	// Remaining is the number of units still available after this decision,
	// 0 to Limit.
	Remaining int64
	// ResetAfter is the wait until the quota is fully restored (Remaining
	// would equal Limit); zero when it already is.
	ResetAfter time.Duration
	// RetryAfter is zero when Allowed; otherwise the earliest wait after
	// which the same cost can be admitted, assuming nothing else is spent.
	RetryAfter time.Duration
}
