package rlqs

import (
	"math"
	"slices"
	"strings"
)

// This file is what the service shows of itself: its counters, and
// Status, the figures of its limits, for /status and the metrics.

// stats are the service's counters; the service's mutex guards them.
type stats struct {
	streamsOpened    uint64
	rounds           uint64
	exchanges        uint64
	exchangeFailures uint64
	charges          uint64
	abandoned        uint64
}

// Status is the service's figures at one moment.
type Status struct {
	// Streams is the number of Envoy streams open now; StreamsOpened
	// counts every stream since start.
	Streams       int    `json:"streams"`
	StreamsOpened uint64 `json:"streams_opened"`
	// Rounds counts the rounds run; Exchanges and Charges the store
	// calls they made (one of each per limit per round, a charge only
	// when something was assigned), ExchangeFailures the exchanges that
	// failed.
	Rounds           uint64 `json:"rounds"`
	Exchanges        uint64 `json:"exchanges"`
	ExchangeFailures uint64 `json:"exchange_failures"`
	Charges          uint64 `json:"charges"`
	// Abandoned counts the buckets abandoned for idleness.
	Abandoned uint64 `json:"abandoned"`
	// Limits are the limits this member's Envoys share, by policy, then
	// key.
	Limits []LimitStatus `json:"limits"`
}

// LimitStatus is one limit as this member sees it after its last round.
type LimitStatus struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
	// Rate is the policy's rate, units a second.
	Rate float64 `json:"rate"`
	// Level is the fair level of the last round, units a second; nil
	// when every bucket got all it asked.
	Level *float64 `json:"level"`
	// Assigned is what this member assigned its buckets in the last
	// round, units a second.
	Assigned float64 `json:"assigned"`
	// Buckets is the number of this member's Envoy buckets of the
	// limit; Members the members that published demand for it.
	Buckets int `json:"buckets"`
	Members int `json:"members"`
	// InDebt reports that the last charge found the limit in debt: its
	// buckets are denied until it is paid.
	InDebt bool `json:"in_debt"`
	// Allowed and Denied are the requests its buckets reported, in all.
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
}

// Status returns the service's figures now. Safe for concurrent use.
func (s *Service) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{
		Streams: len(s.streams), StreamsOpened: s.stats.streamsOpened,
		Rounds: s.stats.rounds, Exchanges: s.stats.exchanges, ExchangeFailures: s.stats.exchangeFailures,
		Charges: s.stats.charges, Abandoned: s.stats.abandoned,
		Limits: []LimitStatus{},
	}
	for _, l := range s.limits {
		ls := LimitStatus{Policy: l.id.policy, Key: l.id.key, Rate: l.rate, Assigned: l.assigned, Buckets: len(l.buckets), Members: l.members, InDebt: l.inDebt}
		if !math.IsInf(l.level, 1) {
			level := l.level
			ls.Level = &level
		}
		for b := range l.buckets {
			ls.Allowed += b.allowed
			ls.Denied += b.denied
		}
		st.Limits = append(st.Limits, ls)
	}
	slices.SortFunc(st.Limits, func(a, b LimitStatus) int {
		if c := strings.Compare(a.Policy, b.Policy); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	return st
}
