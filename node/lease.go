package node

import (
	"context"
	"fmt"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/cache"
)

// LeaseMode is a policy's lease switch.
type LeaseMode int

const (
	// LeaseAuto leases when the key's demand makes it worthwhile and the
	// limit is large enough (the zero value).
	LeaseAuto LeaseMode = iota
	// LeaseOff sends every check to the store.
	LeaseOff
)

// String returns "auto" or "off".
func (m LeaseMode) String() string {
	if m == LeaseOff {
		return "off"
	}
	return "auto"
}

// ParseLeaseMode accepts "auto" or "off".
func ParseLeaseMode(s string) (LeaseMode, error) {
	switch s {
	case "auto":
		return LeaseAuto, nil
	case "off":
		return LeaseOff, nil
	}
	return 0, fmt.Errorf("lease: %w: %q (want auto or off)", ErrInvalidConfig, s)
}

// LeaseConfig sizes leases. The zero value is the default.
type LeaseConfig struct {
	// Horizon is how far ahead a lease covers the key's recent demand on
	// this node: a lease holds about rate × Horizon units. Default 200ms.
	Horizon time.Duration
	// Hold is the longest a lease is spent before its unused units go back
	// to the store; it is further capped at MaxFraction of the limit's
	// period, and fixed and sliding windows also end a lease at the
	// window's end. Default 500ms; at least Horizon.
	Hold time.Duration
	// MaxFraction caps the units all nodes hold in leases for one key at
	// this fraction of the limit's capacity; each node takes at most
	// MaxFraction × capacity / cluster size. It bounds how far leases can
	// make the cluster under-admit. Default 0.05; in (0, 1].
	MaxFraction float64
	// MaxKeys bounds the keys the node tracks for leasing: one entry per
	// key checked lately, leased or not, forgotten once idle for
	// max(1s, 4 × Horizon) with no grant in force. At the bound, checks of
	// keys not tracked go to the store one at a time, without a lease and
	// without coalescing, until idle keys make room. Default 50,000.
	MaxKeys int
}

// Bounds of LeaseConfig.
const (
	// DefaultLeaseMaxKeys is LeaseConfig.MaxKeys's default. An entry
	// costs about 2.2 KB of heap with a 1 KiB key, so a full table about
	// 110 MB; the table holds the keys checked in about the last second,
	// which is 50,000 distinct keys a second on one node.
	DefaultLeaseMaxKeys = 50_000
	// MaxLeaseHold bounds LeaseConfig.Hold. A lease's units are spent at
	// the store and idle on this node until used or given back, so a long
	// hold only under-admits longer.
	MaxLeaseHold = time.Hour
)

func (c LeaseConfig) withDefaults() LeaseConfig {
	if c.Horizon == 0 {
		c.Horizon = 200 * time.Millisecond
	}
	if c.Hold == 0 {
		c.Hold = max(500*time.Millisecond, c.Horizon)
	}
	if c.MaxFraction == 0 {
		c.MaxFraction = 0.05
	}
	if c.MaxKeys == 0 {
		c.MaxKeys = DefaultLeaseMaxKeys
	}
	return c
}

// Validate reports the first problem with c (after defaults).
func (c LeaseConfig) Validate() error {
	switch {
	case c.Horizon <= 0:
		return fmt.Errorf("lease horizon: %w: %s must be > 0", ErrInvalidConfig, c.Horizon)
	case c.Hold < c.Horizon:
		return fmt.Errorf("lease hold: %w: %s must be at least the horizon %s", ErrInvalidConfig, c.Hold, c.Horizon)
	case c.Hold > MaxLeaseHold:
		return fmt.Errorf("lease hold: %w: %s exceeds %s", ErrInvalidConfig, c.Hold, MaxLeaseHold)
	case c.MaxKeys < 0:
		return fmt.Errorf("lease max keys: %w: %d must be > 0 (0 means %d)", ErrInvalidConfig, c.MaxKeys, DefaultLeaseMaxKeys)
	case !(c.MaxFraction > 0 && c.MaxFraction <= 1):
		return fmt.Errorf("lease max fraction: %w: %g must be in (0, 1]", ErrInvalidConfig, c.MaxFraction)
	}
	return nil
}

// leaseKey names one policy's key on this node. Its fields are the
// request's own strings, so looking a key up allocates nothing. A key has
// one lease whatever its limit; a grant taken under another limit (another
// inline limit for the key, whose state is stored apart) is not spent, and
// goes back at the next lease refill or, at the latest, when it expires.
type leaseKey struct {
	policy, key string
}

