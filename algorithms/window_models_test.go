package algorithms

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

// WindowExample is a worked example of one window algorithm: checks at given
// times and the exact decisions docs/algorithms.md prescribes for them. It is
// exported (to tests only) so that differential_test.go replays the same
// examples through the Lua scripts on a real Redis.
type WindowExample struct {
	Name  string
	Limit Limit
	Steps []ExampleStep
}

// ExampleStep is one check of a WindowExample: at NowMs (ms since the Unix
// epoch), spend Cost units, expecting Want.
type ExampleStep struct {
	NowMs, Cost int64
	Want        Decision
}

// exampleT0 is a multiple of one minute (and so of one second): aligned
// windows of those lengths start there.
const exampleT0 = int64(1_700_000_040_000)

func windowAllowed(limit, remaining, resetMs int64) Decision {
	return Decision{Allowed: true, Limit: limit, Remaining: remaining, ResetAfter: time.Duration(resetMs) * time.Millisecond}
}

func windowDenied(limit, remaining, resetMs, retryMs int64) Decision {
	return Decision{Limit: limit, Remaining: remaining, ResetAfter: time.Duration(resetMs) * time.Millisecond, RetryAfter: time.Duration(retryMs) * time.Millisecond}
}

// repeat returns n checks of cost 1 at nowMs that are all allowed, the
// remaining count going down from startRemaining.
func windowRepeat(n int, limit, nowMs, startRemaining, resetMs int64) []ExampleStep {
	steps := make([]ExampleStep, n)
	for i := range steps {
		steps[i] = ExampleStep{nowMs, 1, windowAllowed(limit, startRemaining-int64(i), resetMs)}
	}
	return steps
}

