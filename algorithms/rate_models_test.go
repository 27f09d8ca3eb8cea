package algorithms_test

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/internal/redistest"
)

// Tests of the rate algorithms (token bucket, leaky bucket, GCRA): the
// worked examples of docs/algorithms.md through the Go models and the Lua
// scripts, property tests of the models' invariants, and the scripts against
// the models on random sequences.

var rateAlgorithms = []algorithms.Algorithm{algorithms.TokenBucket, algorithms.LeakyBucket, algorithms.GCRA}

// startMs is the examples' time zero, ms since the Unix epoch (Nov 2023).
const startMs = int64(1_700_000_000_000)

// maxWaitMs is the longest wait a time.Duration holds in whole ms. Random
// limits are kept below it so no wait saturates (TestRateModelsSaturateLongWaits
// covers those that do).
const maxWaitMs = math.MaxInt64 / int64(time.Millisecond)

// rateStep is one check of a worked example and the decision it must get.
type rateStep struct {
	atMs    int64 // since startMs
	cost    int64
	allowed bool
	// remaining in units; resetMs and retryMs are ResetAfter and RetryAfter
	// in whole ms.
	remaining, resetMs, retryMs int64
}

func (s rateStep) want(l algorithms.Limit) algorithms.Decision {
	return algorithms.Decision{
		Allowed:    s.allowed,
		Limit:      l.Capacity(),
		Remaining:  s.remaining,
		ResetAfter: time.Duration(s.resetMs) * time.Millisecond,
		RetryAfter: time.Duration(s.retryMs) * time.Millisecond,
	}
}

// times returns n steps made by f from the index 0 to n-1.
func times(n int64, f func(i int64) rateStep) []rateStep {
	steps := make([]rateStep, n)
	for i := range n {
		steps[i] = f(i)
	}
	return steps
}

type rateExample struct {
	name  string
	limit algorithms.Limit
	steps []rateStep
}

