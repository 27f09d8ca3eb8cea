package leases

import (
	"time"

	"github.com/quotad/quotad/algorithms"
)

// Countdown is a remembered denial d, given by the store at since, as it
// answers a check at now that it still holds for until then (holder's
// clock, ns): its RetryAfter is the wait left until until, and its
// ResetAfter what was left of the store's, at least RetryAfter; both in
// whole milliseconds rounded up, as the store answers.
func Countdown(d algorithms.Decision, since, until, now int64) algorithms.Decision {
	d.RetryAfter = CeilMillis(time.Duration(until - now))
	d.ResetAfter = max(CeilMillis(d.ResetAfter-time.Duration(now-since)), d.RetryAfter)
	return d
}

// CeilMillis rounds d up to a whole millisecond.
func CeilMillis(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r > 0 {
		d += time.Millisecond - r
	}
	return d
}
