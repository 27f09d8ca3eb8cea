package redis

import (
	"math"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// This file measures how far behind the process runs: how long its
// goroutines have lately waited to run once runnable. A process that waits
// to run shares its machine's processors with something busier than they
// can serve (itself, most often), and a Redis beside it on that machine
// waits as long to answer: lateness that says nothing about Redis.

const (
	// lagEvery is how often the process's waits are read; lagWindow is how
	// far back lag looks, in readings.
	lagEvery  = 5 * time.Millisecond
	lagWindow = 20
)

// schedLag reads the process's scheduling latencies every lagEvery while
// it runs. Safe for concurrent use.
type schedLag struct {
	// worst holds, for each of the last lagWindow readings, the longest
	// wait to run seen since the reading before (ns): the longest bucket
	// of /sched/latencies:seconds that grew, or how late the reading
	// itself came, whichever is longer.
	worst [lagWindow]atomic.Int64
	// epoch is the zero of last, when the latest reading was taken (ns).
	epoch time.Time
	last  atomic.Int64
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once
}

// startSchedLag starts reading; close stops it.
func startSchedLag() *schedLag {
	s := &schedLag{epoch: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	return s
}

// lag is the longest wait to run the process's goroutines have had in the
// last lagWindow × lagEvery, the reading that is overdue now included: a
// process that has not run for a while may run a caller's timer before
// its next reading.
func (s *schedLag) lag() time.Duration {
	m := int64(time.Since(s.epoch)) - s.last.Load() - int64(lagEvery)
	for i := range s.worst {
		m = max(m, s.worst[i].Load())
	}
	return time.Duration(max(m, 0))
}

func (s *schedLag) run() {
	defer close(s.done)
	sample := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	var prev []uint64
	t := time.NewTicker(lagEvery)
	defer t.Stop()
	last := time.Now()
	for i := 0; ; i = (i + 1) % lagWindow {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		worst := now.Sub(last) - lagEvery
		last = now
		s.last.Store(int64(now.Sub(s.epoch)))
		metrics.Read(sample)
		if sample[0].Value.Kind() == metrics.KindFloat64Histogram {
			h := sample[0].Value.Float64Histogram()
			for b := len(h.Counts) - 1; b >= 0; b-- {
				if b < len(prev) && h.Counts[b] > prev[b] {
					// The bucket's upper bound: the wait was up to that
					// long, and the readings see only a sample of the
					// waits (the runtime times some of them), so the
					// estimate leans long. The last bucket has no bound:
					// its lower one, then.
					bound := h.Buckets[b+1]
					if math.IsInf(bound, 0) {
						bound = h.Buckets[b]
					}
					worst = max(worst, time.Duration(bound*float64(time.Second)))
					break
				}
			}
			prev = append(prev[:0], h.Counts...)
		}
		s.worst[i].Store(int64(max(worst, 0)))
	}
}

// close stops the readings. It may be called more than once.
func (s *schedLag) close() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}
