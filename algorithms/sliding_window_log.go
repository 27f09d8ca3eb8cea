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
// It mirrors scripts/sliding_window_log.lua and
// scripts/release_sliding_window_log.lua (ZSET base:sl2 of seq:cost members
// scored by ts, STRING base:slm2 "sum seq"); the rules are
// docs/algorithms.md, "Sliding window log" and "Leases".
//
// Expired entries are dropped only when a positive cost is admitted, so a
// denied or cost-0 check leaves the state untouched, as State requires; they
// are skipped, never counted, meanwhile.
type SlidingLogState struct {
	entries []slidingLogEntry // ordered by ts, oldest first; costs > 0
	sum     int64             // total cost of entries, expired ones included
	seq     int64             // the seq of the last entry written
}

// slidingLogEntry is one admitted request or lease grant: its time in ms
// since the Unix epoch (a grant's is the end of its lease), its cost in
// units, and its seq, which names it (Grant.Ref) until it has expired.
type slidingLogEntry struct {
	ts, cost, seq int64
}

// Check implements State. It writes only when it admits a positive cost.
func (s *SlidingLogState) Check(l Limit, nowMs, cost int64) Decision {
	d, _ := s.Acquire(l, nowMs, cost, cost, 0)
	return d
}

// Acquire implements State. A grant's entry is recorded at now + hold, the
// end of its lease, so that a unit spent at any moment of the lease stays in
// the rolling window at least a period after it was spent. Without a hold
// there is no end to record at, so it grants only cost.
func (s *SlidingLogState) Acquire(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	lim, p := l.Limit, l.PeriodMillis()
	c := max(cost, 1)

	// Entries are ordered by ts, so the expired ones are a prefix.
	live := sort.Search(len(s.entries), func(i int) bool { return s.entries[i].ts > nowMs-p })
	used := s.sum
	for _, e := range s.entries[:live] {
		used -= e.cost
	}

	var g Grant
	allowed := used+c <= lim
	if allowed && cost > 0 {
		hold := clampHold(holdMs)
		g.Units, g.UseWithin = cost, time.Duration(hold)*time.Millisecond
		if hold > 0 {
			g.Units = grantSize(cost, want, lim-used)
		}
		s.entries = s.entries[live:]
		// Seqs restart once every entry has expired, as they do on Redis
		// when the keys expire.
		if len(s.entries) == 0 {
			s.seq = 0
		}
		s.seq++
		g.Ref = s.seq
		// After a clock step backwards, or with a hold, ts can precede the
		// newest entry; insert in order (after equal times) so the expired
		// ones stay a prefix.
		ts := nowMs + hold
		at := sort.Search(len(s.entries), func(i int) bool { return s.entries[i].ts > ts })
		s.entries = slices.Insert(s.entries, at, slidingLogEntry{ts: ts, cost: g.Units, seq: s.seq})
		used += g.Units
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
	return d, g
}

// Release implements State: it shrinks the grant's entry (seq g.Ref, cost
// g.Units) by the units given back, keeping its time, or removes it when
// all are. An entry that has expired, or was already released, is left
// alone.
func (s *SlidingLogState) Release(l Limit, nowMs, units int64, g Grant) int64 {
	u := releaseUnits(l, units, g)
	if u <= 0 {
		return 0
	}
	i := slices.IndexFunc(s.entries, func(e slidingLogEntry) bool { return e.seq == g.Ref && e.cost == g.Units })
	if i < 0 || s.entries[i].ts <= nowMs-l.PeriodMillis() {
		return 0
	}
	if s.entries[i].cost -= u; s.entries[i].cost == 0 {
		s.entries = slices.Delete(s.entries, i, i+1)
	}
	s.sum -= u
	return u
}
