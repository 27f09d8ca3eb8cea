package node

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/leases"
)

// This file is the leases: batches of units a node takes from the store
// ahead of time and spends locally, one check at a time (docs/algorithms.md,
// "Leases"), how their size follows a key's demand, and their config.

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

// ShardKey is what the lease table shards leaseKeys by.
func (k leaseKey) ShardKey() string { return k.key }

// lease returns k's lease, adding one first seen at now if there is
// room. A full table (LeaseConfig.MaxKeys) gives a lease that is not in
// it: enough to decide one check, which it never leases for (its demand
// is that one check) and whose denial only the denied cache keeps.
func (n *leasing) lease(k leaseKey, now int64) *lease {
	l, _ := n.leases.GetOrCreate(k, func() *lease {
		l := &lease{}
		l.demand.Start(now)
		return l
	})
	return l
}

// lease is one key's local state on this node: the grant it is spending,
// the demand that sizes the next one, and the last denial the store gave.
type lease struct {
	// cur is the grant being spent; nil before the first. A refill installs
	// a new one rather than refilling this one, so a unit claimed from a
	// grant is always judged by that grant's own expiry.
	cur atomic.Pointer[grant]
	// demand is the key's demand on this node and its last use; Asked and
	// LastUsed are counted on the hit path, Rate read with mu held.
	demand leases.Demand

	mu sync.Mutex // guards the fields below; never held on the hit path
	// refilling is the store call in flight for the key, if any.
	refilling *storeCall
	// beside counts the plain calls in flight beside refilling.
	beside int
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

// grant is units taken from the store in one call, spent locally until
// they expire (leases.Units, on the node clock), and what giving them back
// needs. The hit path is lock-free (leases.Units.Spend).
type grant struct {
	leases.Units
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
	d, _, ok := g.Spend(cost, now, n.clock)
	return d, ok
}

// claimUnspent empties the current grant, claiming its unspent units so
// they can be given back, and returns the grant with them (nil, 0 when
// there are none). If onlyExpired, a grant still in force is left alone.
func (l *lease) claimUnspent(now int64, onlyExpired bool) (*grant, int64) {
	g := l.cur.Load()
	if g == nil || (onlyExpired && now < g.ExpiresAt) {
		return nil, 0
	}
	return g, g.Claim()
}

// kill ends a lease removed from the table: a store call in flight for l
// must not install its grant or denial (callStore checks dead under l.mu), and
// checks still holding l must not spend its units.
func (l *lease) kill() {
	l.mu.Lock()
	l.dead = true
	l.mu.Unlock()
	if g := l.cur.Swap(nil); g != nil {
		g.Claim()
	}
	l.denial.Store(nil)
}

// busy reports whether a store call for l is in flight.
func (l *lease) busy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refilling != nil
}

// grantSize sizes the next grant for l and says how long it may be held.
// The size is the key's demand on this node over the horizon, capped at
// this node's share of MaxFraction of the capacity. It returns
// want = cost (a plain check) when a lease is not worthwhile: leases off,
// a cold key, a limit too small for the cap to hold a few checks' worth.
// Client leases of k granted by this node (client_leases.go) draw on the
// same share. Called with l.mu held: it samples l's demand.
func (n *leasing) grantSize(k leaseKey, l *lease, p Policy, cost int64, now int64) (want int64, hold time.Duration) {
	if p.Lease == LeaseOff {
		return cost, 0
	}
	hold = n.leaseHold(p)
	if hold <= 0 {
		return cost, 0
	}
	horizon := min(n.cfg.Lease.Horizon, hold)
	want = l.demand.Want(now, horizon, cost, n.leaseShare(p)-n.clients.held(k, now))
	if want == 0 {
		return cost, 0
	}
	return want, hold
}

// leaseHold is the longest a lease of p may be spent.
//
// Units in a lease are spent at the authority but not yet admitted, so a
// lease held for a large part of the period under-admits: the sliding log,
// which records a leased unit at the lease's end, would keep each unit in
// its window for period + hold. Holding a lease at most MaxFraction of the
// period bounds that to the same fraction.
func (n *Node) leaseHold(p Policy) time.Duration {
	return min(n.cfg.Lease.Hold, time.Duration(n.cfg.Lease.MaxFraction*float64(p.Limit.Period))).Truncate(time.Millisecond)
}

// leaseShare is the most units of one key of p this node may hold in
// leases: MaxFraction of the capacity split across the cluster's nodes.
// The node's own lease and the client leases it grants share it.
func (n *Node) leaseShare(p Policy) int64 {
	return int64(n.cfg.Lease.MaxFraction * float64(p.Limit.Capacity()) / float64(max(1, n.cluster.Size())))
}