// WindowExamples are the seeds' worked examples and the edges of
// docs/algorithms.md's window rules. Every decision here was worked out by
// hand from the document, not recorded from the code.
var WindowExamples = func() []WindowExample {
	t0 := exampleT0
	fw5 := Limit{Algorithm: FixedWindow, Limit: 5, Period: time.Minute}
	sl5 := Limit{Algorithm: SlidingWindowLog, Limit: 5, Period: time.Minute}
	sc100 := Limit{Algorithm: SlidingWindowCounter, Limit: 100, Period: time.Minute}
	sc10 := Limit{Algorithm: SlidingWindowCounter, Limit: 10, Period: time.Second}
	return []WindowExample{
		{
			Name:  "fixed window 5/min: the sixth waits for the next window",
			Limit: fw5,
			Steps: slices.Concat(windowRepeat(5, 5, t0+1000, 4, 59000), []ExampleStep{
				{t0 + 1000, 1, windowDenied(5, 0, 59000, 59000)},
				{t0 + 59999, 1, windowDenied(5, 0, 1, 1)},
				{t0 + 60000, 1, windowAllowed(5, 4, 60000)},
			}),
		},
		{
			Name:  "fixed window 5/min: 5 at second 59 and 5 at second 61 all pass",
			Limit: fw5,
			Steps: slices.Concat(windowRepeat(5, 5, t0+59000, 4, 1000), windowRepeat(5, 5, t0+61000, 4, 59000), []ExampleStep{
				{t0 + 61000, 1, windowDenied(5, 0, 59000, 59000)},
			}),
		},
		{
			Name:  "fixed window: each window keeps its own count until its end, also when the clock goes back",
			Limit: fw5,
			Steps: []ExampleStep{
				{t0 + 59000, 2, windowAllowed(5, 3, 1000)},
				{t0 + 60000, 5, windowAllowed(5, 0, 60000)},
				// The first window's count ended with it (its key expired
				// when the clock reached its end).
				{t0 + 59000, 4, windowAllowed(5, 1, 1000)},
				{t0 + 59000, 2, windowDenied(5, 1, 1000, 1000)},
				// The second window is as it was.
				{t0 + 60001, 1, windowDenied(5, 0, 59999, 59999)},
				{t0 + 120000, 5, windowAllowed(5, 0, 60000)},
			},
		},
		{
			Name:  "sliding log 5/min: the sixth waits for the first to expire",
			Limit: sl5,
			Steps: slices.Concat(windowRepeat(5, 5, t0+1000, 4, 60000), []ExampleStep{
				{t0 + 1000, 1, windowDenied(5, 0, 60000, 60000)},
				{t0 + 60999, 1, windowDenied(5, 0, 1, 1)},
				{t0 + 61000, 1, windowAllowed(5, 4, 60000)},
			}),
		},
		{
			Name:  "sliding log 5/min: 5 at second 59 deny 5 at second 61",
			Limit: sl5,
			Steps: slices.Concat(windowRepeat(5, 5, t0+59000, 4, 60000), []ExampleStep{
				{t0 + 61000, 1, windowDenied(5, 0, 58000, 58000)},
				{t0 + 61000, 1, windowDenied(5, 0, 58000, 58000)},
				{t0 + 61000, 1, windowDenied(5, 0, 58000, 58000)},
				{t0 + 61000, 1, windowDenied(5, 0, 58000, 58000)},
				{t0 + 61000, 1, windowDenied(5, 0, 58000, 58000)},
				{t0 + 118999, 1, windowDenied(5, 0, 1, 1)},
				{t0 + 119000, 1, windowAllowed(5, 4, 60000)},
			}),
		},
		{
			Name:  "sliding log: costs expire with their entries",
			Limit: sl5,
			Steps: []ExampleStep{
				{t0, 2, windowAllowed(5, 3, 60000)},
				{t0 + 10000, 3, windowAllowed(5, 0, 60000)},
				// need 1: the first entry (cost 2) frees enough.
				{t0 + 20000, 0, windowDenied(5, 0, 50000, 40000)},
				// need 4: the first two entries are needed.
				{t0 + 20000, 4, windowDenied(5, 0, 50000, 50000)},
				// The first entry has expired (ts <= now - period).
				{t0 + 60000, 4, windowDenied(5, 2, 10000, 10000)},
				{t0 + 70000, 4, windowAllowed(5, 1, 60000)},
			},
		},
		{
			Name:  "sliding log: an entry made after the clock went back expires on its own time",
			Limit: sl5,
			Steps: []ExampleStep{
				{t0 + 10000, 2, windowAllowed(5, 3, 60000)},
				{t0 + 5000, 1, windowAllowed(5, 2, 65000)},
				{t0 + 65000, 0, windowAllowed(5, 3, 5000)},
				{t0 + 65000, 4, windowDenied(5, 3, 5000, 5000)},
			},
		},
		{
			// 80 in the previous window, 40 in this one, 30 s in: the
			// previous window weighs ceil(80 × 30/60) = 40, estimate 80.
			Name:  "sliding counter 100/min: the seeds' worked example",
			Limit: sc100,
			Steps: []ExampleStep{
				{t0 + 10000, 80, windowAllowed(100, 20, 110000)},
				// 15 s into the next window: ceil(80 × 45/60) = 60 + 40 = 100.
				{t0 + 75000, 40, windowAllowed(100, 0, 105000)},
				{t0 + 90000, 0, windowAllowed(100, 20, 90000)},
				{t0 + 90000, 1, windowAllowed(100, 19, 90000)},
				// 40 + 41 + 21 = 102: room 38, k = floor(38 × 60000/80) =
				// 28500, retry = 60000 - 28500 - 30000 = 1500.
				{t0 + 90000, 21, windowDenied(100, 19, 90000, 1500)},
				// ceil(80 × 28501/60000) = 39: 39 + 41 + 21 = 101.
				{t0 + 91499, 21, windowDenied(100, 20, 88501, 1)},
				// ceil(80 × 28500/60000) = 38: 38 + 41 + 21 = 100.
				{t0 + 91500, 21, windowAllowed(100, 0, 88500)},
			},
		},
		{
			Name:  "sliding counter 10/s: a full current window waits for the next one",
			Limit: sc10,
			Steps: []ExampleStep{
				{t0 + 500, 10, windowAllowed(10, 0, 1500)},
				// cost 10 needs prev' weigh 0: the window after next.
				{t0 + 600, 10, windowDenied(10, 0, 1400, 1400)},
				// k = floor(9 × 1000/10) = 900: 100 ms into the next window.
				{t0 + 600, 1, windowDenied(10, 0, 1400, 500)},
				{t0 + 1099, 1, windowDenied(10, 0, 901, 1)},
				{t0 + 1100, 1, windowAllowed(10, 0, 1900)},
			},
		},
		{
			Name:  "sliding counter: each window keeps its own count, also when the clock goes back",
			Limit: sc10,
			Steps: []ExampleStep{
				{t0 + 1500, 4, windowAllowed(10, 6, 1500)},
				// Back in window t0, which nothing was spent in.
				{t0 + 900, 7, windowAllowed(10, 3, 1100)},
				// Window t0+1000 is as it was, with window t0's 7 before it,
				// weighing ceil(7 × 500/1000) = 4: 4 + 4 + 3 > 10; room 3,
				// k = floor(3 × 1000/7) = 428.
				{t0 + 1500, 3, windowDenied(10, 2, 1500, 72)},
			},
		},
	}
}()

