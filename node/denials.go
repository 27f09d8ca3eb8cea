package node

import (
	"math"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/cache"
	"github.com/quotad/quotad/leases"
)

// This file is the node's memory of the store's denials: in the key's
// lease and in the denied cache, read and cleared as one (denials).

// denial is a store denial of cost units under limit that holds until
// untilNs on the node clock.
type denial struct {
	limit            algorithms.Limit
	cost             int64
	sinceNs, untilNs int64
	decision         algorithms.Decision
}

// deniedFor returns the remembered denial if it holds for cost under lim at
// now: the same limit, and the denied cost or a larger one whose wait
// follows from the denial (algorithms.Limit.RetryAfterFor), not yet over.
// The decision's RetryAfter is this cost's own wait.
func (l *lease) deniedFor(lim algorithms.Limit, cost, now int64) (algorithms.Decision, bool) {
	dn := l.denial.Load()
	if dn == nil || dn.limit != lim {
		return algorithms.Decision{}, false
	}
	until := dn.untilNs
	if c := max(cost, 1); c != dn.cost {
		retry, ok := lim.RetryAfterFor(dn.decision, dn.cost, c)
		if !ok {
			return algorithms.Decision{}, false
		}
		until = dn.sinceNs + min(int64(retry), math.MaxInt64-dn.sinceNs)
	}
	if now >= until {
		return algorithms.Decision{}, false
	}
	return leases.Countdown(dn.decision, dn.sinceNs, until, now), true
}

// denials is what a node remembers of the store's denials, kept in two
// places and read as one: in the key's lease, where the checks see it at
// once (those that waited on the store call that brought it among them),
// and in the denied cache (package cache), which outlives idle keys and
// holds the denials of keys without a lease (a full lease table, a batch,
// another member's), but whose writes become visible asynchronously. add,
// lookup and forget go to both, so that no path updates one and not the
// other. Safe for concurrent use.
type denials struct{ cache *cache.Denied }

// add remembers the store's denial d of cost units (at least 1) of k
// under lim, asked at start (node clock). l is k's lease, or nil; the
// caller holds l.mu.
func (s denials) add(k leaseKey, l *lease, lim algorithms.Limit, cost int64, d algorithms.Decision, start int64) {
	if l != nil {
		l.denial.Store(&denial{limit: lim, cost: cost, sinceNs: start, untilNs: start + int64(d.RetryAfter), decision: d})
	}
	s.cache.Add(cacheKey(k, lim), cost, d, millis(start))
}

// lookup returns a remembered denial that holds for cost units of k under
// lim at now (node clock): l's (l may be nil), else the cache's.
func (s denials) lookup(k leaseKey, l *lease, lim algorithms.Limit, cost, now int64) (algorithms.Decision, bool) {
	if l != nil {
		if d, ok := l.deniedFor(lim, cost, now); ok {
			return d, true
		}
	}
	return s.cache.Lookup(cacheKey(k, lim), cost, millis(now))
}

// forget drops every remembered denial of k, under any limit: l's (l may
// be nil) and the cache's.
func (s denials) forget(k leaseKey, l *lease) {
	if l != nil {
		l.denial.Store(nil)
	}
	s.cache.Forget(cache.Key{Policy: k.policy, Key: k.key})
}

// forgetAll drops every denial the cache remembers; the leases' go with
// the leases.
func (s denials) forgetAll() { s.cache.ForgetAll() }

// wait returns once the cache has applied the adds and forgets made
// before it.
func (s denials) wait() { s.cache.Wait() }

// cacheKey is the denied cache's name for k under lim.
func cacheKey(k leaseKey, lim algorithms.Limit) cache.Key {
	return cache.Key{Policy: k.policy, Key: k.key, Limit: lim}
}