// rateExamples are the worked examples of docs/algorithms.md. Every one runs
// through the Go model and through the Lua script.
var rateExamples = []rateExample{
	{
		// Rate a/b = 1/600: one token every 600 ms.
		name:  "token_bucket 100 per minute: burst, refill after 10 s",
		limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 100, Period: time.Minute},
		steps: concat(
			times(100, func(i int64) rateStep { return rateStep{0, 1, true, 99 - i, (i + 1) * 600, 0} }),
			[]rateStep{
				{0, 1, false, 0, 60_000, 600}, // the 101st
				{0, 0, false, 0, 60_000, 600}, // cost 0: would one unit fit? No.
				// 10 s later 16 and 400/600 tokens have refilled.
				{10_000, 17, false, 16, 50_000, 200},
			},
			times(16, func(i int64) rateStep { return rateStep{10_000, 1, true, 15 - i, (85+i)*600 - 400, 0} }),
			[]rateStep{
				{10_000, 1, false, 0, 59_600, 200}, // the 17th
				// Full 59.6 s after the second burst (60 s after the first,
				// less the 400/600 token already refilled).
				{69_599, 0, true, 99, 1, 0},
				{69_600, 0, true, 100, 0, 0},
			},
		),
	},
	{
		name:  "token_bucket 100 per minute: full again 60 s after the burst",
		limit: algorithms.Limit{Algorithm: algorithms.TokenBucket, Limit: 100, Period: time.Minute},
		steps: concat(
			times(100, func(i int64) rateStep { return rateStep{0, 1, true, 99 - i, (i + 1) * 600, 0} }),
			[]rateStep{
				{59_999, 0, true, 99, 1, 0},
				{60_000, 0, true, 100, 0, 0},
				{60_000, 100, true, 0, 60_000, 0},
			},
		),
	},
	{
		// Rate a/b = 1/100: one unit drains every 100 ms.
		name:  "leaky_bucket capacity 10, 10 per second",
		limit: algorithms.Limit{Algorithm: algorithms.LeakyBucket, Limit: 10, Period: time.Second, Burst: 10},
		steps: concat(
			// 15 instant requests: 10 pass, 5 are cut.
			times(10, func(i int64) rateStep { return rateStep{0, 1, true, 9 - i, (i + 1) * 100, 0} }),
			times(5, func(int64) rateStep { return rateStep{0, 1, false, 0, 1000, 100} }),
			[]rateStep{
				// One unit has drained after 100 ms.
				{100, 1, true, 0, 1000, 0},
				{100, 1, false, 0, 1000, 100},
				// Half a unit has drained after 50 ms more; the level
				// rounds up, so nothing fits yet.
				{150, 1, false, 0, 950, 50},
				{150, 3, false, 0, 950, 250},
				{150, 0, false, 0, 950, 50},
			},
			// 1 s after it was last full the bucket is empty: a full 10 pass.
			times(10, func(i int64) rateStep { return rateStep{1100, 1, true, 9 - i, (i + 1) * 100, 0} }),
			[]rateStep{{1100, 1, false, 0, 1000, 100}},
		),
	},
	{
		// Rate a/b = 1/500; the capacity exceeds the rate.
		name:  "leaky_bucket capacity 5, 2 per second",
		limit: algorithms.Limit{Algorithm: algorithms.LeakyBucket, Limit: 2, Period: time.Second, Burst: 5},
		steps: concat(
			times(5, func(i int64) rateStep { return rateStep{0, 1, true, 4 - i, (i + 1) * 500, 0} }),
			[]rateStep{
				{0, 1, false, 0, 2500, 500},
				{0, 5, false, 0, 2500, 2500},
				// 2.5 units have drained: the level reads 3.
				{1250, 3, false, 2, 1250, 250},
				{1250, 2, true, 0, 2250, 0},
			},
		),
	},
	// The GCRA examples must give go-redis/redis_rate's results for the same
	// inputs. redis_rate is not a dependency; the values below were computed
	// by hand from its Lua script (T = period/rate, all in ms):
	//   new_tat = max(tat, now) + cost*T; allow_at = new_tat - burst*T
	//   allowed ⇔ now ≥ allow_at; remaining = floor((now - allow_at)/T)
	//   retry_after = allow_at - now; reset_after = new_tat - now
	//   (on a denial: remaining 0, reset_after = max(tat, now) - now)
	// Where redis_rate's T is fractional its waits are fractional ms; ours
	// are rounded up to whole ms, as the comments note.
	{
		// redis_rate.PerSecond(10): rate 10, burst 10, period 1 s; T = 100 ms.
		name:  "gcra redis_rate.PerSecond(10)",
		limit: algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 10, Period: time.Second, Burst: 10},
		steps: concat(
			times(10, func(i int64) rateStep { return rateStep{0, 1, true, 9 - i, (i + 1) * 100, 0} }),
			[]rateStep{
				{0, 1, false, 0, 1000, 100}, // tat 1000: allow_at 100
				{100, 1, true, 0, 1000, 0},  // new_tat 1100, allow_at 100
				{550, 1, true, 3, 650, 0},   // new_tat 1200, allow_at 200: 3.5 left
			},
		),
	},
	{
		// redis_rate.PerMinute(100) with Burst 5: T = 600 ms.
		name:  "gcra redis_rate.PerMinute(100) burst 5",
		limit: algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 100, Period: time.Minute, Burst: 5},
		steps: concat(
			times(5, func(i int64) rateStep { return rateStep{0, 1, true, 4 - i, (i + 1) * 600, 0} }),
			[]rateStep{
				{0, 1, false, 0, 3000, 600},    // allow_at 600
				{599, 1, false, 0, 2401, 1},    // allow_at 600
				{600, 1, true, 0, 3000, 0},     // new_tat 3600, allow_at 600
				{2100, 2, true, 0, 2700, 0},    // new_tat 4800, allow_at 1800: 0.5 left
				{2100, 1, false, 0, 2700, 300}, // allow_at 2400
			},
		),
	},
	{
		// Rate 3, burst 2, period 1 s: T = 333⅓ ms, so tat is fractional.
		name:  "gcra 3 per second burst 2",
		limit: algorithms.Limit{Algorithm: algorithms.GCRA, Limit: 3, Period: time.Second, Burst: 2},
		steps: []rateStep{
			{0, 1, true, 1, 334, 0},    // redis_rate: reset_after 333.3 ms
			{0, 1, true, 0, 667, 0},    // 666.7 ms
			{0, 1, false, 0, 667, 334}, // reset_after 666.7, retry_after 333.3 ms
			{333, 1, false, 0, 334, 1}, // 333.7 ms and 0.3 ms
			{334, 1, true, 0, 666, 0},  // allow_at was 333.3: new_tat 1000
		},
	},
}