func TestWindowExamples(t *testing.T) {
	for _, ex := range WindowExamples {
		t.Run(ex.Name, func(t *testing.T) {
			if err := ex.Limit.Validate(); err != nil {
				t.Fatal(err)
			}
			st := NewState(ex.Limit.Algorithm)
			for i, s := range ex.Steps {
				if got := st.Check(ex.Limit, s.NowMs, s.Cost); got != s.Want {
					t.Fatalf("step %d (now t0%+d ms, cost %d):\n got  %+v\n want %+v", i, s.NowMs-exampleT0, s.Cost, got, s.Want)
				}
			}
		})
	}
}

// TestWindowModelProperties drives each window model with random limits and
// random (now, cost) sequences and checks the invariants every decision must
// keep, including that retry_after and reset_after are exact.
func TestWindowModelProperties(t *testing.T) {
	for _, a := range []Algorithm{FixedWindow, SlidingWindowLog, SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			for seed := range uint64(300) {
				rng := rand.New(rand.NewPCG(seed, uint64(a)))
				checkWindowProperties(t, rng, randomWindowLimit(rng, a), seed)
				if t.Failed() {
					return
				}
			}
		})
	}
}

func checkWindowProperties(t *testing.T, rng *rand.Rand, l Limit, seed uint64) {
	t.Helper()
	lim, p := l.Limit, l.PeriodMillis()
	st := NewState(l.Algorithm)
	now := int64(1_700_000_000_000) + rng.Int64N(p)
	var last Decision
	// admitted holds what was spent in the last period or two, oldest first,
	// to count it per aligned window and per rolling period.
	var admitted []slidingLogEntry
	for step := range 150 {
		now += windowJump(rng, p, now, last)
		cost := windowCost(rng, lim)
		where := fmt.Sprintf("seed %d, %+v, step %d, now %d, cost %d", seed, l, step, now, cost)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("%s: "+format, append([]any{where}, args...)...)
		}

		// before is the state as a cost-0 check at now leaves it: none
		// writes, but the fixed window forgets the windows ended by now,
		// as their keys expire.
		before := cloneWindowState(st)
		probe := before.Check(l, now, 0)
		d := st.Check(l, now, cost)
		last = d

		// The decision's shape.
		if d.Limit != lim || d.Remaining < 0 || d.Remaining > lim || d.ResetAfter < 0 ||
			d.ResetAfter%time.Millisecond != 0 || d.RetryAfter%time.Millisecond != 0 ||
			d.Allowed != (d.RetryAfter == 0) || d.RetryAfter < 0 {
			fail("malformed decision %+v", d)
		}
		// Remaining is the headroom: a cost fits exactly when it is no
		// more than what a cost-0 check reports, and spends that much.
		c := max(cost, 1)
		switch {
		case d.Allowed != (c <= probe.Remaining):
			fail("allowed %v but a cost-0 probe reported remaining %d", d.Allowed, probe.Remaining)
		case d.Allowed && d.Remaining != probe.Remaining-cost:
			fail("remaining %d after spending %d of %d", d.Remaining, cost, probe.Remaining)
		case !d.Allowed && (d.Remaining != probe.Remaining || d.ResetAfter != probe.ResetAfter):
			fail("denial %+v disagrees with the cost-0 probe %+v", d, probe)
		}
		// Only admitting a positive cost writes.
		if (!d.Allowed || cost == 0) && !reflect.DeepEqual(before, st) {
			fail("state changed by a check that spent nothing (%+v):\n before %+v\n after  %+v", d, before, st)
		}

		if !d.Allowed {
			// retry_after is exact: one ms earlier the cost still does
			// not fit, at retry_after it does.
			retry := d.RetryAfter.Milliseconds()
			if e := cloneWindowState(st).Check(l, now+retry-1, cost); e.Allowed {
				fail("denied with retry_after %d ms, but allowed %d ms later: %+v", retry, retry-1, e)
			}
			if e := cloneWindowState(st).Check(l, now+retry, cost); !e.Allowed {
				fail("denied with retry_after %d ms, but still denied then: %+v", retry, e)
			}
		}
		// reset_after is exact: the quota is not full one ms before it,
		// and from then on the state behaves as a fresh one.
		reset := d.ResetAfter.Milliseconds()
		if reset > 0 {
			if e := cloneWindowState(st).Check(l, now+reset-1, 0); e.Remaining == lim {
				fail("reset_after %d ms, but the quota is full %d ms later: %+v", reset, reset-1, e)
			}
		}
		old, fresh := cloneWindowState(st), NewState(l.Algorithm)
		at := now + reset
		for i := range 3 {
			at += windowJump(rng, p, at, Decision{})
			k := windowCost(rng, lim)
			if x, y := old.Check(l, at, k), fresh.Check(l, at, k); x != y {
				fail("reset_after %d ms: %d ms later (follow-up %d, cost %d) the state decides %+v, a fresh one %+v", reset, at-now, i, k, x, y)
			}
		}

		// Never more than the limit per aligned window (fixed window,
		// sliding counter) or per rolling period (sliding log).
		if d.Allowed && cost > 0 {
			admitted = append(admitted, slidingLogEntry{ts: now, cost: cost})
			for len(admitted) > 0 && admitted[0].ts <= now-2*p {
				admitted = admitted[1:]
			}
			var inWindow, inPeriod int64
			for _, e := range admitted {
				if e.ts-e.ts%p == now-now%p {
					inWindow += e.cost
				}
				if e.ts > now-p {
					inPeriod += e.cost
				}
			}
			if inWindow > lim && l.Algorithm != SlidingWindowLog {
				fail("admitted %d > %d in the window starting %d", inWindow, lim, now-now%p)
			}
			if inPeriod > lim && l.Algorithm == SlidingWindowLog {
				fail("admitted %d > %d in the period ending %d", inPeriod, lim, now)
			}
		}
	}
}