// lease is one key's local state on this node: the grant it is spending,
// the demand that sizes the next one, and the last denial the store gave.
type lease struct {
	// cur is the grant being spent; nil before the first. A refill installs
	// a new one rather than refilling this one, so a unit claimed from a
	// grant is always judged by that grant's own expiry.
	cur      atomic.Pointer[grant]
	demand   atomic.Int64 // units asked for since sampleStart
	lastUsed atomic.Int64 // node clock (ns) of a recent check, for eviction

	mu sync.Mutex // guards the fields below; never held on the hit path
	// refilling is the store call in flight for the key, if any.
	refilling *fetch
	// beside counts the plain calls in flight beside refilling.
	beside      int
	sampleStart int64   // node clock (ns) when the current demand sample began
	rate        float64 // units per second, smoothed over past samples
	// dead marks a lease Reset removed from the table: a store call still
	// in flight for it must not install its grant or remember its denial.
	dead bool

	// denial is the last denial the store gave this key, so that checks
	// that waited on a coalesced store call need not repeat it (the
	// denied cache's writes become visible asynchronously).
	denial atomic.Pointer[denial]
	// quick says that the key's last store call succeeded within
	// quickCall of the call timeout: a key that cannot lease may then
	// have several calls in flight (refill).
	quick atomic.Bool
}

// A key that cannot lease may have up to maxBeside calls in flight beside
// its refill while its calls are quick: those that finish within
// 1/quickCall of the store's call timeout.
const (
	maxBeside = 64
	quickCall = 10
)

// grant is units taken from the store in one call, spent locally until
// expiresAt. Everything but units is fixed when the grant is installed.
//
// The hit path is lock-free: units are claimed with a CAS, so each leased
// unit is spent at most once, and whoever gives the rest back claims it
// all with a Swap first.
type grant struct {
	units     atomic.Int64 // unspent
	expiresAt int64        // node clock (ns) from which no unit may be spent
	// authRemaining and resetAt describe the store's state right after the
	// grant, for the honest estimate a lease hit reports.
	authRemaining int64
	resetAt       int64 // node clock (ns)
	capacity      int64
	// taken, limit and base (the store's key base of limit) are what
	// Release needs.
	taken algorithms.Grant
	limit algorithms.Limit
	base  string
}

// take spends cost units of l's current grant if it was taken under lim,
// holds them and has not expired at now (node clock); it reports the
// decision to return. cost 0 asks whether one unit is held and spends
// nothing.
func (n *Node) take(l *lease, lim algorithms.Limit, cost, now int64) (algorithms.Decision, bool) {
	g := l.cur.Load()
	if g == nil || g.limit != lim {
		return algorithms.Decision{}, false
	}
	need := max(cost, 1)
	for {
		u := g.units.Load()
		if u < need || now >= g.expiresAt {
			return algorithms.Decision{}, false
		}
		if !g.units.CompareAndSwap(u, u-cost) {
			continue
		}
		// Read the clock again after claiming: units claimed just as the
		// grant expired are dropped, not spent late (a window's units must
		// not spill into the next window). Dropping only under-admits, by at
		// most cost.
		now = n.clock()
		if now >= g.expiresAt {
			return algorithms.Decision{}, false
		}
		return algorithms.Decision{
			Allowed:    true,
			Limit:      g.capacity,
			Remaining:  min(g.capacity, g.authRemaining+u-cost),
			ResetAfter: time.Duration(max(0, g.resetAt-now)),
		}, true
	}
}

// unspent claims the current grant's unspent units so they can be given
// back, and returns the grant with them (nil, 0 when there are none). If
// onlyExpired, a grant still in force is left alone.
func (l *lease) unspent(now int64, onlyExpired bool) (*grant, int64) {
	g := l.cur.Load()
	if g == nil || (onlyExpired && now < g.expiresAt) {
		return nil, 0
	}
	return g, g.units.Swap(0)
}

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
	d := dn.decision
	// Whole milliseconds, rounded up, like the store's own answers.
	d.RetryAfter = ceilMillis(time.Duration(until - now))
	d.ResetAfter = max(ceilMillis(d.ResetAfter-time.Duration(now-dn.sinceNs)), d.RetryAfter)
	return d, true
}

