package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quotad/quotad/algorithms"
	"github.com/quotad/quotad/cache"
)

// This file is the local layer a node keeps in front of its store (local),
// and the empty one of the memory store (direct).

// local is what a node keeps in process in front of its store, chosen
// once by New: in front of a remote store, leases and remembered denials
// (leasing, leasing.go); in front of the memory store, which is in
// process and as fast as a lease, nothing (direct). The check path calls
// it without asking which.
type local interface {
	// check decides a valid check of a rate limit (not a concurrency
	// limit), as Check documents.
	check(ctx context.Context, p Policy, key string, cost int64, o CheckOptions) (Result, error)
	// denied returns a remembered denial of cost units of k under lim
	// that holds at now (node clock).
	denied(k leaseKey, lim algorithms.Limit, cost, now int64) (algorithms.Decision, bool)
	// remember records the store's denial d of cost units (at least 1) of
	// k under lim, asked at start (node clock), and announces it to the
	// cluster. l is k's lease when the denial came for it, else nil.
	remember(k leaseKey, l *lease, lim algorithms.Limit, cost int64, d algorithms.Decision, start int64)
	// applyDenial remembers a denial another member got, whose waits
	// count from at (node clock).
	applyDenial(k leaseKey, lim algorithms.Limit, cost int64, d algorithms.Decision, at int64)
	// returned says that units of k went back to the store: a remembered
	// denial may no longer hold.
	returned(k leaseKey)
	// forget drops the lease and remembered denials of key under policy
	// (a reset, here or at another member).
	forget(policy, key string)
	// forgetAgain forgets key's remembered denials once more and waits
	// until that applies: a denial added just before the first forget may
	// become visible after it.
	forgetAgain(policy, key string)
	// forgetPolicies drops the leases and remembered denials of every key
	// of the named policies, giving the leases' units back, up to ctx.
	forgetPolicies(ctx context.Context, names map[string]bool)
	// figures reports the layer's figures for Stats and the metrics.
	figures() localFigures
	// grantLease is GrantLease for a valid, leasable check (hold > 0,
	// cost > 0) once the previous lease went back.
	grantLease(ctx context.Context, p Policy, key string, cost, want int64, hold time.Duration, ahead bool) (Result, ClientGrant, error)
	// retireLease stops counting the client lease id against the cap but
	// keeps it for one later return of at most kept units
	// (LeaseReturn.Kept); a lease the layer does not hold is ignored.
	retireLease(id string, kept int64)
	// returnLease is ReturnLease for a valid request.
	returnLease(ctx context.Context, id string, units int64) (int64, error)
	// clientLeaseStats reports the client leases the layer remembers.
	clientLeaseStats() ClientLeaseStats
	// drain stops the layer's goroutines and gives every lease's unused
	// units back to the store, up to ctx.
	drain(ctx context.Context)
	// close releases the layer's resources; nothing else is called after.
	close()
}

// localFigures are a local layer's figures (see Stats).
type localFigures struct {
	unitsHeld, leaseKeys, tableFull int64
	denied                          cache.DeniedStats
}

// direct is the local layer of the memory store: none. Every check goes
// to the store, and there is nothing to remember or forget.
type direct struct{ n *Node }

// check implements local: one store call.
func (s direct) check(ctx context.Context, p Policy, key string, cost int64, o CheckOptions) (Result, error) {
	n := s.n
	d, _, err := n.store.Acquire(ctx, AcquireRequest{Base: n.keyBase(p, key), Limit: p.Limit, Cost: cost, Want: cost, Bulk: o.Bulk, Charge: o.Charge})
	if err == nil {
		return Result{Decision: d, Source: SourceStore}, nil
	}
	if errors.Is(err, ErrStoreFull) {
		// Not a failure the failure mode may paper over: failing open would
		// stop limiting every new key for as long as the store is full.
		return Result{}, err
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return Result{}, fmt.Errorf("check %s: %w", p.Name, ctxErr)
	}
	return n.storeFailed(p, err)
}

func (direct) denied(leaseKey, algorithms.Limit, int64, int64) (algorithms.Decision, bool) {
	return algorithms.Decision{}, false
}

func (direct) remember(leaseKey, *lease, algorithms.Limit, int64, algorithms.Decision, int64) {}
func (direct) applyDenial(leaseKey, algorithms.Limit, int64, algorithms.Decision, int64)      {}
func (direct) returned(leaseKey)                                                              {}
func (direct) forget(string, string)                                                          {}
func (direct) forgetAgain(string, string)                                                     {}
func (direct) forgetPolicies(context.Context, map[string]bool)                                {}
func (direct) figures() localFigures                                                          { return localFigures{} }
func (direct) retireLease(string, int64)                                                      {}
func (direct) clientLeaseStats() ClientLeaseStats                                             { return ClientLeaseStats{} }

// grantLease implements local: the memory store needs no lease, so the
// check alone.
func (s direct) grantLease(ctx context.Context, p Policy, key string, cost, _ int64, _ time.Duration, _ bool) (Result, ClientGrant, error) {
	res, err := s.n.Check(ctx, p, key, cost)
	return res, ClientGrant{}, err
}

// returnLease implements local: direct grants none.
func (direct) returnLease(_ context.Context, id string, _ int64) (int64, error) {
	return 0, leaseNotHeld(id)
}
func (direct) drain(context.Context) {}
func (direct) close()                {}
