package node

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/leases"
)

// Client leases: units a client takes from the store through this node, to
// spend in its own process (the API's AcquireLease and ReturnLease). They
// follow the node's own lease rules (lease.go): the same store call spends
// them at the authority, with the same hold (leaseHold), out of the same
// per-node cap (leaseShare), and the unused units go back through the same
// release. The node cannot see a client spend, so it only remembers what it
// granted, to cap what clients hold and to take each grant's units back
// once.

// Errors of client leases; each is wrapped with the field or operation.
var (
	// ErrLeaseNotHeld: a return named a lease this node does not hold: never
	// granted here (another node may have), already returned, forgotten
	// after it expired, or dropped by a Reset, a policy change or a loss of
	// the store's state. Nothing was returned.
	ErrLeaseNotHeld = errors.New("lease not held")
	// ErrInvalidLease: a lease id that is empty or too long, a negative
	// want or a negative number of units to return.
	ErrInvalidLease = algorithms.NewInputError("invalid lease request")
	// ErrConcurrencyLease: a lease of a concurrency limit, whose slots are
	// taken one by one with Check.
	ErrConcurrencyLease = algorithms.NewInputError("a concurrency limit cannot be leased; check it with Check")
)

// MaxLeaseIDLen is the longest lease id ReturnLease accepts; the ids the
// node makes are 26 bytes.
const MaxLeaseIDLen = 64

// clientGrantGrace is how long past its expiry the node remembers a client
// grant, so that a return sent as the lease ended still finds it.
const clientGrantGrace = time.Second

// ClientGrant is what GrantLease gave a client beyond the check's own cost.
// The zero value is no lease.
type ClientGrant struct {
	// ID names the grant for ReturnLease; "" when Units is 0.
	ID string
	// Units were spent at the store for the client to spend in its process.
	Units int64
	// UseWithin is how long the units may be spent, measured by the client
	// from before it sent its request: the node measured it from before its
	// store call and took a millisecond off, as for its own leases.
	UseWithin time.Duration
}

// LeaseReturn names a client lease and the unspent units to give back.
type LeaseReturn struct {
	ID    string
	Units int64
	// Kept, when > 0, retires the lease instead of returning it: the client
	// keeps spending its last units (about Kept, at most half the lease's
	// units rounded up) while a new lease comes. Those kept units go on
	// counting against the cap until the lease expires, and a later
	// ReturnLease gives back at most them; Units is ignored.
	Kept int64
}

// ClientLeaseStats are a node's client-lease figures.
type ClientLeaseStats struct {
	// Grants and UnitsHeld are the client grants the node remembers now
	// (outstanding: neither returned nor forgotten after expiry) and their
	// units (spent or not: the node cannot tell).
	Grants    int
	UnitsHeld int64
	// Granted counts grants made since the node started, UnitsGranted
	// their units beyond the granting checks' own cost, and UnitsReturned
	// the units clients gave back that made a difference at the store.
	Granted, UnitsGranted, UnitsReturned int64
}

// ClientLeaseStats returns the node's client-lease figures. It takes a
// lock that the grants and returns take, never one of the check path.
func (n *Node) ClientLeaseStats() ClientLeaseStats { return n.local.clientLeaseStats() }

// clientLeaseStats implements local.
func (n *leasing) clientLeaseStats() ClientLeaseStats {
	g, u := n.clients.unitsHeld()
	return ClientLeaseStats{
		Grants: g, UnitsHeld: u,
		Granted: n.clients.granted.Load(), UnitsGranted: n.clients.unitsGranted.Load(), UnitsReturned: n.clients.unitsReturned.Load(),
	}
}

