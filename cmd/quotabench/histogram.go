package main

import (
	"math"
	"math/bits"
	"time"
)

// The latency histogram is log-linear, like HdrHistogram: every power of two
// of nanoseconds is split into histSub equal buckets, so a bucket is at most
// 1/128 of its values wide and a percentile read at the bucket's midpoint is
// within 0.4% of the recorded value. Values below 2·histSub ns get a bucket
// each. Recording is an index computation and an increment: no allocation
// and no lock, because each client owns its histogram.
const (
	histSubBits = 7
	histSub     = 1 << histSubBits
	// histMaxBits bounds the recorded range to 2^36 ns (about 68.7 s),
	// above the longest -timeout; longer values land in the last bucket
	// (the exact maximum is kept separately).
	histMaxBits = 36
	histBuckets = (histMaxBits-histSubBits)*histSub + histSub
)

// histogram counts latencies. The zero value is empty and ready. It is not
// safe for concurrent use: each client records into its own and the run
// merges them at the end.
type histogram struct {
	// counts is per bucket; uint32 keeps a client's histogram at 15 KiB and
	// cannot overflow: a client would need 4·10⁹ checks within the longest
	// -duration.
	counts [histBuckets]uint32
	n      uint64
	max    time.Duration
}

// bucketOf returns the bucket index of v nanoseconds, v ≥ 0.
func bucketOf(v uint64) int {
	if v < 2*histSub {
		return int(v)
	}
	// e is how far v must be shifted right to leave histSubBits+1
	// significant bits, i.e. a mantissa in [histSub, 2·histSub).
	e := bits.Len64(v) - (histSubBits + 1)
	i := e*histSub + int(v>>e)
	if i >= histBuckets {
		return histBuckets - 1
	}
	return i
}

// bucketRange returns the smallest and largest value of bucket i.
func bucketRange(i int) (lo, hi uint64) {
	if i < 2*histSub {
		return uint64(i), uint64(i)
	}
	e := i/histSub - 1
	m := uint64(i - e*histSub)
	return m << e, (m+1)<<e - 1
}

// record adds one latency; negative values count as 0.
func (h *histogram) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d))]++
	h.n++
	if d > h.max {
		h.max = d
	}
}

// merged is the sum of several histograms, with 64-bit counts.
type merged struct {
	counts [histBuckets]uint64
	n      uint64
	max    time.Duration
}

func (m *merged) add(h *histogram) {
	for i, c := range h.counts {
		m.counts[i] += uint64(c)
	}
	m.n += h.n
	if h.max > m.max {
		m.max = h.max
	}
}

// quantile returns the latency below or at which a fraction q (0 < q ≤ 1) of
// the recorded latencies lie: the midpoint of the bucket holding the
// ceil(q·n)-th smallest value, never above the exact maximum. It is 0 when
// nothing was recorded.
func (m *merged) quantile(q float64) time.Duration {
	if m.n == 0 {
		return 0
	}
	rank := max(1, min(uint64(math.Ceil(q*float64(m.n))), m.n))
	var seen uint64
	for i, c := range m.counts {
		seen += c
		if seen >= rank {
			lo, hi := bucketRange(i)
			return min(time.Duration(lo+(hi-lo)/2), m.max)
		}
	}
	return m.max
}
