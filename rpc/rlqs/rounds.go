package rlqs

import (
	"context"
	"math"
	"time"

	"github.com/quotad/quotad/node"
)

// This file is the rounds: at each multiple of AssignmentInterval since
// the Unix epoch, every member publishes its buckets' demand for each
// limit, divides the limit by what all members published the round
// before, charges what it assigns at the authority, and renews every
// bucket's assignment.

// hysteresis is how far a bucket's share may move before its token
// bucket is replaced: within it the Envoy keeps the bucket it has (and
// no new burst), as long as the member's buckets together stay within
// the member's share.
const hysteresis = 0.10

// exchangeTimeout bounds one limit's share exchange and charge.
const exchangeTimeout = 2 * time.Second

// roundStart is the start of the round t is in.
func roundStart(t time.Time, interval time.Duration) time.Time {
	return t.Truncate(interval)
}

// Run runs the rounds until ctx is done. Run it once per Service.
func (s *Service) Run(ctx context.Context) {
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
				b.demand = float64(b.requests) / float64(b.seconds)
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
// charge, the assignments.
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
	if err != nil {
		// Without the others' demand nothing is assigned: the buckets'
		// assignments lapse into the Envoys' expired_assignment_behavior
		// or no_assignment_behavior when their time to live ends.
		l.promote()
		s.stats.exchangeFailures++
		s.mu.Unlock()
		s.log.WarnContext(ctx, "rlqs: share exchange failed; assignments of the limit are not renewed this round", "policy", l.policy.Name, "key", l.id.key, "err", err)
		return
	}
	var all []float64
	for _, v := range vectors {
		all = append(all, parseVector(v)...)
	}
	level := waterLevel(all, l.rate)
	_, inSet := vectors[s.member]
	spare := 0.0
	if inSet && len(vectors) > 0 {
		spare = max(l.rate-handedOut(all, level), 0) / float64(len(vectors))
	}
	// Shares: min(demand, level) for the buckets divided this round;
	// buckets that arrived since share this member's spare.
	share := map[*bucket]float64{}
	var fresh []*bucket
	for i, b := range l.published {
		if !b.gone {
			share[b] = min(l.publishedDemand[i], level)
		}
	}
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
	configs := s.keepOrReplace(share)
	var rate, cost float64
	for b, c := range configs {
		rate += c.rate()
		if c != b.assigned && !c.none() {
			cost += float64(c.maxTokens)
		}
	}
	cost += rate*t.Seconds() + l.owed
	l.owed = 0
	l.level, l.members = level, len(vectors)
	l.promote()
	p := l.policy
	s.mu.Unlock()

	denied, wait := s.charge(cctx, p, l.id.key, l.rate, cost)

	s.mu.Lock()
	defer s.mu.Unlock()
	l.inDebt = denied
	l.assigned = 0
	for b, c := range configs {
		if b.gone {
			continue
		}
		bttl := ttl
		if denied {
			c = bucketConfig{}
			bttl = max(ttl, wait.Truncate(time.Second)+time.Second)
		}
		b.assigned = c
		l.assigned += c.rate()
		b.stream.push(b.assignment(c.strategy(), bttl))
	}
	if denied {
		l.spare = 0
	}
}

// keepOrReplace chooses each bucket's token bucket for its share: the
// bucket it has when the share moved less than hysteresis above it, or
// below it while the buckets of the limit on this member stay within
// their shares in all; else the bucket of the share. The caller holds
// s.mu.
func (s *Service) keepOrReplace(share map[*bucket]float64) map[*bucket]bucketConfig {
	out := make(map[*bucket]bucketConfig, len(share))
	var total, chosen float64
	var lower []*bucket
	for b, want := range share {
		total += want
		have := b.assigned.rate()
		switch {
		case !b.assigned.none() && have <= want && want <= have*(1+hysteresis):
			out[b] = b.assigned
		default:
			out[b] = bucketFor(want)
			if !b.assigned.none() && have > want && have <= want*(1+hysteresis) {
				lower = append(lower, b)
			}
		}
		chosen += out[b].rate()
	}
	slack := total - chosen
	for _, b := range lower {
		if more := b.assigned.rate() - out[b].rate(); more <= slack {
			slack -= more
			out[b] = b.assigned
		}
	}
	return out
}

// charge counts cost units (rounded up) at the authority, into debt if
// they do not fit, and reports whether the limit was in debt before
// them, and how long until that debt is paid. Each round charges the
// round ahead, so a key is below empty after a charge as a matter of
// course; it was in debt before only when earlier rounds (or other
// checks of the key) took more than the refill paid back.
func (s *Service) charge(ctx context.Context, p node.Policy, key string, rate, cost float64) (bool, time.Duration) {
	units := int64(math.Ceil(cost - 1e-9))
	if units <= 0 {
		return false, 0
	}
	units = min(units, p.Limit.MaxCharge())
	res, err := s.node.CheckWith(ctx, p, key, units, node.CheckOptions{Charge: true})
	s.mu.Lock()
	s.stats.charges++
	s.mu.Unlock()
	if err != nil {
		s.log.WarnContext(ctx, "rlqs: charge failed; the round's assignments stand", "policy", p.Name, "key", key, "err", err)
		return false, 0
	}
	if res.Allowed {
		return false, 0
	}
	// ResetAfter is the wait until the key is whole again: what it owes
	// after the charge is ResetAfter × rate − capacity, and before the
	// charge that less the units. A unit of slack covers the
	// milliseconds ResetAfter is rounded to.
	owedBefore := res.ResetAfter.Seconds()*rate - float64(p.Limit.Capacity()) - float64(units)
	if owedBefore <= 1 {
		return false, 0
	}
	return true, time.Duration(owedBefore / rate * float64(time.Second))
}