func concat(parts ...[]rateStep) []rateStep {
	var all []rateStep
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

func TestRateModelExamples(t *testing.T) {
	for _, ex := range rateExamples {
		t.Run(ex.name, func(t *testing.T) {
			if err := ex.limit.Validate(); err != nil {
				t.Fatal(err)
			}
			s := algorithms.NewState(ex.limit.Algorithm)
			for i, st := range ex.steps {
				got := s.Check(ex.limit, startMs+st.atMs, st.cost)
				if want := st.want(ex.limit); got != want {
					t.Fatalf("step %d (at %d ms, cost %d):\n got  %+v\n want %+v", i, st.atMs, st.cost, got, want)
				}
			}
		})
	}
}

func TestRateScriptExamples(t *testing.T) {
	sc := newScriptClient(t)
	for n, ex := range rateExamples {
		t.Run(ex.name, func(t *testing.T) {
			base := fmt.Sprintf("{example:%d}", n)
			for i, st := range ex.steps {
				got := sc.check(t, ex.limit, base, startMs+st.atMs, st.cost)
				if want := st.want(ex.limit); got != want {
					t.Fatalf("step %d (at %d ms, cost %d):\n got  %+v\n want %+v", i, st.atMs, st.cost, got, want)
				}
			}
		})
	}
}

// A 1000-unit bucket refilled at 1 unit a year needs 1000 years to refill,
// more than a time.Duration holds: the wait saturates instead of wrapping.
func TestRateModelsSaturateLongWaits(t *testing.T) {
	year := 365 * 24 * time.Hour
	for _, alg := range rateAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			l := algorithms.Limit{Algorithm: alg, Limit: 1, Period: year, Burst: 1000}
			if err := l.Validate(); err != nil {
				t.Fatal(err)
			}
			s := algorithms.NewState(alg)
			d := s.Check(l, startMs, 1000)
			if !d.Allowed || d.ResetAfter != time.Duration(maxWaitMs)*time.Millisecond {
				t.Fatalf("spending the burst: %+v", d)
			}
			d = s.Check(l, startMs, 1)
			if d.Allowed || d.RetryAfter != year || d.ResetAfter != time.Duration(maxWaitMs)*time.Millisecond {
				t.Fatalf("after the burst: %+v", d)
			}
		})
	}
}

// TestRateModelProperties checks the invariants every rate model keeps, on
// seeded random limits and sequences with a clock that never goes back:
//   - the decision is well formed: Limit = capacity, remaining in [0,
//     capacity], retry_after 0 exactly when allowed, reset_after 0 exactly
//     when full;
//   - a denial and a cost-0 check change nothing, and cost 0 answers as a
//     cost-1 check would;
//   - retry_after is exact: the same cost is denied 1 ms before it and
//     allowed at it;
//   - reset_after is exact: the quota is full at it and not 1 ms before;
//   - never over-admit: in any interval [t0, t1] at most capacity +
//     floor((t1 - t0) × limit / period) units are admitted.
func TestRateModelProperties(t *testing.T) {
	for _, alg := range rateAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			for seed := range uint64(300) {
				rng := rand.New(rand.NewPCG(seed, uint64(alg)))
				var l algorithms.Limit
				if seed%5 == 0 {
					l = extremeLimit(rng, alg)
				} else {
					l = everydayLimit(rng, alg)
				}
				checkRateProperties(t, rng, l, seed)
			}
		})
	}
}

