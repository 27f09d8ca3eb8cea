package rlqs

import (
	"cmp"
	"context"
	"math"
	"slices"
	"time"

	"github.com/quotad/quotad/node"
)

// This file is the rounds: at each multiple of AssignmentInterval since
// the Unix epoch, every member publishes its buckets' demand for each
// limit, divides the limit by what all members published the round
// before, charges what it assigns at the authority, and renews every
// bucket's assignment.

// hysteresis is how far a bucket's share may move, as a fraction of it,
// before its token bucket is replaced: within it the Envoy keeps the
// bucket it has (and gets no new burst), as long as the member's buckets
// together stay within their shares.
const hysteresis = 0.10

// demandWeight is the weight of a round's usage in a bucket's demand,
// an exponentially weighted mean over rounds: a report counts whole
// requests over whole seconds, so one round's count of a steady rate
// jumps by a request either way.
const demandWeight = 0.5

// exchangeTimeout bounds one limit's share exchange and charge.
const exchangeTimeout = 2 * time.Second

// roundStart is the start of the round t is in.
func roundStart(t time.Time, interval time.Duration) time.Time {
	return t.Truncate(interval)
}

// Run runs the rounds until ctx is done, then ends every stream. Run it
// once per Service.
func (s *Service) Run(ctx context.Context) {
	defer close(s.stopped)
	defer func() { _ = s.unregister() }()
	t := s.cfg.AssignmentInterval
	for {
		next := roundStart(s.now(), t).Add(t)
		timer := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		s.round(ctx, next.Unix()/int64(t/time.Second))
	}
}

// roundWork is one limit's part of a round, fixed under the mutex.
type roundWork struct {
	l      *limit
	vector string
}

// round runs round number r.
func (s *Service) round(ctx context.Context, r int64) {
	now := s.now()
	ttl := ttlFor(s.cfg.AssignmentInterval)
	var work []roundWork
	s.mu.Lock()
	s.stats.rounds++
	for st := range s.streams {
		for _, b := range st.buckets {
			if b.seconds > 0 {
				d := float64(b.requests) / float64(b.seconds)
				if math.IsInf(b.demand, 1) {
					b.demand = d
				} else {
					b.demand = demandWeight*d + (1-demandWeight)*b.demand
				}
				b.requests, b.seconds = 0, 0
			}
			if !b.idleSince.IsZero() && now.Sub(b.idleSince) >= s.cfg.AbandonAfter {
				st.push(b.abandonment())
				s.remove(b)
				s.stats.abandoned++
				continue
			}
			if !b.to.limited {
				st.push(b.assignment(blanket(b.to.allow), ttl))
			}
		}
	}
	for id, l := range s.limits {
		if len(l.buckets) == 0 && len(l.published) == 0 {
			delete(s.limits, id)
			continue
		}
		work = append(work, roundWork{l: l, vector: l.snapshot()})
	}
	s.mu.Unlock()
	for _, w := range work {
		s.divide(ctx, r, w, ttl)
	}
}