// TestWindowModelsLimitChanges checks that a state written under one limit
// and read under another (the key's limit changed) still yields well-formed
// decisions: remaining within [0, limit], retry_after set when denied and
// exact, no overflow from counts spent under a larger limit.
func TestWindowModelsLimitChanges(t *testing.T) {
	for _, a := range []Algorithm{FixedWindow, SlidingWindowLog, SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			// The largest count the algorithm allows over the shortest period,
			// then the smallest limit over the longest period.
			big := Limit{Algorithm: a, Limit: MaxExact, Period: MinPeriod}
			if a == SlidingWindowLog {
				big.Limit = MaxSlidingLogLimit
			}
			small := Limit{Algorithm: a, Limit: 1, Period: MaxPeriod}
			for seed := range uint64(300) {
				rng := rand.New(rand.NewPCG(seed, 4000+uint64(a)))
				limits := []Limit{big, small, randomWindowLimit(rng, a), randomWindowLimit(rng, a)}
				st := NewState(a)
				now := int64(1_700_000_000_000)
				for step := range 60 {
					l := limits[rng.IntN(len(limits))]
					now += windowJump(rng, l.PeriodMillis(), now, Decision{})
					cost := windowCost(rng, l.Limit)
					d := st.Check(l, now, cost)
					if d.Limit != l.Limit || d.Remaining < 0 || d.Remaining > l.Limit || d.ResetAfter < 0 ||
						d.RetryAfter < 0 || d.Allowed != (d.RetryAfter == 0) {
						t.Fatalf("seed %d, step %d, %+v, now %d, cost %d: malformed decision %+v", seed, step, l, now, cost, d)
					}
					// retry_after stays exact for the limit now in force, so a
					// cached denial never outlasts the authority's.
					if retry := d.RetryAfter.Milliseconds(); !d.Allowed {
						if e := cloneWindowState(st).Check(l, now+retry-1, cost); e.Allowed {
							t.Fatalf("seed %d, step %d, %+v, now %d, cost %d: denied with retry_after %d ms, but allowed 1 ms earlier", seed, step, l, now, cost, retry)
						}
						if e := cloneWindowState(st).Check(l, now+retry, cost); !e.Allowed {
							t.Fatalf("seed %d, step %d, %+v, now %d, cost %d: denied with retry_after %d ms, but still denied then: %+v", seed, step, l, now, cost, retry, e)
						}
					}
				}
			}
		})
	}
}

