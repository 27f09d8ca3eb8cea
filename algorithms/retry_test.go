package algorithms_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// GCRA 100/min burst 20, twenty units spent at once.
// A denial of cost 1 says 596 ms (go-redis/redis_rate says the same); cost 5
// then needs 2,996 ms, not 596.
func TestRetryAfterForLargerCostGCRAExample(t *testing.T) {
	l := algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 100, Period: time.Minute, Burst: 20}
	s := algorithms.NewState(l.Algorithm)
	if d := s.Check(l, startMs, 20); !d.Allowed {
		t.Fatalf("burst of 20 denied: %+v", d)
	}
	one := s.Check(l, startMs+4, 1)
	if one.Allowed || one.RetryAfter != 596*time.Millisecond {
		t.Fatalf("cost 1: %+v, want denied with retry_after 596ms", one)
	}
	got, ok := l.RetryAfterFor(one, 1, 5)
	if !ok || got != 2996*time.Millisecond {
		t.Fatalf("RetryAfterFor(cost 5) = %v, %t; want 2.996s, true", got, ok)
	}
	if five := s.Check(l, startMs+4, 5); five.RetryAfter != got {
		t.Fatalf("the model says %v for cost 5", five.RetryAfter)
	}
}

// For every algorithm and many random states: whenever RetryAfterFor claims
// to know the wait of a larger cost from a denial, the model's own check of
// that cost at the same moment says exactly that, and so does it for the
// denial counted down to a later moment. The buckets and GCRA know whenever
// the extra units take whole ms (a divides them); the fixed window always
// knows; the sliding window log and counter never answer a larger cost.
func TestRetryAfterForMatchesTheModels(t *testing.T) {
	for _, alg := range algorithms.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			var derived, refused int
			for seed := range uint64(200) {
				rng := rand.New(rand.NewPCG(seed, 4000+uint64(alg)))
				l := everydayLimit(rng, alg)
				if seed%5 == 0 {
					l = extremeLimit(rng, alg)
				}
				d, r := checkRetryAfterFor(t, rng, l, seed)
				derived += d
				refused += r
			}
			t.Logf("%s: %d larger costs answered from a denial, %d left to the authority", alg, derived, refused)
			switch alg {
			case algorithms.SlidingWindowLog, algorithms.SlidingWindowCounter:
				if derived != 0 {
					t.Fatalf("answered %d larger costs; only the denied cost is known", derived)
				}
			default:
				if derived == 0 {
					t.Fatal("never answered a larger cost")
				}
			}
		})
	}
}

func checkRetryAfterFor(t *testing.T, rng *rand.Rand, l algorithms.Limit, seed uint64) (derived, refused int) {
	t.Helper()
	capacity := l.Capacity()
	a, b := l.Rate()
	s := algorithms.NewState(l.Algorithm)
	now := startMs
	for step := range 200 {
		dt, cost := randomStep(rng, l, false)
		now += dt
		d := s.Check(l, now, cost)
		if d.Allowed {
			continue
		}
		c := max(cost, 1)
		// Larger costs, all of them when few, else a sample with the ends.
		costs := []int64{c, capacity, min(capacity, c+1), min(capacity, c+b), min(capacity, c+a)}
		for range 8 {
			costs = append(costs, c+rng.Int64N(capacity-c+1))
		}
		for _, larger := range costs {
			got, ok := l.RetryAfterFor(d, cost, larger)
			truth := clone(s).Check(l, now, larger)
			if truth.Allowed {
				t.Fatalf("seed %d, %+v, step %d: cost %d denied but larger %d allowed", seed, l, step, c, larger)
			}
			if larger > c && !ok {
				refused++
				if (larger-c)%a == 0 && (l.Algorithm == algorithms.TokenBucket || l.Algorithm == algorithms.LeakyBucket || l.Algorithm == algorithms.GCRA) {
					t.Fatalf("seed %d, %+v (rate %d/%d), step %d: refused cost %d after a denial of %d %+v, but the rate pins it", seed, l, a, b, step, larger, c, d)
				}
				continue
			}
			if !ok || got != truth.RetryAfter {
				t.Fatalf("seed %d, %+v, step %d (now %d): denial of %d %+v; RetryAfterFor(%d) = %v, %t; the model says %v",
					seed, l, step, now, c, d, larger, got, ok, truth.RetryAfter)
			}
			if larger > c {
				derived++
			}
			// The same denial counted down by e ms (as the denied cache
			// and gossip hold it; Remaining is not updated) gives the
			// model's answer e ms later.
			if e := rng.Int64N(d.RetryAfter.Milliseconds()); e > 0 {
				later := d
				later.RetryAfter -= time.Duration(e) * time.Millisecond
				got, ok := l.RetryAfterFor(later, cost, larger)
				truth := clone(s).Check(l, now+e, larger)
				if !ok || got != truth.RetryAfter {
					t.Fatalf("seed %d, %+v, step %d (now %d): denial of %d %+v, %d ms later; RetryAfterFor(%d) = %v, %t; the model says %v",
						seed, l, step, now, c, d, e, larger, got, ok, truth.RetryAfter)
				}
			}
		}
		// A smaller cost is never answered: it may fit.
		if c > 1 {
			if _, ok := l.RetryAfterFor(d, cost, c-1); ok {
				t.Fatalf("seed %d, %+v: answered a smaller cost", seed, l)
			}
		}
	}
	return derived, refused
}

// Decisions that did not come from the limit are never answered for a
// larger cost.
func TestRetryAfterForRefusesWhatCannotBe(t *testing.T) {
	l := algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 10, Period: time.Second}
	denied := algorithms.Decision{Limit: 10, Remaining: 0, RetryAfter: 100 * time.Millisecond}
	if got, ok := l.RetryAfterFor(denied, 1, 3); !ok || got != 300*time.Millisecond {
		t.Fatalf("a consistent denial: %v, %t; want 300ms", got, ok)
	}
	// 3 units per 20 ms (a = 3, b = 20): 3 more units wait 20 ms more, 1
	// more an amount the denial does not pin.
	l3 := algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 1500, Period: 10 * time.Second}
	if got, ok := l3.RetryAfterFor(denied, 1, 4); !ok || got != 120*time.Millisecond {
		t.Errorf("a = 3, 3 more units: %v, %t; want 120ms", got, ok)
	}
	if got, ok := l3.RetryAfterFor(denied, 1, 2); ok {
		t.Errorf("a = 3, 1 more unit: answered %v", got)
	}
	for name, d := range map[string]algorithms.Decision{
		"allowed":               {Allowed: true, Limit: 10, Remaining: 5},
		"no retry":              {Limit: 10},
		"retry beyond a refill": {Limit: 10, RetryAfter: 2 * time.Second},
		"retry not whole ms":    {Limit: 10, RetryAfter: 100*time.Millisecond + 1},
	} {
		if got, ok := l.RetryAfterFor(d, 1, 3); ok {
			t.Errorf("%s: answered %v", name, got)
		}
	}
	if _, ok := l.RetryAfterFor(denied, 1, 11); ok {
		t.Error("answered a cost above the capacity")
	}
	if got, ok := l.RetryAfterFor(denied, 0, 1); !ok || got != denied.RetryAfter {
		t.Errorf("cost 0 counts as 1: %v, %t", got, ok)
	}
}
