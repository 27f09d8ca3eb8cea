package rlqs

import (
	"math"
	"slices"
)

// waterLevel is the max-min fair level of capacity over demands: the
// level L at which giving each demand min(demand, L) hands out exactly
// capacity, so that no demand gets less than another unless it asked for
// less. It is +Inf when the demands add up to at most capacity (each gets
// all it asks). A demand of +Inf is unknown: it takes the level. Pure.
func waterLevel(demands []float64, capacity float64) float64 {
	sorted := slices.Clone(demands)
	slices.Sort(sorted)
	left := max(capacity, 0)
	for i, d := range sorted {
		share := left / float64(len(sorted)-i)
		if d >= share {
			return share
		}
		left -= d
	}
	return math.Inf(1)
}

// handedOut is what the level gives demands in all: the sum of
// min(demand, level).
func handedOut(demands []float64, level float64) float64 {
	var sum float64
	for _, d := range demands {
		sum += min(d, level)
	}
	return sum
}

// levelStep is the ratio between the levels levelOnGrid rounds to.
const levelStep = 1.05

// levelOnGrid rounds a finite level down to a power of levelStep, so
// that a level that jitters from round to round (as demands measured in
// whole requests do) gives the buckets it caps the same share, and Envoy
// keeps their token buckets. Every member rounds the same level the same
// way, and a lower level hands out less, so the shares still add up to at
// most the capacity; what the rounding keeps back (less than 5 % of the
// capped shares) goes to new buckets. +Inf and 0 stay as they are. Pure.
func levelOnGrid(level float64) float64 {
	if math.IsInf(level, 1) || !(level > 0) {
		return level
	}
	return math.Pow(levelStep, math.Floor(math.Log(level)/math.Log(levelStep)+1e-9))
}