// randomWindowLimit returns a valid limit of algorithm a: mostly small
// limits (where edges are hit often), periods from 1 ms to hours.
func randomWindowLimit(rng *rand.Rand, a Algorithm) Limit {
	for {
		var lim int64
		switch r := rng.IntN(10); {
		case r < 6:
			lim = 1 + rng.Int64N(20)
		case r < 9:
			lim = 21 + rng.Int64N(1000)
		default:
			lim = 1 + rng.Int64N(MaxSlidingLogLimit)
		}
		var p int64
		switch r := rng.IntN(10); {
		case r < 3:
			p = 1 + rng.Int64N(10)
		case r < 6:
			p = 1 + rng.Int64N(2000)
		case r < 8:
			p = []int64{1000, 60_000, 3_600_000}[rng.IntN(3)]
		default:
			p = 1 + rng.Int64N(600_000)
		}
		l := Limit{Algorithm: a, Limit: lim, Period: time.Duration(p) * time.Millisecond}
		if l.Validate() == nil {
			return l
		}
	}
}

// windowCost returns a cost from 0 to lim, favouring 0, 1 and lim.
func windowCost(rng *rand.Rand, lim int64) int64 {
	switch r := rng.IntN(10); {
	case r < 1:
		return 0
	case r < 4:
		return 1
	case r < 5:
		return lim
	case r < 7:
		return 1 + rng.Int64N(min(lim, 5))
	default:
		return rng.Int64N(lim + 1)
	}
}

// windowJump returns how far to advance the clock: often not at all, often
// onto the edges (a window boundary, the last decision's retry_after or
// reset_after, or one ms before them), sometimes by more than two periods.
func windowJump(rng *rand.Rand, p, now int64, last Decision) int64 {
	switch r := rng.IntN(20); {
	case r < 6:
		return 0
	case r < 10:
		return 1 + rng.Int64N(max(1, p/10))
	case r < 12:
		return rng.Int64N(p + 1)
	case r < 14:
		return max(0, p-now%p+rng.Int64N(3)-1)
	case r < 16:
		return max(0, last.RetryAfter.Milliseconds()-rng.Int64N(2))
	case r < 17:
		return max(0, last.ResetAfter.Milliseconds()-rng.Int64N(2))
	case r < 19:
		return p + rng.Int64N(2*p+1)
	default:
		return 2*p + 1 + rng.Int64N(10*p)
	}
}

// cloneWindowState returns an independent copy of a window state.
func cloneWindowState(s State) State {
	switch s := s.(type) {
	case *FixedWindowState:
		c := *s
		c.windows = slices.Clone(s.windows)
		return &c
	case *SlidingCounterState:
		c := *s
		c.windows = slices.Clone(s.windows)
		return &c
	case *SlidingLogState:
		c := *s
		c.entries = slices.Clone(s.entries)
		return &c
	}
	panic(fmt.Sprintf("cloneWindowState: %T is not a window state", s))
}
