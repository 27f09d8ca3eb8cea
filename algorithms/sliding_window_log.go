package algorithms

import (
	"slices"
	"sort"
	"strconv"
	"time"
)

// SlidingLogState is one key's sliding window log: every admitted request
// with its time and cost, so that at most the limit is admitted in any
// rolling period. An entry counts while ts > now - period. The zero value is
// a fresh state (an empty log). Like every State, it is not safe for
// concurrent use.
//
// It mirrors scripts/sliding_window_log.lua and
// scripts/release_sliding_window_log.lua (ZSET base:sl3 of seq:cost members
// scored by ts, STRING base:slm3 "sum seq"); the rules are
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
	return s.acquire(l, nowMs, cost, want, holdMs, false)
}

// Charge implements State. A cost that does not fit is recorded without
// adding an entry, so that the log never holds more than about limit
// entries however many charges come: it joins the newest entry, which
// moves to now if it is older (holding its own units a little longer,
// never less). Into an empty log it goes as an entry of its own.
func (s *SlidingLogState) Charge(l Limit, nowMs, cost, want, holdMs int64) (Decision, Grant) {
	return s.acquire(l, nowMs, cost, want, holdMs, true)
}

// acquire is Acquire, or Charge when charge.
func (s *SlidingLogState) acquire(l Limit, nowMs, cost, want, holdMs int64, charge bool) (Decision, Grant) {
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
	if !allowed && charge && cost > 0 {
		used = s.charge(nowMs, live, min(cost, MaxExact-used), used)
		live = 0
	}

	// used exceeds lim only when the key's limit shrank since it was spent.
	d := Decision{Allowed: allowed, Limit: lim, Remaining: max(0, lim-used)}
	if used > 0 {
		newest := s.entries[len(s.entries)-1].ts
		d.ResetAfter = time.Duration(newest+p-nowMs) * time.Millisecond
	}
	switch {
	case !allowed && c > lim:
		// A charge that can never fit: when the quota is whole again.
		d.RetryAfter = d.ResetAfter
	case !allowed:
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

// charge records units that did not fit at nowMs, the log's first live
// entries being s.entries[live:] and used their units, and returns the
// units in use after it. Expired entries go, as on any write. Seqs restart
// on a log with no live entry, as an admission's do.
func (s *SlidingLogState) charge(nowMs int64, live int, units, used int64) int64 {
	s.entries = s.entries[live:]
	if len(s.entries) == 0 {
		s.seq = 1
		s.entries = append(s.entries, slidingLogEntry{ts: nowMs, cost: units, seq: s.seq})
		s.sum = units
		return units
	}
	// The newest entry, as Redis orders a sorted set: by ts, then, among
	// equal ts, by the member "seq:cost" as bytes.
	i := len(s.entries) - 1
	for j := i - 1; j >= 0 && s.entries[j].ts == s.entries[i].ts; j-- {
		if s.entries[j].member() > s.entries[i].member() {
			i = j
		}
	}
	e := s.entries[i]
	s.entries = slices.Delete(s.entries, i, i+1)
	// A new seq, so that no grant's Release finds the merged entry: it
	// holds units that were never granted.
	s.seq++
	s.entries = append(s.entries, slidingLogEntry{ts: max(e.ts, nowMs), cost: e.cost + units, seq: s.seq})
	s.sum = used + units
	return s.sum
}

// member is the entry's sorted-set member on Redis, "seq:cost".
func (e slidingLogEntry) member() string {
	return strconv.FormatInt(e.seq, 10) + ":" + strconv.FormatInt(e.cost, 10)
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
