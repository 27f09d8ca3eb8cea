package node

import (
	"sync"
	"sync/atomic"
)

// This file is the client grants a node remembers (clientLeases): what
// each key's client holders hold, reserved against the cap, retired, given
// back or forgotten.

// clientGrant is a ClientGrant as the node remembers it.
type clientGrant struct {
	id        string
	k         leaseKey
	units     int64
	expiresAt int64 // node clock (ns): no unit is spent from then on
	forgetAt  int64 // node clock (ns): a return no longer finds it
	g         *grant
	// retired: the client replaced this grant and spends its last units
	// (units: what it said it kept, at most half the grant) while keeping
	// it open for a later return; those units still count against the cap,
	// but the grant is not a holder of its own in the equal split.
	retired bool
}

// clientLeases is the client grants a node remembers. The zero value is
// empty and ready. Its lock is never taken on the check path.
type clientLeases struct {
	mu    sync.Mutex
	byID  map[string]*clientGrant
	byKey map[leaseKey]*keyGrants

	// Totals since the node started: grants made, units granted beyond the
	// granting checks' own cost, and units client returns gave back to the
	// store.
	granted, unitsGranted, unitsReturned atomic.Int64
}

// keyGrants is one key's client grants, and the reservations of grants
// whose store call is in flight.
type keyGrants struct {
	grants              map[string]*clientGrant
	reserved, reserving int64
}

// reserve sets aside up to want units of k for a new grant at now (node
// clock): at most the node's share less what its own lease and the
// clients' grants in force hold, and at most an equal split of the share
// among the key's client holders, this one included. It returns the units
// reserved (maybe 0); settle ends the reservation.
func (c *clientLeases) reserve(k leaseKey, want, share, nodeHeld, now int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	kg := c.keyLocked(k)
	held, holders := kg.reserved, kg.reserving+1
	for _, cg := range kg.grants {
		if now >= cg.expiresAt {
			continue
		}
		// A retired grant's kept units are still the client's to spend:
		// they count against the share, but its holder is counted once,
		// by the grant that replaced it.
		held += cg.units
		if !cg.retired {
			holders++
		}
	}
	got := min(want, share-nodeHeld-held, share/holders)
	if got <= 0 {
		c.cleanLocked(k, kg)
		return 0
	}
	kg.reserved += got
	kg.reserving++
	return got
}

// settle ends a reservation of reserved units of k (0 for none): when cg
// is not nil the grant cg (of at most reserved units) takes its place.
func (c *clientLeases) settle(k leaseKey, reserved int64, cg *clientGrant) {
	if reserved == 0 && cg == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	kg := c.byKey[k]
	kg.reserved -= reserved
	kg.reserving--
	if cg != nil {
		kg.grants[cg.id] = cg
		c.byID[cg.id] = cg
	}
	c.cleanLocked(k, kg)
}

// keyLocked returns k's entry, adding an empty one. c.mu held.
func (c *clientLeases) keyLocked(k leaseKey) *keyGrants {
	if c.byKey == nil {
		c.byID, c.byKey = map[string]*clientGrant{}, map[leaseKey]*keyGrants{}
	}
	kg := c.byKey[k]
	if kg == nil {
		kg = &keyGrants{grants: map[string]*clientGrant{}}
		c.byKey[k] = kg
	}
	return kg
}

// add records the grant cg of k, for which nothing was reserved (a lease
// taken ahead of need whose only unit is its own check's cost).
func (c *clientLeases) add(k leaseKey, cg *clientGrant) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kg := c.keyLocked(k)
	kg.grants[cg.id] = cg
	c.byID[cg.id] = cg
}

// cleanLocked forgets kg, k's entry, when it holds nothing. c.mu held.
func (c *clientLeases) cleanLocked(k leaseKey, kg *keyGrants) {
	if len(kg.grants) == 0 && kg.reserving == 0 {
		delete(c.byKey, k)
	}
}

// dropLocked forgets the grant cg. c.mu held.
func (c *clientLeases) dropLocked(cg *clientGrant) {
	delete(c.byID, cg.id)
	if kg := c.byKey[cg.k]; kg != nil {
		delete(kg.grants, cg.id)
		c.cleanLocked(cg.k, kg)
	}
}

// take removes the grant named id and returns it; nil if there is none.
func (c *clientLeases) take(id string) *clientGrant {
	c.mu.Lock()
	defer c.mu.Unlock()
	cg := c.byID[id]
	if cg != nil {
		c.dropLocked(cg)
	}
	return cg
}

// forget drops every grant drop picks; their units stay spent at the store.
func (c *clientLeases) forget(drop func(*clientGrant) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cg := range c.byID {
		if drop(cg) {
			c.dropLocked(cg)
		}
	}
}

// held is the units of k's client grants in force at now (node clock),
// reservations included.
func (c *clientLeases) held(k leaseKey, now int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	kg := c.byKey[k]
	if kg == nil {
		return 0
	}
	held := kg.reserved
	for _, cg := range kg.grants {
		if now < cg.expiresAt {
			held += cg.units // a retired grant's kept units included
		}
	}
	return held
}

// retire marks the grant named id retired, keeping at most kept of its
// units, and at most half of them rounded up (retiredShare), for the
// client to spend and for a later return; the kept units go on counting
// against the cap until the grant expires. It reports whether this node
// holds the grant. Retiring a grant twice keeps the smaller figure.
func (c *clientLeases) retire(id string, kept int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	cg := c.byID[id]
	if cg == nil {
		return false
	}
	cg.retired = true
	cg.units = min(cg.units, kept, retiredShare(cg.units))
	return true
}

// retiredShare is the most a retired grant of units may keep: half,
// rounded up. A client asks for its next lease once its current one is
// down to about two round trips' worth, at most half of it, so an honest
// client never keeps more; a client that says it keeps more cannot hoard
// the cap by chaining grants, each retiring the whole of the last.
func retiredShare(units int64) int64 { return units - units/2 }

// unitsHeld is the units granted to clients and not yet returned or
// forgotten.
func (c *clientLeases) unitsHeld() (grants int, units int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cg := range c.byID {
		units += cg.units
	}
	return len(c.byID), units
}
