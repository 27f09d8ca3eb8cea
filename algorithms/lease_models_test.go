package algorithms_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// Tests of the lease semantics of the Go models (docs/algorithms.md,
// "Leases"); TestDifferentialLeases holds the scripts to the same.

// leaseT0 is 15 s into a minute, so that minute windows have 45 s left.
const leaseT0 = int64(1_699_999_995_000)

// leaseLimit is 10 units per minute (capacity 10) of algorithm a.
func leaseLimit(a algorithms.Algorithm) algorithms.Limit {
	return algorithms.Limit{Algorithm: a, Limit: 10, Period: time.Minute}
}

// TestLeaseGrantSize checks for every algorithm that an Acquire grants
// g = max(cost, min(want, avail)), that remaining reflects g, that a want
// beyond what is left gets what is left, that a denial and a cost of 0
// grant nothing and write nothing, and each algorithm's UseWithin and Ref.
func TestLeaseGrantSize(t *testing.T) {
	const hold = 2000 // ms; only the sliding log uses it
	for _, a := range algorithms.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			l := leaseLimit(a)
			st := algorithms.NewState(a)
			var use time.Duration
			var ref int64
			switch a {
			case algorithms.FixedWindow, algorithms.SlidingWindowCounter:
				use, ref = 45*time.Second, leaseT0-15_000
			case algorithms.SlidingWindowLog:
				use, ref = hold*time.Millisecond, 1
			}
			steps := []struct {
				cost, want int64
				allowed    bool
				g, left    int64
			}{
				{cost: 2, want: 5, allowed: true, g: 5, left: 5},  // want fits
				{cost: 0, want: 5, allowed: true, g: 0, left: 5},  // cost 0 takes nothing
				{cost: 1, want: 1, allowed: true, g: 1, left: 4},  // a plain check
				{cost: 2, want: 1, allowed: true, g: 2, left: 2},  // want < cost means cost
				{cost: 1, want: 10, allowed: true, g: 2, left: 0}, // want > avail gets avail
				{cost: 1, want: 10, allowed: false, g: 0, left: 0},
			}
			for i, s := range steps {
				d, g := st.Acquire(l, leaseT0, s.cost, s.want, hold)
				want := algorithms.Grant{}
				if s.g > 0 {
					want = algorithms.Grant{Units: s.g, UseWithin: use, Ref: ref}
					if a == algorithms.SlidingWindowLog {
						ref++ // each entry has the next seq
					}
				}
				if d.Allowed != s.allowed || d.Remaining != s.left || g != want {
					t.Fatalf("step %d (cost %d, want %d): %+v %+v, want allowed %v, remaining %d, %+v", i, s.cost, s.want, d, g, s.allowed, s.left, want)
				}
				if c := st.Check(l, leaseT0, 0); c.Remaining != s.left {
					t.Fatalf("step %d: a later cost-0 check sees remaining %d, want %d", i, c.Remaining, s.left)
				}
			}
		})
	}
}

// TestLeaseSlidingLogHold checks that a grant's entry is recorded at the
// lease's end, now + hold, so a unit of it spent at the last moment of the
// lease stays in the window a whole period after; and that without a hold
// the log grants only the cost.
func TestLeaseSlidingLogHold(t *testing.T) {
	l := algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 3, Period: time.Second}
	st := algorithms.NewState(algorithms.SlidingWindowLog)
	d, g := st.Acquire(l, leaseT0, 1, 3, 500)
	if !d.Allowed || g != (algorithms.Grant{Units: 3, UseWithin: 500 * time.Millisecond, Ref: 1}) || d.ResetAfter != 1500*time.Millisecond {
		t.Fatalf("acquire held 500 ms: %+v %+v, want 3 granted, use within 500 ms, reset after 1500 ms", d, g)
	}
	if d := st.Check(l, leaseT0+1499, 1); d.Allowed || d.RetryAfter != time.Millisecond {
		t.Fatalf("1499 ms later: %+v, want denied, retry after 1 ms", d)
	}
	if d := st.Check(l, leaseT0+1500, 3); !d.Allowed {
		t.Fatalf("1500 ms later: %+v, want 3 allowed", d)
	}

	st = algorithms.NewState(algorithms.SlidingWindowLog)
	if d, g := st.Acquire(l, leaseT0, 1, 3, 0); !d.Allowed || g.Units != 1 || g.UseWithin != 0 || d.Remaining != 2 {
		t.Fatalf("acquire without a hold: %+v %+v, want only the cost granted", d, g)
	}
}

