package algorithms

import (
	"slices"
	"sort"
	"time"
)

// SlidingLogState is one key's sliding window log: every admitted request
// with its time and cost, so that at most the limit is admitted in any
// rolling period. An entry counts while ts > now - period. The zero value is
// a fresh state (an empty log). Like every State, it is not safe for
// concurrent use.
//
// It mirrors scripts/sliding_window_log.lua (ZSET base:sl of seq:cost members
// scored by ts, HASH base:slm with sum and seq); the rules are
// docs/algorithms.md, "Sliding window log".
//
// Expired entries are dropped only when a positive cost is admitted, so a
// denied or cost-0 check leaves the state untouched, as State requires; they
// are skipped, never counted, meanwhile.
type SlidingLogState struct {
	entries []slidingLogEntry // ordered by ts, oldest first; costs > 0
	sum     int64             // total cost of entries, expired ones included
}

// slidingLogEntry is one admitted request: its time in ms since the Unix
// epoch and its cost in units.
type slidingLogEntry struct {
	ts, cost int64
}

// Check implements State. It writes only when it admits a positive cost.
func (s *SlidingLogState) Check(l Limit, nowMs, cost int64) Decision {
	lim, p := l.Limit, l.PeriodMillis()
	c := max(cost, 1)

	// Entries are ordered by ts, so the expired ones are a prefix.
	live := sort.Search(len(s.entries), func(i int) bool { return s.entries[i].ts > nowMs-p })
	used := s.sum
	for _, e := range s.entries[:live] {
		used -= e.cost
	}

	allowed := used+c <= lim
	if allowed && cost > 0 {
		s.entries = s.entries[live:]
		// After a clock step backwards now can precede the newest entry;
		// insert in order (after equal times) so the expired ones stay a
		// prefix. Normally this appends.
		at := sort.Search(len(s.entries), func(i int) bool { return s.entries[i].ts > nowMs })
		s.entries = slices.Insert(s.entries, at, slidingLogEntry{ts: nowMs, cost: cost})
		used += cost
		s.sum = used
		live = 0
	}

	// used exceeds lim only when the key's limit shrank since it was spent.
	d := Decision{Allowed: allowed, Limit: lim, Remaining: max(0, lim-used)}
	if used > 0 {
		newest := s.entries[len(s.entries)-1].ts
		d.ResetAfter = time.Duration(newest+p-nowMs) * time.Millisecond
	}
	if !allowed {
		// The same cost fits once the oldest entries worth need units
		// have expired; entries expire at ts + period.
		need, freed := used+c-lim, int64(0)
		for _, e := range s.entries[live:] {
			if freed += e.cost; freed >= need {
				d.RetryAfter = time.Duration(e.ts+p-nowMs) * time.Millisecond
				break
			}
		}
	}
	return d
}
