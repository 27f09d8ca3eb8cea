// Package accuracy checks what a limit admitted against what it permits:
// the never-over-the-limit judge of the tests that hammer one key through
// several nodes (node) or several clients (rpc/quotadclient). Test helper
// only.
package accuracy

import (
	"math"
	"sort"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// Admission is one allowed check as its caller saw it: the unit was
// admitted at some instant between Before (sent) and After (answered).
type Admission struct{ Before, After time.Time }

// NoOverAdmission fails t if allowed holds more than a's limit permits
// (limit units per period, the buckets' and GCRA's burst being the limit)
// over a run of length run that began at start, and returns allowed as a
// share of what the limit permits over the run. allowed must be sorted by
// Before; every check is of cost 1.
func NoOverAdmission(t testing.TB, a algorithms.Algorithm, limit int64, period time.Duration, start time.Time, run time.Duration, allowed []Admission) float64 {
	t.Helper()
	end := start.Add(run)
	switch a {
	case algorithms.FixedWindow, algorithms.SlidingWindowCounter:
		// Windows are aligned to the epoch. Only checks that certainly fell
		// in one window count towards it; the counter's weighted estimate
		// also keeps each window's own count within the limit.
		perWindow := map[int64]int64{}
		for _, c := range allowed {
			w := c.Before.UnixMilli() / period.Milliseconds()
			if w == c.After.UnixMilli()/period.Milliseconds() {
				perWindow[w]++
			}
		}
		var full, fullAllowed int64
		for w, n := range perWindow {
			if n > limit {
				t.Errorf("window %d: %d allowed, limit %d", w, n, limit)
			}
			if ws := time.UnixMilli(w * period.Milliseconds()); ws.After(start) && ws.Add(period).Before(end) {
				full++
				fullAllowed += n
			}
		}
		if full == 0 {
			t.Fatal("no complete window in the run")
		}
		return float64(fullAllowed) / float64(full*limit)
	case algorithms.SlidingWindowLog:
		// Any span of one period: checks that certainly fell inside it.
		// The log stamps entries with the store's clock read down to the
		// millisecond, so an entry made at 0.9ms lets a check at 500.1ms
		// in (500ms period): the guarantee holds on whole milliseconds,
		// which any real span shorter than period-1ms fits inside.
		span := period - time.Millisecond
		worst := 0
		for i, c := range allowed {
			n := 0
			for _, d := range allowed[i:] {
				if d.Before.Sub(c.Before) >= span {
					break
				}
				if d.After.Sub(c.Before) < span {
					n++
				}
			}
			worst = max(worst, n)
		}
		if worst > int(limit) {
			t.Errorf("%d allowed within one period, limit %d", worst, limit)
		}
		// A rolling window admits the limit at the start and again each
		// period after.
		return float64(len(allowed)) / float64(limit*int64((run-1)/period+1))
	default:
		// Buckets and GCRA start full: by any instant, at most the burst
		// plus what the rate refilled since start (one unit of rounding).
		rate := float64(limit) / float64(period)
		byAfter := make([]time.Time, len(allowed))
		for i, c := range allowed {
			byAfter[i] = c.After
		}
		sort.Slice(byAfter, func(i, j int) bool { return byAfter[i].Before(byAfter[j]) })
		for i, at := range byAfter {
			bound := float64(limit) + rate*float64(at.Sub(start)) + 1
			if float64(i+1) > bound {
				t.Fatalf("%d allowed %s after start, bound %.0f", i+1, at.Sub(start), math.Floor(bound))
			}
		}
		return float64(len(allowed)) / (float64(limit) + rate*float64(run))
	}
}