func checkRateProperties(t *testing.T, rng *rand.Rand, l algorithms.Limit, seed uint64) {
	t.Helper()
	capacity := l.Capacity()
	s := algorithms.NewState(l.Algorithm)
	now := startMs
	var admitted []admission
	for step := range 300 {
		dt, cost := randomStep(rng, l, false)
		now += dt
		before := clone(s)
		d := s.Check(l, now, cost)
		where := func() string {
			return fmt.Sprintf("seed %d, %+v, step %d (now %d, cost %d) got %+v", seed, l, step, now, cost, d)
		}
		checkDecision(t, l, d, where)

		if (!d.Allowed || cost == 0) && !reflect.DeepEqual(before, s) {
			t.Fatalf("%s: mutated the state from %+v to %+v", where(), before, s)
		}
		if cost == 0 {
			one := clone(before).Check(l, now, 1)
			if one.Allowed != d.Allowed || (!d.Allowed && one != d) {
				t.Fatalf("%s: cost 1 got %+v", where(), one)
			}
		}
		if d.Allowed && cost > 0 {
			admitted = append(admitted, admission{now, cost})
		}

		if !d.Allowed {
			retry := d.RetryAfter.Milliseconds()
			if early := clone(before).Check(l, now+retry-1, cost); early.Allowed {
				t.Fatalf("%s: allowed 1 ms before retry_after: %+v", where(), early)
			}
			if on := clone(before).Check(l, now+retry, cost); !on.Allowed {
				t.Fatalf("%s: denied at retry_after: %+v", where(), on)
			}
		}
		if reset := d.ResetAfter.Milliseconds(); reset > 0 {
			if early := clone(s).Check(l, now+reset-1, 0); early.Remaining == capacity {
				t.Fatalf("%s: full 1 ms before reset_after: %+v", where(), early)
			}
			if on := clone(s).Check(l, now+reset, 0); on.Remaining != capacity || on.ResetAfter != 0 {
				t.Fatalf("%s: not full at reset_after: %+v", where(), on)
			}
		}
	}
	checkNoOverAdmission(t, l, admitted, seed)
}

type admission struct{ nowMs, cost int64 }

// checkNoOverAdmission checks that for every i ≤ j the admissions i..j total
// at most capacity + floor((t_j - t_i) × a / b).
func checkNoOverAdmission(t *testing.T, l algorithms.Limit, admitted []admission, seed uint64) {
	t.Helper()
	a, b := l.Rate()
	prefix := make([]int64, len(admitted)+1)
	for i, ad := range admitted {
		prefix[i+1] = prefix[i] + ad.cost
	}
	for i := range admitted {
		for j := i; j < len(admitted); j++ {
			units := uint64(prefix[j+1] - prefix[i])
			// (t_j - t_i) × a can exceed 64 bits for extreme limits.
			hi, lo := bits.Mul64(uint64(admitted[j].nowMs-admitted[i].nowMs), uint64(a))
			if hi >= uint64(b) {
				continue // the refill alone exceeds 2^64 units
			}
			refill, _ := bits.Div64(hi, lo, uint64(b))
			if bound := uint64(l.Capacity()) + refill; refill < 1<<62 && units > bound {
				t.Fatalf("seed %d, %+v: admitted %d units between %d and %d ms, more than capacity + refill = %d",
					seed, l, units, admitted[i].nowMs, admitted[j].nowMs, bound)
			}
		}
	}
}

// Under a clock that goes backwards and a limit that changes between checks
// (a policy edited while keys hold state) decisions stay well formed and
// denials and cost-0 checks still change nothing.
func TestRateModelsClockBackwardsAndLimitChanges(t *testing.T) {
	for _, alg := range rateAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			for seed := range uint64(200) {
				rng := rand.New(rand.NewPCG(seed, 1000+uint64(alg)))
				limits := []algorithms.Limit{everydayLimit(rng, alg), everydayLimit(rng, alg), extremeLimit(rng, alg)}
				s := algorithms.NewState(alg)
				now := startMs
				for step := range 300 {
					l := limits[0]
					if rng.IntN(10) == 0 {
						l = limits[1+rng.IntN(2)]
					}
					dt, cost := randomStep(rng, l, true)
					now += dt
					before := clone(s)
					d := s.Check(l, now, cost)
					where := func() string {
						return fmt.Sprintf("seed %d, %+v, step %d (now %d, cost %d) got %+v", seed, l, step, now, cost, d)
					}
					checkDecision(t, l, d, where)
					if (!d.Allowed || cost == 0) && !reflect.DeepEqual(before, s) {
						t.Fatalf("%s: mutated the state from %+v to %+v", where(), before, s)
					}
				}
			}
		})
	}
}