// ceilMillis rounds d up to a whole millisecond.
func ceilMillis(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r > 0 {
		d += time.Millisecond - r
	}
	return d
}

// leaseTable holds the leases of this node, sharded to keep lock hold
// times short, at most max of them. Lookups take a read lock and allocate
// nothing.
type leaseTable struct {
	seed   maphash.Seed
	shards [64]leaseShard
	// size counts the leases in all shards; a lease is added only after
	// size has made room for it. full counts getOrCreate calls that found
	// no room.
	size, full atomic.Int64
	max        int64
}

type leaseShard struct {
	mu sync.RWMutex
	m  map[leaseKey]*lease
}

func newLeaseTable(maxLeases int) *leaseTable {
	t := &leaseTable{seed: maphash.MakeSeed(), max: int64(maxLeases)}
	for i := range t.shards {
		t.shards[i].m = make(map[leaseKey]*lease)
	}
	return t
}

func (t *leaseTable) shard(k leaseKey) *leaseShard {
	return &t.shards[maphash.String(t.seed, k.key)%uint64(len(t.shards))]
}

func (t *leaseTable) get(k leaseKey) *lease {
	sh := t.shard(k)
	sh.mu.RLock()
	l := sh.m[k]
	sh.mu.RUnlock()
	return l
}

// getOrCreate returns k's lease, adding one if there is room. When the
// table is full it returns a lease that is not in the table: enough to
// decide one check, which it never leases for (its demand is that one
// check) and whose denial only the denied cache keeps.
func (t *leaseTable) getOrCreate(k leaseKey, now int64) *lease {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if l := sh.m[k]; l != nil {
		return l
	}
	l := &lease{sampleStart: now}
	l.lastUsed.Store(now)
	if t.size.Add(1) > t.max {
		t.size.Add(-1)
		t.full.Add(1)
		return l
	}
	sh.m[k] = l
	return l
}

func (t *leaseTable) remove(k leaseKey) *lease {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := sh.m[k]
	if l != nil {
		delete(sh.m, k)
		t.size.Add(-1)
	}
	return l
}

// removeIf removes k's lease if it is still l and drop(l) holds under the
// shard's write lock.
func (t *leaseTable) removeIf(k leaseKey, l *lease, drop func(*lease) bool) {
	sh := t.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.m[k] == l && drop(l) {
		delete(sh.m, k)
		t.size.Add(-1)
	}
}

// eachRead calls f for every lease under read locks, so checks on the
// same shard proceed meanwhile; f must not call back into the table.
func (t *leaseTable) eachRead(f func(leaseKey, *lease)) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.RLock()
		for k, l := range sh.m {
			f(k, l)
		}
		sh.mu.RUnlock()
	}
}

// minLeaseChecks is the smallest lease worth taking, in checks of the
// requesting cost: a lease costs a call to take and often one to give back.
const minLeaseChecks = 4

// leaseWant sizes the next grant for l and says how long it may be held.
// The size is the key's demand on this node over the horizon, capped at
// this node's share of MaxFraction of the capacity. It returns want = cost
// (a plain check) when a lease is not worthwhile: leases off, a cold key, a
// limit too small for the cap to hold a few checks' worth.
//
// Demand is measured over samples at least one horizon long and smoothed;
// until a sample completes, the checks seen so far bound the rate from
// below, so a key that turns hot leases within its first horizon while two
// checks a microsecond apart never look like a hot key.
// Called with l.mu held.
func (n *Node) leaseWant(l *lease, p Policy, cost int64, now int64) (want int64, hold time.Duration) {
	if p.Lease == LeaseOff {
		return cost, 0
	}
	// Units in a lease are spent at the authority but not yet admitted, so
	// a lease held for a large part of the period under-admits: the sliding
	// log, which records a leased unit at the lease's end, would keep each
	// unit in its window for period + hold. Holding a lease at most
	// MaxFraction of the period bounds that to the same fraction.
	hold = min(n.lcfg.Hold, time.Duration(n.lcfg.MaxFraction*float64(p.Limit.Period))).Truncate(time.Millisecond)
	if hold <= 0 {
		return cost, 0
	}
	horizon := min(n.lcfg.Horizon, hold)
	demand := l.demand.Load()
	if elapsed := now - l.sampleStart; elapsed >= int64(horizon) {
		l.demand.Add(-demand)
		sample := float64(demand) / (float64(elapsed) / float64(time.Second))
		if l.rate == 0 {
			l.rate = sample
		} else {
			l.rate = 0.5*l.rate + 0.5*sample
		}
		l.sampleStart, demand = now, 0
	}
	rate := max(l.rate, float64(demand)/horizon.Seconds())
	share := int64(n.lcfg.MaxFraction * float64(p.Limit.Capacity()) / float64(max(1, n.clusterSize())))
	want = min(int64(rate*horizon.Seconds()), share)
	if want < minLeaseChecks*max(cost, 1) {
		return cost, 0
	}
	return want, hold
}

