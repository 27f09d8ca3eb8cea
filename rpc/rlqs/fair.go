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