// The leaky bucket's meter is the token bucket upside down (free space =
// capacity - level), so the two decide identically from fresh states, even
// when the clock goes backwards.
func TestLeakyBucketMirrorsTokenBucket(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 2000))
		l := everydayLimit(rng, algorithms.TokenBucket)
		if seed%5 == 0 {
			l = extremeLimit(rng, algorithms.TokenBucket)
		}
		ll := l
		ll.Algorithm = algorithms.LeakyBucket
		tb, lb := algorithms.NewState(l.Algorithm), algorithms.NewState(ll.Algorithm)
		now := startMs
		for step := range 300 {
			dt, cost := randomStep(rng, l, seed%2 == 0)
			now += dt
			if dt, dl := tb.Check(l, now, cost), lb.Check(ll, now, cost); dt != dl {
				t.Fatalf("seed %d, %+v, step %d (now %d, cost %d):\n token bucket %+v\n leaky bucket %+v", seed, l, step, now, cost, dt, dl)
			}
		}
	}
}

// TestRateScriptsMatchModels runs random sequences through each Lua script
// and its Go model and requires identical decisions, including limits at the
// bounds of exact arithmetic, a clock that goes backwards and limits that
// change between checks. scriptClient.check also verifies what each script
// writes and the TTL it sets.
func TestRateScriptsMatchModels(t *testing.T) {
	sc := newScriptClient(t)
	for _, alg := range rateAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			for seed := range uint64(40) {
				rng := rand.New(rand.NewPCG(seed, 3000+uint64(alg)))
				var limits []algorithms.Limit
				if seed%2 == 0 {
					limits = []algorithms.Limit{extremeLimit(rng, alg), extremeLimit(rng, alg)}
				} else {
					limits = []algorithms.Limit{everydayLimit(rng, alg), everydayLimit(rng, alg)}
				}
				backwards, changes := seed%4 == 1, seed%8 == 3
				base := fmt.Sprintf("{diff:%d}", seed)
				s := algorithms.NewState(alg)
				now := startMs
				for step := range 80 {
					l := limits[0]
					if changes && rng.IntN(5) == 0 {
						l = limits[1]
					}
					dt, cost := randomStep(rng, l, backwards)
					now += dt
					want := s.Check(l, now, cost)
					if got := sc.check(t, l, base, now, cost); got != want {
						t.Fatalf("seed %d, %+v, step %d (now %d, cost %d):\n script %+v\n model  %+v", seed, l, step, now, cost, got, want)
					}
				}
			}
		})
	}
}

// checkDecision checks that d is well formed for l. where describes the
// check for a failure message; it is called only on failure.
func checkDecision(t *testing.T, l algorithms.Limit, d algorithms.Decision, where func() string) {
	t.Helper()
	capacity := l.Capacity()
	switch {
	case d.Limit != capacity:
		t.Fatalf("%s: limit is not the capacity %d", where(), capacity)
	case d.Remaining < 0 || d.Remaining > capacity:
		t.Fatalf("%s: remaining outside [0, %d]", where(), capacity)
	case d.Allowed != (d.RetryAfter == 0):
		t.Fatalf("%s: retry_after must be 0 exactly when allowed", where())
	case d.RetryAfter < 0 || d.ResetAfter < 0:
		t.Fatalf("%s: negative wait", where())
	case (d.ResetAfter == 0) != (d.Remaining == capacity):
		t.Fatalf("%s: reset_after must be 0 exactly when the quota is full", where())
	case d.ResetAfter%time.Millisecond != 0 || d.RetryAfter%time.Millisecond != 0:
		t.Fatalf("%s: waits must be whole ms", where())
	}
}