// checkLeased is the check path of a remote store: the key's lease, its
// last denial and the denied cache, then the store.
func (n *Node) checkLeased(ctx context.Context, p Policy, key string, cost int64) (Result, error) {
	k := leaseKey{p.Name, key}
	now := n.clock()
	l := n.leases.get(k)
	if l != nil {
		l.demand.Add(max(cost, 1))
		// A coarse timestamp is enough for eviction, and skipping the write
		// keeps hits on a hot key from contending on it.
		if now-l.lastUsed.Load() > int64(time.Millisecond) {
			l.lastUsed.Store(now)
		}
		if res, ok := n.answerLocally(l, p.Limit, cost, now); ok {
			return res, nil
		}
	}
	if d, ok := n.denied.Lookup(n.cacheKey(k, p.Limit), cost, now/int64(time.Millisecond)); ok {
		n.stats.deniedCacheHits.Add(1)
		return Result{Decision: d, Source: SourceDeniedCache}, nil
	}
	if l == nil {
		// A full table gives an untracked lease: this check goes to the
		// store alone (LeaseConfig.MaxKeys).
		l = n.leases.getOrCreate(k, now)
		l.demand.Add(max(cost, 1))
	}
	return n.refill(ctx, k, l, p, cost)
}

// answerLocally answers a check of cost under lim from l alone: its grant,
// or its last denial. The denial covers the moment before the denied
// cache's asynchronous write becomes visible (and checks that waited on a
// coalesced call); the cache outlives idle keys.
func (n *Node) answerLocally(l *lease, lim algorithms.Limit, cost, now int64) (Result, bool) {
	if d, ok := n.take(l, lim, cost, now); ok {
		n.stats.leaseHits.Add(1)
		return Result{Decision: d, Source: SourceLease}, true
	}
	if d, ok := l.deniedFor(lim, cost, now); ok {
		n.stats.deniedCacheHits.Add(1)
		return Result{Decision: d, Source: SourceDeniedCache}, true
	}
	return Result{}, false
}

// fetch is one store call for a key, shared by the checks that wait for it.
type fetch struct {
	done chan struct{} // closed when res and failed are set
	// res answers the check that started the call.
	res Result
	// failed is the store's error when the call failed: the checks that
	// waited for it take their failure mode too, rather than each making
	// a call of its own in turn.
	failed error
}

// fetchTimeout bounds a store call that no caller waits for any more; the
// store's own per-call deadline normally ends it much sooner.
const fetchTimeout = 10 * time.Second

// refill takes a new grant for l, or asks the store for this check alone
// when a lease is not worthwhile. At most one refill per key is in flight
// on this node: concurrent misses wait for it (coalescing), then try the
// new grant or the denial it brought back before calling again, so a flood
// on a denied key costs one call per retry_after.
//
// Except on a key whose policy has leases off, while its store calls are
// quick (lease.quick): there a check that finds a call in flight makes its
// own plain call at once, beside it (up to maxBeside of them), and the
// store pipelines them (the Redis store decides them in one batch script
// call, in order, each atomically). Waiting would only serialise the key
// at one round trip per check: no grant can come back, and a denial that
// does is remembered for the checks that arrive after it. A slow or
// failing call makes the next checks wait and share its outcome again.
//
// Waiting is bounded:
//   - the call in flight when a check arrives started earlier, and its own
//     deadline ends it: the check waits for its outcome, and if it failed
//     takes its failure mode with the same error, without a call of its
//     own;
//   - for the calls that follow, it waits only until n.coalesceFor (the
//     store's per-call timeout) after it arrived, then makes a plain call
//     of its own beside the one in flight. So a key that cannot lease is
//     decided one call at a time only while those calls are quick, and no
//     check waits much longer than two store calls, however many arrive
//     at once.
//
// The call runs on its own goroutine and finishes even if ctx ends first:
// a grant taken at the store is spent there, and only a call that runs to
// completion can install it or give it back.
func (n *Node) refill(ctx context.Context, k leaseKey, l *lease, p Policy, cost int64) (Result, error) {
	// budget starts with the first wait and bounds the later ones; a nil
	// channel never fires, so the first wait is for the call's outcome.
	var budget *time.Timer
	var later <-chan time.Time
	defer func() {
		if budget != nil {
			budget.Stop()
		}
	}()
	l.mu.Lock()
	for l.refilling != nil {
		if p.Lease == LeaseOff && l.beside < maxBeside && l.quick.Load() {
			return n.call(ctx, k, l, p, cost)
		}
		f := l.refilling
		l.mu.Unlock()
		if budget != nil {
			later = budget.C
		} else {
			budget = time.NewTimer(n.coalesceFor)
		}
		select {
		case <-f.done:
		case <-later:
			// Waited long enough for others: call beside them.
			l.mu.Lock()
			return n.call(ctx, k, l, p, cost)
		case <-ctx.Done():
			return Result{}, fmt.Errorf("check %s: %w", p.Name, ctx.Err())
		}
		if res, ok := n.answerLocally(l, p.Limit, cost, n.clock()); ok {
			return res, nil
		}
		if f.failed != nil {
			return n.failureResult(p), nil
		}
		l.mu.Lock()
	}
	return n.call(ctx, k, l, p, cost)
}

