package node

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/cache"
	"github.com/quotad/quotad/leases"
)

// This file is the layer of local pre-aggregation a node keeps in front of
// a remote store: the leases (lease.go, in a leases.Table), the remembered
// denials (denials.go), the coalesced store calls (refill.go), and the
// janitor that gives back what expired.

// leasing is the local layer in front of a remote store (see local). It
// embeds the node for the store, the clock, the counters and the failure
// modes. Safe for concurrent use.
type leasing struct {
	*Node
	leases  *leases.Table[leaseKey, lease]
	denials denials
	// clients is the client leases this node granted (client_leases.go).
	clients clientLeases

	stopJanitor context.CancelFunc
	janitorDone chan struct{}
	// stateWatch asks the store whether it lost its state; nil when the
	// store cannot tell (store_state.go).
	stateWatch *stateWatch
}

// newLeasing returns the layer for n and starts its janitor and, if the
// store can tell (store, before any wrapper, is an epochStore), the watch
// of the store's state.
func newLeasing(n *Node, store Store) (*leasing, error) {
	denied, err := cache.NewDenied(n.cfg.DeniedCache)
	if err != nil {
		return nil, fmt.Errorf("denied cache: %w", err)
	}
	s := &leasing{Node: n, leases: leases.NewTable[leaseKey, lease](n.cfg.Lease.MaxKeys), denials: denials{cache: denied}}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopJanitor, s.janitorDone = cancel, make(chan struct{})
	go s.janitor(ctx)
	if es, ok := store.(epochStore); ok {
		s.watchStoreState(es)
	}
	return s, nil
}

// janitor returns the unused units of expired leases and forgets idle
// keys until ctx ends.
func (n *leasing) janitor(ctx context.Context) {
	defer close(n.janitorDone)
	// At least every second, however long the hold: forgetting idle keys
	// is what makes room in a full lease table.
	t := time.NewTicker(min(n.cfg.Lease.Hold/2, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// A key that needs a lease is checked every few milliseconds
			// (its rate × horizon must reach leases.MinChecks), so one idle
			// for a few horizons has nothing worth keeping once its grant
			// has expired; its denial, if any, lives on in the denied
			// cache.
			n.sweepLeases(ctx, max(time.Second, 4*n.cfg.Lease.Horizon))
			n.sweepClientLeases(n.clock())
		}
	}
}

// remember implements local. Called with l.mu held when l is not nil, so
// that a Reset either sees the denial (and forgets it) or prevents it.
func (n *leasing) remember(k leaseKey, l *lease, lim algorithms.Limit, cost int64, d algorithms.Decision, start int64) {
	if d.RetryAfter <= 0 {
		return
	}
	n.denials.add(k, l, lim, cost, d, start)
	n.stats.denialsCached.Add(1)
	n.announceDenial(k, lim, cost, d, start)
}

// denied implements local.
func (n *leasing) denied(k leaseKey, lim algorithms.Limit, cost, now int64) (algorithms.Decision, bool) {
	return n.denials.lookup(k, nil, lim, cost, now)
}

// applyDenial implements local. It waits for the cache to apply the
// entry (microseconds), so that once the gossip counters show the denial,
// checks see it.
func (n *leasing) applyDenial(k leaseKey, lim algorithms.Limit, cost int64, d algorithms.Decision, at int64) {
	n.denials.add(k, nil, lim, cost, d, at)
	n.denials.wait()
}

// returned implements local.
func (n *leasing) returned(k leaseKey) { n.denials.forget(k, n.leases.Get(k)) }

// forgetAgain implements local.
func (n *leasing) forgetAgain(policy, key string) {
	n.denials.forget(leaseKey{policy, key}, nil)
	n.denials.wait()
}

// figures implements local.
func (n *leasing) figures() localFigures {
	return localFigures{
		unitsHeld: n.unitsHeld(), leaseKeys: n.leases.Len(), tableFull: n.leases.Full(),
		denied: n.denials.cache.Stats(),
	}
}

// drain implements local: the janitor and the state watch stop, and every
// lease's unused units go back to the store.
func (n *leasing) drain(ctx context.Context) {
	n.stopJanitor()
	<-n.janitorDone
	if w := n.stateWatch; w != nil {
		w.stop()
		<-w.done
	}
	n.releaseAll(ctx)
}

// close implements local.
func (n *leasing) close() { n.denials.cache.Close() }

// check implements local: the key's lease, then its remembered denials,
// then the store (refill.go). A charge (o.Charge) skips the remembered
// denials: it must reach the store to be counted.
func (n *leasing) check(ctx context.Context, p Policy, key string, cost int64, o CheckOptions) (Result, error) {
	k := leaseKey{p.Name, key}
	now := n.clock()
	l := n.leases.Get(k)
	if l != nil {
		l.demand.Asked.Add(max(cost, 1))
		// A coarse timestamp is enough for eviction, and skipping the write
		// keeps hits on a hot key from contending on it.
		if now-l.demand.LastUsed.Load() > int64(time.Millisecond) {
			l.demand.LastUsed.Store(now)
		}
	}
	if res, ok := n.answerLocally(k, l, p.Limit, cost, now, o.Charge); ok {
		return res, nil
	}
	if l == nil {
		// A full table gives an untracked lease: this check goes to the
		// store alone (LeaseConfig.MaxKeys).
		l = n.lease(k, now)
		l.demand.Asked.Add(max(cost, 1))
	}
	return n.refill(ctx, k, l, p, cost, o)
}