// everydayLimit returns a valid limit of alg with a modest rate and burst.
func everydayLimit(rng *rand.Rand, alg algorithms.Algorithm) algorithms.Limit {
	periods := []time.Duration{time.Millisecond, 3 * time.Millisecond, 100 * time.Millisecond, time.Second,
		1001 * time.Millisecond, time.Minute, time.Hour, 24 * time.Hour}
	limits := []int64{1, 2, 3, 7, 10, 100, 1000, 1 + rng.Int64N(5000)}
	for {
		l := algorithms.Limit{Algorithm: alg, Limit: limits[rng.IntN(len(limits))], Period: periods[rng.IntN(len(periods))]}
		switch rng.IntN(3) {
		case 1:
			l.Burst = 1 + rng.Int64N(20)
		case 2:
			l.Burst = 1 + rng.Int64N(2*l.Limit)
		}
		if l.Validate() == nil {
			return l
		}
	}
}

// extremeLimit returns a valid limit of alg whose products reach the 2^52
// bound of Limit.Validate, or whose rate or period is at its extreme, but
// whose longest wait still fits a time.Duration.
func extremeLimit(rng *rand.Rand, alg algorithms.Algorithm) algorithms.Limit {
	periodsMs := []int64{1, 7, 1000, 999_983, 86_400_000, 365 * 86_400_000}
	limits := []int64{1, 3, 1000, 123_457, 1 << 30, 1 << 40, algorithms.MaxExact - 1, algorithms.MaxExact}
	for {
		l := algorithms.Limit{
			Algorithm: alg,
			Limit:     limits[rng.IntN(len(limits))],
			Period:    time.Duration(periodsMs[rng.IntN(len(periodsMs))]) * time.Millisecond,
		}
		_, b := l.Rate()
		switch top := algorithms.MaxExact / b; rng.IntN(4) {
		case 1:
			l.Burst = top
		case 2:
			l.Burst = max(1, top-rng.Int64N(1000))
		case 3:
			l.Burst = 1 + rng.Int64N(top)
		}
		a, b := l.Rate()
		if l.Validate() == nil && l.Capacity()*b/a < maxWaitMs {
			return l
		}
	}
}

// randomStep returns how far the clock moves, in ms, and a cost for the next
// check of l: many checks at the same ms (bursts), steps of about an
// emission interval, and sometimes the time to refill the whole capacity.
// With backwards the clock sometimes steps back.
func randomStep(rng *rand.Rand, l algorithms.Limit, backwards bool) (dt, cost int64) {
	capacity := l.Capacity()
	a, b := l.Rate()
	interval := (b + a - 1) / a
	// The whole capacity refills in capacity × interval ms; capping keeps
	// now far from overflow for extreme limits.
	refill := min(capacity, (1<<36)/interval) * interval
	switch r := rng.IntN(20); {
	case r < 8:
		dt = 0
	case r < 11:
		dt = 1 + rng.Int64N(3)
	case r < 17:
		dt = rng.Int64N(2*interval + 1)
	default:
		dt = rng.Int64N(refill + 2)
	}
	if backwards && rng.IntN(8) == 0 {
		dt = -rng.Int64N(2*interval + 1000)
	}
	switch r := rng.IntN(10); {
	case r == 0:
		cost = 0
	case r < 3:
		cost = rng.Int64N(capacity + 1)
	case r == 3:
		cost = capacity
	default:
		cost = 1
	}
	return dt, cost
}

// clone returns a copy of s, a pointer to one of the state structs.
func clone(s algorithms.State) algorithms.State {
	v := reflect.ValueOf(s).Elem()
	p := reflect.New(v.Type())
	p.Elem().Set(v)
	return p.Interface().(algorithms.State)
}

// scriptClient runs the rate algorithms' check scripts on a redis-server of
// the test's own.
type scriptClient struct {
	rdb     *redis.Client
	scripts map[algorithms.Algorithm]*redis.Script
}

