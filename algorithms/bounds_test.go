package algorithms_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// No decision of any model exceeds MaxRetryAfter or MaxResetAfter, over
// random limits and random sequences of checks, lease acquisitions (with
// holds up to the bound's hold) and releases; and a bucket emptied in one
// go reaches the bound exactly, so it is not loose where it need not be.
func TestDecisionsStayWithinTheBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	limits := 0
	for limits < 600 {
		l := algorithms.Limit{
			Algorithm: algorithms.Algorithms()[rng.IntN(6)],
			Limit:     1 + rng.Int64N(50),
			Period:    time.Duration(1+rng.Int64N(10_000)) * time.Millisecond,
		}
		if rng.IntN(2) == 0 && l.Algorithm != algorithms.FixedWindow && l.Algorithm != algorithms.SlidingWindowLog && l.Algorithm != algorithms.SlidingWindowCounter {
			l.Burst = 1 + rng.Int64N(100)
		}
		if l.Validate() != nil {
			continue
		}
		limits++
		hold := time.Duration(rng.Int64N(l.PeriodMillis()+1)) * time.Millisecond
		maxReset := l.MaxResetAfter(hold)
		s := algorithms.NewState(l.Algorithm)
		now := startMs + rng.Int64N(1_000_000)
		var grants []algorithms.Grant
		for step := range 300 {
			now += rng.Int64N(l.PeriodMillis()/4 + 2)
			if len(grants) > 0 && rng.IntN(4) == 0 {
				g := grants[len(grants)-1]
				grants = grants[:len(grants)-1]
				s.Release(l, now, rng.Int64N(g.Units+1), g)
				continue
			}
			cost := rng.Int64N(l.Capacity() + 1)
			want := cost + rng.Int64N(l.Capacity()-cost+1)
			h := int64(0)
			if rng.IntN(2) == 0 {
				h = rng.Int64N(hold.Milliseconds() + 1)
			}
			d, g := s.Acquire(l, now, cost, want, h)
			if g.Units > 0 {
				grants = append(grants, g)
			}
			if d.RetryAfter > l.MaxRetryAfter(cost, hold) || d.ResetAfter > maxReset {
				t.Fatalf("%+v, hold %s, step %d, cost %d: %+v exceeds retry bound %s or reset bound %s",
					l, hold, step, cost, d, l.MaxRetryAfter(cost, hold), maxReset)
			}
		}
	}

	for _, a := range []algorithms.Algorithm{algorithms.TokenBucket, algorithms.LeakyBucket, algorithms.GCRA} {
		l := algorithms.Limit{Algorithm: a, Limit: 3, Period: time.Second, Burst: 7}
		s := algorithms.NewState(a)
		if d := s.Check(l, startMs, 7); !d.Allowed {
			t.Fatalf("%s: a full bucket denied its capacity: %+v", a, d)
		}
		d := s.Check(l, startMs, 7)
		if want := l.MaxRetryAfter(7, 0); d.Allowed || d.RetryAfter != want || want != 2334*time.Millisecond {
			t.Fatalf("%s: an emptied bucket retries after %s; the bound is %s, want 7 × 1s / 3 = 2334ms", a, d.RetryAfter, want)
		}
	}
}