// call makes the store call for a check refill could not answer, with l.mu
// held (it unlocks it). With no call in flight for the key it is the key's
// refill and may take a lease; beside one in flight it is a plain check of
// cost, so the key never holds two grants.
func (n *Node) call(ctx context.Context, k leaseKey, l *lease, p Policy, cost int64) (Result, error) {
	start := n.clock()
	if l.dead {
		// Reset removed this lease while we held it: use the key's new one.
		l.mu.Unlock()
		return n.refill(ctx, k, n.leases.getOrCreate(k, start), p, cost)
	}
	f := &fetch{done: make(chan struct{})}
	want, hold := cost, time.Duration(0)
	if l.refilling == nil {
		want, hold = n.leaseWant(l, p, cost, start)
		l.refilling = f
	} else {
		l.beside++
	}
	l.mu.Unlock()

	go n.fetch(context.WithoutCancel(ctx), k, l, f, p, cost, want, hold, start)
	select {
	case <-f.done:
		return f.res, nil
	case <-ctx.Done():
		return Result{}, fmt.Errorf("check %s: %w", p.Name, ctx.Err())
	}
}

// fetch makes the store call refill started at start (node clock) and
// installs what it brought back: the grant, or the denial.
func (n *Node) fetch(ctx context.Context, k leaseKey, l *lease, f *fetch, p Policy, cost, want int64, hold time.Duration, start int64) {
	ctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	defer func() {
		l.quick.Store(f.failed == nil && n.clock()-start < int64(n.coalesceFor/quickCall))
		l.mu.Lock()
		if l.refilling == f {
			l.refilling = nil
		} else {
			l.beside--
		}
		l.mu.Unlock()
		close(f.done)
	}()
	if want > cost {
		// Leftovers of the previous grant go back before the new one is
		// taken, so the key never holds two grants' worth of units. A plain
		// check leaves them: a smaller cost may still use them.
		if old, left := l.unspent(start, false); left > 0 {
			if err := n.release(ctx, k, l, old, left); err != nil {
				// The store is failing now: take the failure mode rather
				// than make this check, and those waiting for it, wait
				// out a second call.
				f.res, f.failed = n.storeFailed(p, err), err
				return
			}
		}
	}
	base := n.keyBase(p, k.key)
	d, taken, err := n.store.Acquire(ctx, base, p.Limit, cost, want, hold)
	if err != nil {
		f.res, f.failed = n.storeFailed(p, err), err
		return
	}

	// The lease's life is measured from before the call: the store read its
	// clock later, so the lease ends no later than the store assumes (only
	// durations cross over; the clocks need not agree). One millisecond
	// less, because the store counts in whole milliseconds of a clock it
	// read down to the millisecond: its window may end up to 1ms sooner
	// than now + use_within, and a sliding-log entry may sit up to 1ms
	// before the lease's true end.
	life := hold
	if taken.UseWithin > 0 {
		life = min(life, taken.UseWithin)
	}
	life -= time.Millisecond
	extra := taken.Units - cost // > 0 only when allowed with a lease
	var unused *grant
	l.mu.Lock()
	switch {
	case extra > 0 && life > 0 && !l.dead:
		g := &grant{
			expiresAt:     start + int64(life),
			authRemaining: d.Remaining,
			resetAt:       start + int64(d.ResetAfter),
			capacity:      d.Limit,
			taken:         taken,
			limit:         p.Limit,
			base:          base,
		}
		g.units.Store(extra)
		l.cur.Store(g)
		// As on a lease hit: what the store has left plus what this node
		// now holds for the key.
		d.Remaining = min(d.Limit, d.Remaining+extra)
		n.stats.leasesGranted.Add(1)
		n.stats.unitsLeased.Add(extra)
	case extra > 0:
		// Granted as its window closed, or for a key reset meanwhile: give
		// it back (a no-op if the window has turned or the state is gone).
		unused = &grant{taken: taken, limit: p.Limit, base: base}
	case !d.Allowed && d.RetryAfter > 0 && !l.dead:
		// The denial holds for RetryAfter from the store's reading of its
		// clock, which came after start: measuring from start never holds
		// it longer than the store meant. Both writes happen under l.mu, so
		// a Reset either sees them (and forgets them) or prevents them.
		l.denial.Store(&denial{limit: p.Limit, cost: max(cost, 1), sinceNs: start, untilNs: start + int64(d.RetryAfter), decision: d})
		n.denied.Add(n.cacheKey(k, p.Limit), max(cost, 1), d, start/int64(time.Millisecond))
		n.stats.denialsCached.Add(1)
		n.announceDenial(k, p.Limit, max(cost, 1), d, start)
	}
	l.mu.Unlock()
	if unused != nil {
		_ = n.release(ctx, k, l, unused, extra) // logged; the decision stands
	}
	f.res = Result{Decision: d, Source: SourceStore}
}

