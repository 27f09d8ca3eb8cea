package rlqs

// stats are the service's counters; the service's mutex guards them.
type stats struct {
	streamsOpened    uint64
	rounds           uint64
	exchanges        uint64
	exchangeFailures uint64
	charges          uint64
	abandoned        uint64
}