func newScriptClient(t *testing.T) *scriptClient {
	t.Helper()
	srv := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { rdb.Close() })
	sc := &scriptClient{rdb: rdb, scripts: make(map[algorithms.Algorithm]*redis.Script)}
	for _, alg := range rateAlgorithms {
		sc.scripts[alg] = redis.NewScript(algorithms.CheckScript(alg))
		if err := sc.scripts[alg].Load(context.Background(), rdb).Err(); err != nil {
			t.Fatalf("load %s: %v", alg, err)
		}
	}
	return sc
}

// check runs l's script for base at nowMs (EVALSHA, as the store does) and
// returns its decision. In the same transaction it reads the key before and
// after, and fails the test unless the script wrote exactly when it admitted
// a positive cost, with a TTL of the decision's reset_after. It then removes
// the TTL, so that the test's explicit clock, not the wall clock, decides
// what the next check sees.
func (sc *scriptClient) check(t *testing.T, l algorithms.Limit, base string, nowMs, cost int64) algorithms.Decision {
	t.Helper()
	ctx := context.Background()
	keys := algorithms.Keys(l.Algorithm, base)
	key := keys[0]
	for attempt := 1; ; attempt++ {
		pipe := sc.rdb.TxPipeline()
		// MGET: a missing key is nil rather than a failed command.
		before := pipe.MGet(ctx, key)
		eval := sc.scripts[l.Algorithm].EvalSha(ctx, pipe, keys, algorithms.CheckArgs(l, cost, nowMs)...)
		after := pipe.MGet(ctx, key)
		pttl := pipe.Do(ctx, "PTTL", key)
		pipe.Persist(ctx, key)
		sent := time.Now()
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("%s at %d, cost %d: %v", l.Algorithm, nowMs, cost, err)
		}
		// The transaction's commands run back to back, but a descheduled
		// redis-server's clock still moves between them: never by more
		// than the whole round trip took.
		slackMs := max(10, time.Since(sent).Milliseconds()+1)
		d, err := algorithms.DecodeCheckReply(eval.Val())
		if err != nil {
			t.Fatalf("%s at %d, cost %d: %v", l.Algorithm, nowMs, cost, err)
		}
		ttl, _ := pttl.Int64()
		if !d.Allowed || cost == 0 {
			// The previous check removed any TTL, so -1 (no TTL) or -2 (no
			// key) means the script set none.
			if before.Val()[0] != after.Val()[0] || ttl >= 0 {
				t.Fatalf("%s at %d, cost %d: %+v wrote: %v → %v, TTL %d", l.Algorithm, nowMs, cost, d, before.Val(), after.Val(), ttl)
			}
			return d
		}
		if after.Val()[0] == nil && d.ResetAfter <= 2*time.Millisecond && attempt < 5 {
			// Redis 7.0's clock can tick between the script and the next
			// command of the same transaction, so a key written with a 1 ms
			// TTL may already be gone: expired on the server's clock, not
			// the test's. Put the state back and run the step again; the
			// script is deterministic given the state and now.
			sc.restore(t, key, before.Val()[0])
			continue
		}
		if after.Val()[0] == nil {
			t.Fatalf("%s at %d, cost %d: %+v wrote nothing", l.Algorithm, nowMs, cost, d)
		}
		// PEXPIRE and PTTL run back to back; allow a few ms between them.
		if want := max(d.ResetAfter.Milliseconds(), 1); ttl > want || ttl < want-slackMs {
			t.Fatalf("%s at %d, cost %d: %+v wrote TTL %d ms, want %d", l.Algorithm, nowMs, cost, d, ttl, want)
		}
		return d
	}
}

// restore sets key back to the state value (a string), without a TTL; nil
// means no key.
func (sc *scriptClient) restore(t *testing.T, key string, value any) {
	t.Helper()
	ctx := context.Background()
	err := sc.rdb.Del(ctx, key).Err()
	if err == nil && value != nil {
		err = sc.rdb.Set(ctx, key, value, 0).Err()
	}
	if err != nil {
		t.Fatalf("restore %s: %v", key, err)
	}
}