// answerLocally answers a check of cost of k under lim without the store:
// from l's grant (l may be nil: an untracked key), or from a remembered
// denial. A grant's units were counted at the store when it was taken, so
// spending them counts a charge. A remembered denial would hide a charge
// from the store, so it answers one only when the charge cannot matter: a
// fixed window denied with nothing remaining is spent until its end, when
// its count starts over, so a charge could only add to a count that no
// later check reads (envoyproxy/ratelimit's local cache answers such keys
// alike).
func (n *leasing) answerLocally(k leaseKey, l *lease, lim algorithms.Limit, cost, now int64, charge bool) (Result, bool) {
	if l != nil {
		if d, ok := n.take(l, lim, cost, now); ok {
			n.stats.leaseHits.Add(1)
			return Result{Decision: d, Source: SourceLease}, true
		}
	}
	d, ok := n.denials.lookup(k, l, lim, cost, now)
	if ok && charge && (lim.Algorithm != algorithms.FixedWindow || d.Remaining != 0) {
		return Result{}, false
	}
	if ok {
		n.stats.deniedCacheHits.Add(1)
		return Result{Decision: d, Source: SourceDeniedCache}, true
	}
	return Result{}, false
}

// sweepLeases returns the unused units of expired grants and forgets keys
// idle for idleAfter whose grant, if any, has expired. It runs on the
// node's janitor.
func (n *leasing) sweepLeases(ctx context.Context, idleAfter time.Duration) {
	n.giveBack(ctx, true, func(l *lease, now int64) bool {
		if g := l.cur.Load(); g != nil && now < g.ExpiresAt {
			return false
		}
		return now-l.demand.LastUsed.Load() > int64(idleAfter)
	})
}

// releaseAll returns every lease's unused units and forgets every lease;
// used on shutdown.
func (n *leasing) releaseAll(ctx context.Context) {
	n.giveBack(ctx, false, func(*lease, int64) bool { return true })
}

// giveBack returns the unspent units of every grant (only expired ones if
// onlyExpired) and drops the leases forget picks. The releases run
// concurrently, so the store pipelines them into few round trips.
func (n *leasing) giveBack(ctx context.Context, onlyExpired bool, forget func(*lease, int64) bool) {
	type pending struct {
		k     leaseKey
		l     *lease
		g     *grant
		units int64
	}
	var toRelease, toForget []pending
	now := n.clock()
	// Collect under read locks; checks on a shard only wait for the brief
	// write lock of each removal.
	n.leases.Each(func(k leaseKey, l *lease) {
		if g, left := l.claimUnspent(now, onlyExpired); left > 0 {
			toRelease = append(toRelease, pending{k, l, g, left})
		}
		if forget(l, now) {
			toForget = append(toForget, pending{k: k, l: l})
		}
	})
	for _, p := range toForget {
		// Checked again under the write lock: a check may have used the key
		// since. A lease in the middle of a refill stays; the next sweep sees
		// it.
		n.leases.RemoveIf(p.k, p.l, func(l *lease) bool { return forget(l, now) && !l.busy() })
	}
	var wg sync.WaitGroup
	for _, p := range toRelease {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = n.returnUnits(ctx, p.k, p.l, p.g, p.units) // logged
		}()
	}
	wg.Wait()
}

// unitsHeld sums the unspent units of every lease, expired ones included
// until the janitor returns them.
func (n *leasing) unitsHeld() int64 {
	var held int64
	n.leases.Each(func(_ leaseKey, l *lease) {
		if g := l.cur.Load(); g != nil {
			held += g.Unspent()
		}
	})
	return held
}

// forget implements local. Units held in the lease are not returned: the
// authority forgets them anyway.
func (n *leasing) forget(policy, key string) {
	k := leaseKey{policy, key}
	l := n.leases.Remove(k)
	if l != nil {
		l.kill()
	}
	n.forgetClientLeases(func(p, key string) bool { return p == k.policy && key == k.key })
	n.denials.forget(k, l)
}

// forgetPolicies implements local: it drops this node's leases and remembered denials of every
// key of the named policies, giving the leases' unused units back to the
// store. As with Reset, a store call in flight for such a lease installs
// nothing (it gives its grant back), and a later check starts a new lease.
func (n *leasing) forgetPolicies(ctx context.Context, names map[string]bool) {
	type pending struct {
		k leaseKey
		l *lease
	}
	var drop []pending
	n.leases.Each(func(k leaseKey, l *lease) {
		if names[k.policy] {
			drop = append(drop, pending{k, l})
		}
	})
	n.forgetClientLeases(func(policy, _ string) bool { return names[policy] })
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	now := n.clock()
	for _, d := range drop {
		n.leases.RemoveIf(d.k, d.l, func(*lease) bool { return true })
		d.l.mu.Lock()
		d.l.dead = true
		d.l.mu.Unlock()
		n.denials.forget(d.k, d.l)
		if g, units := d.l.claimUnspent(now, false); units > 0 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n.returnUnits(ctx, d.k, d.l, g, units)
			}()
		}
	}
	wg.Wait()
}