// TestLeaseRelease checks each algorithm's release: the windows give back
// only within the grant's window, the log only to its unexpired entry, the
// buckets and GCRA after refilling, up to full; never more than granted.
func TestLeaseRelease(t *testing.T) {
	type step struct {
		at       int64 // ms after leaseT0
		units    int64
		returned int64
		left     int64 // remaining after it
	}
	cases := []struct {
		a     algorithms.Algorithm
		steps []step
	}{
		// 10 granted at leaseT0: the window's remaining is 0.
		{algorithms.FixedWindow, []step{{0, 4, 4, 4}, {1000, 20, 6, 10}, {2000, 1, 0, 10}}},
		{algorithms.SlidingWindowCounter, []step{{0, 4, 4, 4}, {1000, 3, 3, 7}}},
		{algorithms.SlidingWindowLog, []step{{0, 4, 4, 4}}},
		// 30 s later half the capacity is back: 5 units fit before full.
		{algorithms.TokenBucket, []step{{30_000, 8, 5, 10}}},
		{algorithms.TokenBucket, []step{{30_000, 3, 3, 8}}},
		{algorithms.LeakyBucket, []step{{30_000, 8, 5, 10}}},
		{algorithms.LeakyBucket, []step{{30_000, 3, 3, 8}}},
		{algorithms.GCRA, []step{{30_000, 8, 5, 10}}},
		{algorithms.GCRA, []step{{30_000, 3, 3, 8}}},
		// Half a unit emitted (3 s): a partly emitted unit counts as given back.
		{algorithms.GCRA, []step{{3000, 10, 10, 10}}},
	}
	for i, c := range cases {
		t.Run(fmt.Sprintf("%d %s", i, c.a), func(t *testing.T) {
			l := leaseLimit(c.a)
			st := algorithms.NewState(c.a)
			_, g := st.Acquire(l, leaseT0, 1, 10, 1000)
			if g.Units != 10 {
				t.Fatalf("acquire granted %+v, want 10", g)
			}
			for j, s := range c.steps {
				if got := st.Release(l, leaseT0+s.at, s.units, g); got != s.returned {
					t.Fatalf("release %d of %d at +%d ms returned %d, want %d", j, s.units, s.at, got, s.returned)
				}
				if d := st.Check(l, leaseT0+s.at, 0); d.Remaining != s.left {
					t.Fatalf("after release %d: %+v, want remaining %d", j, d, s.left)
				}
			}
		})
	}

	// Windows: the next window has its own units; a release there returns
	// nothing and leaves its count alone.
	for _, a := range []algorithms.Algorithm{algorithms.FixedWindow, algorithms.SlidingWindowCounter} {
		l := leaseLimit(a)
		st := algorithms.NewState(a)
		_, g := st.Acquire(l, leaseT0, 1, 10, 0)
		next := leaseT0 + 45_000
		st.Check(l, next, 2)
		before := st.Check(l, next, 0)
		if got := st.Release(l, next, 10, g); got != 0 {
			t.Fatalf("%s: release in the next window returned %d, want 0", a, got)
		}
		if after := st.Check(l, next, 0); after != before {
			t.Fatalf("%s: release in the next window changed %+v to %+v", a, before, after)
		}
	}

	// Sliding log: an expired entry, an entry already released in full, and
	// a grant that names no entry give nothing back.
	l := algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 10, Period: time.Second}
	st := algorithms.NewState(algorithms.SlidingWindowLog)
	_, g := st.Acquire(l, leaseT0, 1, 5, 100)
	if got := st.Release(l, leaseT0+1100, 5, g); got != 0 {
		t.Fatalf("release of an expired entry returned %d, want 0", got)
	}
	_, g = st.Acquire(l, leaseT0+1100, 1, 5, 100)
	if got := st.Release(l, leaseT0+1100, 5, algorithms.Grant{Units: 5, Ref: g.Ref + 1}); got != 0 {
		t.Fatalf("release of a grant naming no entry returned %d, want 0", got)
	}
	if got := st.Release(l, leaseT0+1100, 5, g); got != 5 {
		t.Fatalf("release of all 5 returned %d", got)
	}
	if got := st.Release(l, leaseT0+1100, 5, g); got != 0 {
		t.Fatalf("a second release of the same grant returned %d, want 0", got)
	}
	if d := st.Check(l, leaseT0+1100, 0); d.Remaining != 10 || d.ResetAfter != 0 {
		t.Fatalf("after releasing everything: %+v, want a full quota", d)
	}
}