// GrantLease decides whether key may spend cost units of policy p now, as
// Check does, and when it may, takes up to want more units from the store
// in the same call for a client to spend in its own process. The units
// granted are capped as the node's own leases are: together with the
// node's lease of the key and the other client grants of the key on this
// node, at most leaseShare(p); split equally among the key's client
// holders; nothing when that leaves fewer than four checks' worth
// (leases.MinChecks), for a policy with lease off, and on the memory store
// (which needs no lease). A remembered denial answers without a store
// call, and a denial the store gives is remembered and gossiped like a
// check's.
//
// Errors are Check's (ErrOverloaded included), plus ErrConcurrencyLease
// and ErrInvalidLease (a negative want). A store failure is not an error:
// the policy's failure mode decides and nothing is granted. It may block
// on the store until ctx is done.
//
// previous, when its ID is not empty, is the client's lease of the key
// that this one replaces: it is returned first (ReturnLease), so that its
// unspent units are back and it no longer counts against the cap; with
// previous.Kept > 0 it is retired instead (LeaseReturn.Kept), and the units
// it keeps still count against the cap; a lease this node does not hold is
// ignored.
func (n *Node) GrantLease(ctx context.Context, p Policy, key string, cost, want int64, previous LeaseReturn) (Result, ClientGrant, error) {
	p, err := n.validatedFor(p)
	if err != nil {
		return Result{}, ClientGrant{}, err
	}
	if err := ValidateKey(key); err != nil {
		return Result{}, ClientGrant{}, err
	}
	if err := p.Limit.ValidateCost(cost); err != nil {
		return Result{}, ClientGrant{}, err
	}
	if want < 0 {
		return Result{}, ClientGrant{}, fmt.Errorf("want: %w: %d must not be negative", ErrInvalidLease, want)
	}
	if p.Limit.Algorithm == algorithms.Concurrency {
		return Result{}, ClientGrant{}, fmt.Errorf("policy %s: %w", p.Name, ErrConcurrencyLease)
	}
	switch {
	case previous.Kept < 0:
		return Result{}, ClientGrant{}, fmt.Errorf("previous kept: %w: %d must not be negative", ErrInvalidLease, previous.Kept)
	case previous.ID != "" && previous.Kept > 0:
		if len(previous.ID) > MaxLeaseIDLen {
			return Result{}, ClientGrant{}, fmt.Errorf("previous lease id: %w: %d bytes (want 1 to %d)", ErrInvalidLease, len(previous.ID), MaxLeaseIDLen)
		}
		n.local.retireLease(previous.ID, previous.Kept) // one this node does not hold is ignored
	case previous.ID != "":
		if _, err := n.ReturnLease(ctx, previous.ID, previous.Units); err != nil && !errors.Is(err, ErrLeaseNotHeld) {
			return Result{}, ClientGrant{}, fmt.Errorf("previous %w", err)
		}
	}
	hold := n.leaseHold(p)
	if p.Lease == LeaseOff || hold <= 0 || cost == 0 {
		res, err := n.Check(ctx, p, key, cost)
		return res, ClientGrant{}, err
	}
	return n.local.grantLease(ctx, p, key, cost, want, hold, previous.ID != "" && previous.Kept > 0)
}

// retireLease implements local.
func (n *leasing) retireLease(id string, kept int64) { n.clients.retire(id, kept) }

// grantLease implements local: GrantLease in front of a remote store, for
// a leasable policy. The decision is counted as a check's is.
func (n *leasing) grantLease(ctx context.Context, p Policy, key string, cost, want int64, hold time.Duration, ahead bool) (Result, ClientGrant, error) {
	res, cg, err := n.decideLease(ctx, p, key, cost, want, hold, ahead)
	if err == nil {
		n.count(p.Name, key, res)
	}
	return res, cg, err
}