// divide runs a round for one limit: the exchange, the division, the
// assignments, then the charge of what the limit's buckets reported
// allowed since the last round.
func (s *Service) divide(ctx context.Context, r int64, w roundWork, ttl time.Duration) {
	l := w.l
	t := s.cfg.AssignmentInterval
	cctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	defer cancel()
	// The record must outlive the next round's reads: two rounds and a
	// second.
	vectors, err := s.node.ShareDemand(cctx, l.policy, l.id.key, s.member, r, w.vector, 2*t+time.Second)
	s.mu.Lock()
	s.stats.exchanges++
	used := l.used
	l.used = 0
	if err != nil {
		// Without the others' demand nothing is assigned: the buckets'
		// assignments lapse into the Envoys' expired_assignment_behavior
		// or no_assignment_behavior when their time to live ends.
		l.promote()
		s.stats.exchangeFailures++
		s.mu.Unlock()
		s.log.WarnContext(ctx, "rlqs: share exchange failed; assignments of the limit are not renewed this round", "policy", l.policy.Name, "key", l.id.key, "err", err)
		s.charge(cctx, l, used)
		return
	}
	var all []float64
	for _, v := range vectors {
		all = append(all, parseVector(v)...)
	}
	// A debt the last charge found is paid back over this round: the
	// members divide that much less. Each member may see a different
	// debt; each dividing less than the others never adds up to more
	// than the rate.
	capacity := max(l.rate-l.debt/t.Seconds(), 0)
	level := levelOnGrid(waterLevel(all, capacity))
	_, inSet := vectors[s.member]
	spare := 0.0
	if inSet && len(vectors) > 0 {
		spare = max(capacity-handedOut(all, level), 0) / float64(len(vectors))
	}
	// Shares: min(demand, level) for the buckets divided this round;
	// buckets that arrived since share this member's spare.
	share := map[*bucket]float64{}
	for i, b := range l.published {
		if !b.gone {
			share[b] = min(l.publishedDemand[i], level)
		}
	}
	var fresh []*bucket
	for b := range l.buckets {
		if _, ok := share[b]; !ok {
			fresh = append(fresh, b)
		}
	}
	if len(fresh) > 0 {
		each := spare / float64(len(fresh)+1)
		for _, b := range fresh {
			share[b] = each
		}
		spare -= each * float64(len(fresh))
	}
	l.spare = spare
	l.level, l.members = level, len(vectors)
	l.assigned = 0
	for b, c := range s.keepOrReplace(share) {
		b.assigned = c
		l.assigned += c.rate()
		b.stream.push(b.assignment(c.strategy(), ttl))
	}
	l.promote()
	s.mu.Unlock()
	s.charge(cctx, l, used)
}

// keepOrReplace chooses each bucket's token bucket for its share: the
// bucket the Envoy holds when the share moved by at most hysteresis of
// it either way, else the bucket of the share; buckets kept above their
// shares are replaced, the furthest above first, until the member's
// buckets together hold at most their shares in all. The caller holds
// s.mu.
func (s *Service) keepOrReplace(share map[*bucket]float64) map[*bucket]bucketConfig {
	out := make(map[*bucket]bucketConfig, len(share))
	var room float64
	var above []*bucket
	for b, want := range share {
		room += want
		have := b.assigned.rate()
		if !b.assigned.none() && math.Abs(have-want) <= hysteresis*want {
			out[b] = b.assigned
			if have > want {
				above = append(above, b)
			}
		} else {
			out[b] = bucketFor(want)
		}
		room -= out[b].rate()
	}
	slices.SortFunc(above, func(a, b *bucket) int {
		return cmp.Compare(b.assigned.rate()-share[b], a.assigned.rate()-share[a])
	})
	for _, b := range above {
		if room >= -1e-9 {
			break
		}
		c := bucketFor(share[b])
		room += out[b].rate() - c.rate()
		out[b] = c
	}
	return out
}

// charge counts used units, what the limit's buckets on this member
// reported allowed, at the authority, into debt when they do not fit, and
// keeps in l.debt what the key owes beyond empty after them: the units
// the Envoys admitted beyond the limit (their buckets' bursts, above all),
// which the next round's division pays back.
func (s *Service) charge(ctx context.Context, l *limit, used uint64) {
	p := l.policy
	units := int64(min(used, uint64(p.Limit.MaxCharge())))
	debt := 0.0
	if units > 0 {
		res, err := s.node.CheckWith(ctx, p, l.id.key, units, node.CheckOptions{Charge: true})
		if err != nil {
			s.log.WarnContext(ctx, "rlqs: charge failed; the units are not counted", "policy", p.Name, "key", l.id.key, "err", err)
		} else if !res.Allowed {
			// ResetAfter is the wait until the key is whole again, so it
			// owes ResetAfter × rate − capacity below empty. A unit of
			// slack covers the milliseconds ResetAfter is rounded to.
			debt = max(res.ResetAfter.Seconds()*l.rate-float64(p.Limit.Capacity())-1, 0)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if units > 0 {
		s.stats.charges++
	}
	// A report's usage is charged in the round it arrives in, so one round
	// may charge a reporting interval's worth more than it refilled, and
	// the next that much less: only a debt beyond that is the Envoys'.
	debt = max(debt-l.rate*float64(l.reportSeconds), 0)
	l.debt = debt
	l.inDebt = debt > 0
}