// TestLeaseReleaseNoLooser is the release rule as a property: for every
// algorithm, after random checks, acquiring a lease and at once (same now)
// giving back all but the cost, or all of it, must decide every later check
// exactly as a plain check of the cost, or no check at all, would have.
// The sliding log is the exception: a held grant's entry lies later, so
// there the total admitted afterwards may only be lower.
func TestLeaseReleaseNoLooser(t *testing.T) {
	for _, a := range algorithms.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			for seed := range uint64(400) {
				rng := rand.New(rand.NewPCG(seed, 5000+uint64(a)))
				l := diffLimit(rng, a)
				capacity, p := l.Capacity(), l.PeriodMillis()
				leased, plain := algorithms.NewState(a), algorithms.NewState(a)
				now := diffStartMs + rng.Int64N(86_400_000)
				var last algorithms.Decision
				for range rng.IntN(20) {
					now += diffJump(rng, p, now, last)
					cost := diffCost(rng, capacity)
					last = leased.Check(l, now, cost)
					plain.Check(l, now, cost)
				}

				now += diffJump(rng, p, now, last)
				cost := diffCost(rng, capacity)
				want := cost + rng.Int64N(capacity-cost+1)
				hold := rng.Int64N(2 * p)
				all := rng.IntN(2) == 0
				_, g := leased.Acquire(l, now, cost, want, hold)
				units := g.Units - cost
				if all {
					units = g.Units
				} else {
					plain.Check(l, now, cost)
				}
				if got := leased.Release(l, now, units, g); g.Units > 0 && got != units {
					t.Fatalf("seed %d, %+v: released %d of %+v at once, returned %d", seed, l, units, g, got)
				}
				where := fmt.Sprintf("seed %d, %+v, now %d: acquired %+v (cost %d, want %d, hold %d), released %d", seed, l, now, g, cost, want, hold, units)

				exact := a != algorithms.SlidingWindowLog || all || hold == 0
				var admittedLeased, admittedPlain int64
				for i := range 40 {
					now += diffJump(rng, p, now, last)
					cost := diffCost(rng, capacity)
					x, y := leased.Check(l, now, cost), plain.Check(l, now, cost)
					if exact && x != y {
						t.Fatalf("%s: check %d (now %d, cost %d) decides %+v, without the lease %+v", where, i, now, cost, x, y)
					}
					if x.Allowed {
						admittedLeased += cost
					}
					if y.Allowed {
						admittedPlain += cost
					}
					last = y
				}
				if admittedLeased > admittedPlain {
					t.Fatalf("%s: admitted %d afterwards, %d without the lease", where, admittedLeased, admittedPlain)
				}
			}
		})
	}
}