// decideLease is grantLease without the counting. ahead says that the
// client asks ahead of need (it retires a lease it still spends): the
// check is nobody's, so its cost joins the grant.
func (n *leasing) decideLease(ctx context.Context, p Policy, key string, cost, want int64, hold time.Duration, ahead bool) (Result, ClientGrant, error) {
	k := leaseKey{p.Name, key}
	start := n.clock()
	l := n.leases.Get(k)
	if d, ok := n.denials.lookup(k, l, p.Limit, cost, start); ok {
		n.stats.deniedCacheHits.Add(1)
		return Result{Decision: d, Source: SourceDeniedCache}, ClientGrant{}, nil
	}
	var nodeHeld int64
	if l != nil {
		if g := l.cur.Load(); g != nil && g.limit == p.Limit {
			nodeHeld = g.Unspent()
		}
	}
	extra := n.clients.reserve(k, want, n.leaseShare(p), nodeHeld, start)
	if extra < leases.MinChecks*cost {
		n.clients.settle(k, extra, nil)
		extra = 0
	}
	base := n.keyBase(p, key)
	late := n.newLateTake(k, base, p.Limit)
	d, taken, err := n.store.Acquire(context.WithoutCancel(ctx), AcquireRequest{Base: base, Limit: p.Limit, Cost: cost, Want: cost + extra, Hold: hold, Late: late.arrived})
	if err != nil {
		n.clients.settle(k, extra, nil)
		if ctxErr := ctx.Err(); ctxErr != nil {
			late.settle(0)
			return Result{}, ClientGrant{}, fmt.Errorf("lease %s: %w", p.Name, ctxErr)
		}
		res, err := n.storeFailed(p, err)
		late.settle(admitted(res, err, cost))
		return res, ClientGrant{}, err
	}
	// As for the node's own leases (fetch): measured from before the call,
	// one millisecond short of what the store assumes.
	life := hold
	if taken.UseWithin > 0 {
		life = min(life, taken.UseWithin)
	}
	life -= time.Millisecond
	got := taken.Units - cost // > 0 only when allowed with a lease
	if ahead {
		got = taken.Units
	}
	res := Result{Decision: d, Source: SourceStore}
	switch {
	case got > 0 && life > 0:
		id := rand.Text()
		g := &grant{taken: taken, limit: p.Limit, base: base}
		cg := &clientGrant{id: id, k: k, units: got, expiresAt: start + int64(life), forgetAt: start + int64(life+clientGrantGrace), g: g}
		if extra > 0 {
			n.clients.settle(k, extra, cg)
		} else {
			n.clients.add(k, cg) // the reservation ended above
		}
		n.stats.unitsLeased.Add(got)
		n.clients.granted.Add(1)
		n.clients.unitsGranted.Add(got)
		// What the store has left plus what the client now holds, as on a
		// lease of the node's own.
		res.Remaining = min(d.Limit, d.Remaining+got)
		return res, ClientGrant{ID: id, Units: got, UseWithin: life}, nil
	case got > 0:
		// Granted as its window closed: give it back.
		n.clients.settle(k, extra, nil)
		_, _ = n.returnUnitsCounted(ctx, k, nil, &grant{taken: taken, limit: p.Limit, base: base}, got) // logged
	default:
		n.clients.settle(k, extra, nil)
		if !d.Allowed {
			// Remembered and told to the cluster as a check's denial is.
			n.remember(k, nil, p.Limit, max(cost, 1), d, start)
		}
	}
	return res, ClientGrant{}, nil
}

// ReturnLease gives back up to units unspent units of the client grant
// named id, once, and reports how many made a difference at the store
// (fewer when its window has turned or its bucket refilled meanwhile; 0
// also when the store failed, which is logged: the units stay spent until
// the window or refill restores them). units above the grant's count as
// the grant's. A grant this node does not hold is ErrLeaseNotHeld. It may
// block on the store for up to a second.
func (n *Node) ReturnLease(ctx context.Context, id string, units int64) (int64, error) {
	if id == "" || len(id) > MaxLeaseIDLen {
		return 0, fmt.Errorf("lease id: %w: %d bytes (want 1 to %d)", ErrInvalidLease, len(id), MaxLeaseIDLen)
	}
	if units < 0 {
		return 0, fmt.Errorf("units: %w: %d must not be negative", ErrInvalidLease, units)
	}
	return n.local.returnLease(ctx, id, units)
}

// returnLease implements local.
func (n *leasing) returnLease(ctx context.Context, id string, units int64) (int64, error) {
	cg := n.clients.take(id)
	if cg == nil {
		return 0, leaseNotHeld(id)
	}
	units = min(units, cg.units)
	if units == 0 {
		return 0, nil
	}
	returned, _ := n.returnUnitsCounted(ctx, cg.k, n.leases.Get(cg.k), cg.g, units) // a failure is logged
	n.clients.unitsReturned.Add(returned)
	return returned, nil
}

// leaseNotHeld is the error of a return of the lease id that the node
// does not hold.
func leaseNotHeld(id string) error {
	return fmt.Errorf("lease id: %w: %q was not granted by this node, was returned already, or expired more than %s ago",
		ErrLeaseNotHeld, id, clientGrantGrace)
}

// sweepClientLeases forgets client grants past their expiry and grace; a
// client that did not return them has spent them or lost them.
func (n *leasing) sweepClientLeases(now int64) {
	n.clients.forget(func(cg *clientGrant) bool { return now >= cg.forgetAt })
}

// forgetClientLeases forgets the client grants drop picks, by policy and
// key: a Reset, a policy change or a loss of the store's state makes
// giving them back wrong (units would return to a state that never counted
// them, or under another limit).
func (n *leasing) forgetClientLeases(drop func(policy, key string) bool) {
	n.clients.forget(func(cg *clientGrant) bool { return drop(cg.k.policy, cg.k.key) })
}