// release gives units of g, a grant of l, back to the store. A failure only
// costs under-admission until the window or refill restores them, so it is
// logged, and returned only to say that the store is failing. Units that
// went back may make room that the key's remembered denial no longer
// reflects, so that denial is dropped.
func (n *Node) release(ctx context.Context, k leaseKey, l *lease, g *grant, units int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	returned, err := n.store.Release(ctx, g.base, g.limit, units, g.taken)
	if err != nil {
		n.log.Warn("lease release failed; units return when the window or refill restores them", "units", units, "err", err)
		return err
	}
	n.stats.unitsReturned.Add(returned)
	if returned > 0 {
		l.denial.Store(nil)
		n.denied.Forget(cache.Key{Policy: k.policy, Key: k.key})
	}
	return nil
}

// sweepLeases returns the unused units of expired grants and forgets keys
// idle for idleAfter whose grant, if any, has expired. It runs on the
// node's janitor.
func (n *Node) sweepLeases(ctx context.Context, idleAfter time.Duration) {
	n.giveBack(ctx, true, func(l *lease, now int64) bool {
		if g := l.cur.Load(); g != nil && now < g.expiresAt {
			return false
		}
		return now-l.lastUsed.Load() > int64(idleAfter)
	})
}

// releaseAll returns every lease's unused units and forgets every lease;
// used on shutdown.
func (n *Node) releaseAll(ctx context.Context) {
	n.giveBack(ctx, false, func(*lease, int64) bool { return true })
}

// giveBack returns the unspent units of every grant (only expired ones if
// onlyExpired) and drops the leases forget picks. The releases run
// concurrently, so the store pipelines them into few round trips.
func (n *Node) giveBack(ctx context.Context, onlyExpired bool, forget func(*lease, int64) bool) {
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
	n.leases.eachRead(func(k leaseKey, l *lease) {
		if g, left := l.unspent(now, onlyExpired); left > 0 {
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
		n.leases.removeIf(p.k, p.l, func(l *lease) bool { return forget(l, now) && !l.busy() })
	}
	var wg sync.WaitGroup
	for _, p := range toRelease {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = n.release(ctx, p.k, p.l, p.g, p.units) // logged
		}()
	}
	wg.Wait()
}

// busy reports whether a store call for l is in flight.
func (l *lease) busy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refilling != nil
}

// unitsHeld sums the unspent units of every lease, expired ones included
// until the janitor returns them.
func (n *Node) unitsHeld() int64 {
	var held int64
	n.leases.eachRead(func(_ leaseKey, l *lease) {
		if g := l.cur.Load(); g != nil {
			held += g.units.Load()
		}
	})
	return held
}
