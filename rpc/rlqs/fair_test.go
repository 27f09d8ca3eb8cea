package rlqs

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestWaterLevelGivesTheSmallDemandsAllAndSplitsTheRest(t *testing.T) {
	// Nine ask 8, one asks 80, 100 to share: the nine get 8, the one 28.
	demands := []float64{80, 8, 8, 8, 8, 8, 8, 8, 8, 8}
	level := waterLevel(demands, 100)
	if math.Abs(level-28) > 1e-9 {
		t.Fatalf("level %v, want 28", level)
	}
	if got := handedOut(demands, level); math.Abs(got-100) > 1e-9 {
		t.Fatalf("handed out %v, want 100", got)
	}
	if l := waterLevel([]float64{10, 20}, 100); !math.IsInf(l, 1) {
		t.Fatalf("demands under the capacity: level %v, want +Inf", l)
	}
	if l := waterLevel([]float64{math.Inf(1), 10}, 100); math.Abs(l-90) > 1e-9 {
		t.Fatalf("an unknown demand takes the level: %v, want 90", l)
	}
}

// Whatever the demands, the level hands out at most the capacity, and all
// of it when they ask for more; no demand above the level gets less than
// one below it.
func TestWaterLevelNeverHandsOutMoreThanTheCapacity(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		n := 1 + r.IntN(20)
		demands := make([]float64, n)
		var sum float64
		for i := range demands {
			demands[i] = r.Float64() * 50
			sum += demands[i]
		}
		capacity := r.Float64() * 300
		level := waterLevel(demands, capacity)
		got := handedOut(demands, level)
		if got > capacity+1e-6 {
			t.Fatalf("demands %v, capacity %v: handed out %v", demands, capacity, got)
		}
		if sum > capacity && got < capacity-1e-6 {
			t.Fatalf("demands %v (sum %v), capacity %v: handed out only %v", demands, sum, capacity, got)
		}
	}
}

func TestBucketForIsTheHighestRateNotAboveTheShare(t *testing.T) {
	for _, tc := range []struct {
		rate          float64
		tokens        uint32
		fill, maxToks int64
	}{
		{28, 28, 1, 3},
		{7.9, 79, 10, 2},
		{2.5, 5, 2, 2},
		{0.1, 1, 10, 2},
		{1000, 1000, 1, 100},
	} {
		c := bucketFor(tc.rate)
		if c.tokensPerFill != tc.tokens || c.fillSeconds != tc.fill || int64(c.maxTokens) != tc.maxToks {
			t.Errorf("bucketFor(%v) = %+v, want %d per %ds, max %d", tc.rate, c, tc.tokens, tc.fill, tc.maxToks)
		}
		if c.rate() > tc.rate+1e-9 {
			t.Errorf("bucketFor(%v) refills %v a second, above the share", tc.rate, c.rate())
		}
	}
	if c := bucketFor(0.09); !c.none() {
		t.Errorf("below one token in 10 s: %+v, want no bucket (DENY_ALL)", c)
	}
	if c := bucketFor(math.NaN()); !c.none() {
		t.Errorf("NaN: %+v, want no bucket", c)
	}
}

func TestLevelOnGridRoundsDownByLessThanAStep(t *testing.T) {
	for _, l := range []float64{0.3, 1, 7.99, 28, 28.4, 27.6, 1e6} {
		g := levelOnGrid(l)
		if g > l || g < l/levelStep {
			t.Errorf("levelOnGrid(%v) = %v, want in (%v, %v]", l, g, l/levelStep, l)
		}
	}
	if a, b := levelOnGrid(27.9), levelOnGrid(28.3); a != b {
		t.Errorf("levels 27.9 and 28.3 round to %v and %v, want one step", a, b)
	}
	if g := levelOnGrid(math.Inf(1)); !math.IsInf(g, 1) {
		t.Errorf("+Inf rounds to %v", g)
	}
}
