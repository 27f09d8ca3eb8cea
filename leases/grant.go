package leases

import (
	"sync/atomic"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// Units is one grant's units as its holder spends them: taken from the
// store in one call, spent locally until ExpiresAt. Everything but the
// unspent count is fixed when the grant is made. The zero value holds
// nothing. Safe for concurrent use: units are claimed with a CAS, so each
// is spent at most once, and whoever gives the rest back claims them all
// with Claim first.
type Units struct {
	unspent atomic.Int64
	// ExpiresAt is the holder's clock (ns) from which no unit may be
	// spent.
	ExpiresAt int64
	// Capacity is the limit's capacity; AuthRemaining and ResetAt the
	// store's remaining units and reset time (holder's clock, ns) right
	// after the grant: what a spend reports.
	Capacity, AuthRemaining, ResetAt int64
}

// Fill sets the unspent units of a grant that no spender can see yet.
func (u *Units) Fill(n int64) { u.unspent.Store(n) }

// Spend spends cost units if the grant holds at least max(cost, 1) of
// them and has not expired at now (holder's clock, ns); cost 0 asks
// whether one unit is held and spends nothing. clock reads the holder's
// clock again once the units are claimed: units claimed just as the grant
// expired are dropped, not spent late (a window's units must not spill
// into the next window), which under-admits by at most cost. It reports
// the decision to return and the units left.
//
// The decision's Remaining is the store's remaining at the grant plus the
// units left, at most the capacity: an estimate blind to other holders'
// spending since.
func (u *Units) Spend(cost, now int64, clock func() int64) (d algorithms.Decision, left int64, ok bool) {
	need := max(cost, 1)
	for {
		held := u.unspent.Load()
		if held < need || now >= u.ExpiresAt {
			return algorithms.Decision{}, 0, false
		}
		if !u.unspent.CompareAndSwap(held, held-cost) {
			continue
		}
		if now = clock(); now >= u.ExpiresAt {
			return algorithms.Decision{}, 0, false
		}
		left = held - cost
		return algorithms.Decision{
			Allowed:    true,
			Limit:      u.Capacity,
			Remaining:  min(u.Capacity, u.AuthRemaining+left),
			ResetAfter: time.Duration(max(0, u.ResetAt-now)),
		}, left, true
	}
}

// Unspent is the units not spent yet.
func (u *Units) Unspent() int64 { return u.unspent.Load() }

// Claim takes every unspent unit, so that they can be given back once,
// and returns how many there were; spends after it find none.
func (u *Units) Claim() int64 { return u.unspent.Swap(0) }
