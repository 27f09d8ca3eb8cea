package rlqs

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quotad/quotad/node"
)

// This file is what a member keeps of one limit (a policy and a bucket
// id's counter key): its Envoys' buckets, the demand it published last
// round, and what it may still hand to buckets that arrive mid-round.

// limitID names a limit: a policy and the key a bucket id counts under.
type limitID struct {
	policy, key string
}

// limit is one limit's state on this member; the service's mutex guards
// it.
type limit struct {
	id     limitID
	domain string
	policy node.Policy
	// rate is the policy's rate, in units a second.
	rate    float64
	buckets map[*bucket]struct{}
	// published are the buckets of the demand vector published last
	// round, with the demands published, in the vector's order: what
	// every member divides this round.
	published       []*bucket
	publishedDemand []float64
	// next is the vector being published this round.
	next       []*bucket
	nextDemand []float64
	// spare is what this member may still hand to buckets that arrive
	// before the next round, in units a second.
	spare float64
	// used is what the limit's buckets reported allowed since the last
	// round's charge, in units.
	used uint64
	// debt is what the last charge found the key owing below empty, in
	// units, beyond a reporting interval of the rate; the next round
	// divides that much less.
	debt float64
	// reportSeconds is the longest time_elapsed a periodic report of the
	// limit's buckets counted, in whole seconds.
	reportSeconds int64
	// Figures of the last round, for metrics and /status.
	level    float64
	assigned float64
	members  int
	inDebt   bool
}

func newLimit(id limitID, domain string, p node.Policy) *limit {
	a, b := p.Limit.Rate()
	return &limit{id: id, domain: domain, policy: p, rate: float64(a) * 1000 / float64(b), buckets: map[*bucket]struct{}{}, level: math.Inf(1)}
}

// snapshot fixes the vector this member publishes this round: its
// buckets, in name order, with their demands.
func (l *limit) snapshot() string {
	l.next = l.next[:0]
	for b := range l.buckets {
		l.next = append(l.next, b)
	}
	slices.SortFunc(l.next, func(a, b *bucket) int { return strings.Compare(a.name, b.name) })
	l.nextDemand = l.nextDemand[:0]
	parts := make([]string, len(l.next))
	for i, b := range l.next {
		l.nextDemand = append(l.nextDemand, b.demand)
		parts[i] = strconv.FormatFloat(b.demand, 'g', 8, 64)
	}
	return strings.Join(parts, ",")
}

// promote makes the vector published this round the one divided next
// round.
func (l *limit) promote() {
	l.published = append(l.published[:0], l.next...)
	l.publishedDemand = append(l.publishedDemand[:0], l.nextDemand...)
}

// parseVector reads a published vector; malformed entries (a newer
// member's format) count as unknown demand, which takes the level.
func parseVector(v string) []float64 {
	if v == "" {
		return nil
	}
	parts := strings.Split(v, ",")
	out := make([]float64, len(parts))
	for i, p := range parts {
		d, err := strconv.ParseFloat(p, 64)
		if err != nil || d < 0 || math.IsNaN(d) {
			d = math.Inf(1)
		}
		out[i] = d
	}
	return out
}

// ttlFor is an assignment's time to live for a round of length t, until
// the round after next starts at the latest: whole seconds, one more
// than t, so that the next round renews it before it lapses.
func ttlFor(t time.Duration) time.Duration {
	return t.Truncate(time.Second) + time.Second
}
