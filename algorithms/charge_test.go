package algorithms_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotad/quotad/algorithms"
)

// chargeExampleStep is one step of a worked charge example: at +atMs from the
// example's start (a multiple of 10 s), a check of cost that is a charge
// or not, and the decision docs/algorithms.md ("Counting checks") prescribes.
type chargeExampleStep struct {
	atMs, cost int64
	charge     bool
	want       algorithms.Decision
}

func chargeAllowed(remaining, resetMs int64) algorithms.Decision {
	return algorithms.Decision{Allowed: true, Limit: 10, Remaining: remaining, ResetAfter: time.Duration(resetMs) * time.Millisecond}
}

func chargeDenied(resetMs, retryMs int64) algorithms.Decision {
	return algorithms.Decision{Limit: 10, ResetAfter: time.Duration(resetMs) * time.Millisecond, RetryAfter: time.Duration(retryMs) * time.Millisecond}
}

// chargeExamples are envoyproxy/ratelimit's sequence, a hit of 27 then one
// of 3 against a limit of 10, under every rate algorithm (10 per 10 s,
// capacity 10): the 27 is denied and counted, so the 3 is denied too, and
// waits for the debt. Worked out by hand from docs/algorithms.md.
var chargeExamples = map[algorithms.Algorithm][]chargeExampleStep{
	// used 27 until the window ends at 10 s; the next one is empty.
	algorithms.FixedWindow: {
		{0, 27, true, chargeDenied(10_000, 10_000)},
		{5_000, 3, false, chargeDenied(5_000, 5_000)},
		{10_000, 3, false, chargeAllowed(7, 10_000)},
	},
	// One entry (0, 27); it expires at 10 s, freeing all 27.
	algorithms.SlidingWindowLog: {
		{0, 27, true, chargeDenied(10_000, 10_000)},
		// The charge of 3 joins the entry, moved to 5 s: 30 until 15 s.
		{5_000, 3, true, chargeDenied(10_000, 10_000)},
		{14_999, 1, false, chargeDenied(1, 1)},
		{15_000, 3, false, chargeAllowed(7, 10_000)},
	},
	// cur 27 in window [0, 10 s). At 10 s prev = 27: the cost 3 fits once
	// ceil(27 × (10,000 - e) / 10,000) ≤ 7, e ≥ 10,000 - floor(7 × 10,000
	// / 27) = 7,408.
	algorithms.SlidingWindowCounter: {
		{0, 27, true, chargeDenied(20_000, 20_000)},
		{0, 3, false, chargeDenied(20_000, 17_408)},
		// ceil(27 × 2,593 / 10,000) = 8: 2 remain, not 3.
		{17_407, 3, false, algorithms.Decision{Limit: 10, Remaining: 2, ResetAfter: 2_593 * time.Millisecond, RetryAfter: time.Millisecond}},
		{17_408, 3, false, chargeAllowed(0, 12_592)},
	},
	// tokens 10 - 27 = -17; one per second: full after 27 s, 3 after 20 s.
	algorithms.TokenBucket: {
		{0, 27, true, chargeDenied(27_000, 27_000)},
		{0, 3, false, chargeDenied(27_000, 20_000)},
		{20_000, 3, false, chargeAllowed(0, 10_000)},
	},
	// level 27, draining one per second: empty after 27 s, room for 3
	// after 20 s.
	algorithms.LeakyBucket: {
		{0, 27, true, chargeDenied(27_000, 27_000)},
		{0, 3, false, chargeDenied(27_000, 20_000)},
		{20_000, 3, false, chargeAllowed(0, 10_000)},
	},
	// tat pushed 27 intervals (27 s) ahead; 3 more fit once it is 7 ahead.
	algorithms.GCRA: {
		{0, 27, true, chargeDenied(27_000, 27_000)},
		{0, 3, false, chargeDenied(27_000, 20_000)},
		{20_000, 3, false, chargeAllowed(0, 10_000)},
	},
}

// TestChargeExamples checks the worked examples of charges through
// each algorithm's Go model and its Lua script on a real redis-server: a
// cost that does not fit is recorded as a debt that denies later checks
// until the window or refill pays it back, with retry_after counting it.
func TestChargeExamples(t *testing.T) {
	rdb := startRedis(t)
	const t0 = int64(1_700_000_040_000) // a multiple of 10 s
	for a, ex := range chargeExamples {
		t.Run(a.String(), func(t *testing.T) {
			l := algorithms.Limit{Algorithm: a, Limit: 10, Period: 10 * time.Second}
			st := algorithms.NewState(a)
			steps := make([]diffStep, len(ex))
			want := make([]diffOutcome, len(ex))
			for i, s := range ex {
				steps[i] = diffStep{l: l, nowMs: t0 + s.atMs, cost: s.cost, want: s.cost, charge: s.charge}
				o, err := runModelStep(st, steps[i])
				if err != nil {
					t.Fatal(err)
				}
				if o.decision != s.want {
					t.Fatalf("step %d (%s): the model decides %+v, the example %+v", i, steps[i], o.decision, s.want)
				}
				want[i] = o
			}
			for _, expire := range []bool{false, true} {
				compareOnRedis(t, rdb, fmt.Sprintf("expire %v", expire), fmt.Sprintf("{test:charge-example:%s:%v}", a, expire), steps, want, expire)
			}
		})
	}
}

