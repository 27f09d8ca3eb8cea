package node

import (
	"sync/atomic"

	"github.com/quotad/quotad/cache"
)

// This file is the node's counters of its local pre-aggregation and its
// store, for status pages and metrics.

// stats are the node's lease and cache counters.
type stats struct {
	leasesGranted, unitsLeased, unitsReturned, denialsCached atomic.Int64
	leaseHits, deniedCacheHits                               atomic.Int64
	storeStateLosses                                         atomic.Int64
	// lateTakesReturned counts units given back after their take's reply
	// came too late for its caller (late.go).
	lateTakesReturned atomic.Int64
}

// Stats is a snapshot of the node's local pre-aggregation.
type Stats struct {
	// LeasesGranted counts grants of more than the checking request's cost.
	LeasesGranted int64
	// UnitsLeased counts units taken in leases beyond the granting checks'
	// own cost; UnitsReturned counts those given back unused.
	UnitsLeased, UnitsReturned int64
	// UnitsHeld is the units this node's leases hold right now.
	UnitsHeld int64
	// LeaseKeys is the keys the node tracks for leasing now (at most
	// LeaseConfig.MaxKeys); LeaseTableFull counts checks of other keys
	// that found no room and went to the store without a lease.
	LeaseKeys, LeaseTableFull int64
	// DenialsCached counts store denials remembered for later checks.
	DenialsCached int64
	// LeaseHits and DeniedCacheHits count checks answered locally.
	LeaseHits, DeniedCacheHits int64
	// StoreStateLosses counts the times the store's state changed under
	// the node (a Redis restart, failover or flush) and the node dropped
	// every lease and cached denial.
	StoreStateLosses int64
	// Denied is the denied cache's own counters.
	Denied cache.DeniedStats
	// StoreErrors counts failed store calls (not those the breaker
	// refused, nor overloads); BreakerOpens counts how often the breaker
	// opened, and BreakerOpen says whether it is open now. Breaker says
	// whether there is one: only a remote store has it.
	StoreErrors, BreakerOpens int64
	BreakerOpen, Breaker      bool
	// StoreOverloads counts the store calls that failed with
	// ErrOverloaded: their deadline passed inside the node while the store
	// answered, and their checks were shed.
	StoreOverloads int64
	// LateUnitsReturned counts the units given back to the store after a
	// call's reply came too late for its caller, whose answer had not
	// spent them (a shed or failed-closed check, a denied batch).
	LateUnitsReturned int64
	// StoreCalls counts the calls a remote store was sent (checks, lease
	// grants and returns; not resets, nor calls the breaker refused); 0
	// for the memory store. Pipelining may carry several in one round
	// trip.
	StoreCalls int64
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	f := n.local.figures()
	st := Stats{
		LeasesGranted:   n.stats.leasesGranted.Load(),
		UnitsLeased:     n.stats.unitsLeased.Load(),
		UnitsReturned:   n.stats.unitsReturned.Load(),
		UnitsHeld:       f.unitsHeld,
		LeaseKeys:       f.leaseKeys,
		LeaseTableFull:  f.tableFull,
		DenialsCached:   n.stats.denialsCached.Load(),
		LeaseHits:       n.stats.leaseHits.Load(),
		DeniedCacheHits: n.stats.deniedCacheHits.Load(),
		Denied:          f.denied,

		StoreStateLosses:  n.stats.storeStateLosses.Load(),
		LateUnitsReturned: n.stats.lateTakesReturned.Load(),
	}
	if n.breaker != nil {
		st.StoreErrors = n.breaker.errors.Load()
		st.StoreOverloads = n.storeOverloads()
		st.BreakerOpens = n.breaker.opens.Load()
		st.BreakerOpen = n.breaker.open.Load()
		st.StoreCalls = n.breaker.calls.Load()
		st.Breaker = true
	}
	return st
}

// storeOverloads is Stats.StoreOverloads.
func (n *Node) storeOverloads() int64 {
	if n.breaker == nil {
		return 0
	}
	return n.breaker.overloads.Load()
}

// breakerRefusals is how many store calls the circuit breaker refused
// while open; 0 for the memory store.
func (n *Node) breakerRefusals() int64 {
	if n.breaker == nil {
		return 0
	}
	return n.breaker.refusals.Load()
}

// StoreAvailable reports whether checks reach the store: false while the
// circuit breaker is open. The memory store is always available.
func (n *Node) StoreAvailable() bool { return n.breaker == nil || !n.breaker.open.Load() }

// OnStoreAvailability registers fn to be called each time the store becomes
// unavailable (the breaker opens) or available again. fn runs on the node's
// goroutine that saw the change and must not block.
func (n *Node) OnStoreAvailability(fn func(available bool)) {
	if n.breaker != nil {
		n.breaker.onChange(fn)
	}
}