// TestChargeSaturatesAtMaxCharge checks that a key charged beyond
// MaxCharge owes exactly MaxCharge: a charge of MaxCharge after a charge
// of 1 leaves the same state as one of MaxCharge alone, in the Go model.
// (TestDifferentialCharges compares the scripts with the model there.)
func TestChargeSaturatesAtMaxCharge(t *testing.T) {
	const now = int64(1_700_000_040_000)
	for _, a := range algorithms.Algorithms() {
		l := algorithms.Limit{Algorithm: a, Limit: 7, Period: 3 * time.Second}
		most := l.MaxCharge()
		if most < l.Capacity() {
			t.Fatalf("%s: MaxCharge %d is below the capacity %d", a, most, l.Capacity())
		}
		once, twice := algorithms.NewState(a), algorithms.NewState(a)
		twice.Charge(l, now, 8, 8, 0)
		d1, _ := once.Charge(l, now, most, most, 0)
		d2, _ := twice.Charge(l, now, most, most, 0)
		if d1 != d2 || d1.Allowed || d1.Remaining != 0 {
			t.Errorf("%s: a charge of MaxCharge (%d) gives %+v; after a charge of 8 first, %+v; want the same denial", a, most, d1, d2)
		}
		later1, later2 := once.Check(l, now, 1), twice.Check(l, now, 1)
		if later1 != later2 {
			t.Errorf("%s: a key charged to saturation reads %+v, or %+v when charged more; want the same", a, later1, later2)
		}
	}
}

// TestChargeValidation checks which costs a charge may take: up
// to MaxCharge, above the capacity too, and never on a concurrency limit,
// whose error says why and how to fix the check.
func TestChargeValidation(t *testing.T) {
	for _, a := range algorithms.Algorithms() {
		l := algorithms.Limit{Algorithm: a, Limit: 10, Period: time.Minute}
		if err := l.ValidateCharge(27); err != nil {
			t.Errorf("%s: a charge of 27 against capacity 10: %v, want accepted", a, err)
		}
		if err := l.ValidateCost(27); err == nil {
			t.Errorf("%s: a plain check of 27 against capacity 10 is accepted, want refused", a)
		}
		err := l.ValidateCharge(l.MaxCharge() + 1)
		if !errors.Is(err, algorithms.ErrInvalidCost) || !errors.Is(err, algorithms.ErrInvalidInput) {
			t.Errorf("%s: a charge above MaxCharge: %v, want ErrInvalidCost", a, err)
		}
		if err := l.ValidateCharge(-1); !errors.Is(err, algorithms.ErrInvalidCost) {
			t.Errorf("%s: a charge of -1: %v, want ErrInvalidCost", a, err)
		}
	}
	c := algorithms.Limit{Algorithm: algorithms.Concurrency, Limit: 10, Period: time.Minute}
	err := c.ValidateCharge(1)
	if !errors.Is(err, algorithms.ErrCannotCharge) || !errors.Is(err, algorithms.ErrInvalidInput) {
		t.Fatalf("a charge on a concurrency limit: %v, want ErrCannotCharge", err)
	}
	t.Logf("concurrency: %v", err)
}

// TestSlidingLogChargesKeepTheLogShort checks that charges do not grow the
// sliding window log on Redis: a flood of charges, each denied and
// counted, interleaved with checks that fit once older entries expire,
// never leaves more than limit + 1 members in the sorted set (a charge
// joins the newest entry rather than adding one), and every charge is
// counted: the log's sum is all the units admitted or charged that have
// not expired.
func TestSlidingLogChargesKeepTheLogShort(t *testing.T) {
	rdb := startRedis(t)
	ctx := context.Background()
	l := algorithms.Limit{Algorithm: algorithms.SlidingWindowLog, Limit: 5, Period: time.Second}
	sc := redis.NewScript(algorithms.CheckScript(l.Algorithm))
	keys := algorithms.Keys(l.Algorithm, "{test:charge-log}")
	now := int64(1_700_000_040_000)
	longest, charged := int64(0), 0
	for i := range 2000 {
		now += 7
		cost, charge := int64(1), i%4 != 0
		args := algorithms.CheckArgs(l, cost, now)
		if charge {
			args = algorithms.ChargeArgs(l, cost, cost, 0, now)
		}
		d, err := decodeRun(sc.Run(ctx, rdb, keys, args...))
		if err != nil {
			t.Fatal(err)
		}
		if charge && !d.Allowed {
			charged++
		}
		n, err := rdb.ZCard(ctx, keys[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		longest = max(longest, n)
	}
	if charged < 1000 {
		t.Fatalf("only %d charges were denied and counted; the sequence does not test the bound", charged)
	}
	if longest > l.Limit+1 {
		t.Fatalf("the log held %d entries at its longest under a limit of %d; want at most %d", longest, l.Limit, l.Limit+1)
	}
	t.Logf("%d charges counted, the log at most %d entries long", charged, longest)
}
