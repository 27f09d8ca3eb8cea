package node

import (
	"context"
	"fmt"
	"time"

	"github.com/quotad/quotad/leases"
)

// This file is the store path of a key in front of a remote store: one
// store call per key at a time, shared by the checks that miss meanwhile
// (coalescing), which takes the key's next grant or brings back its
// denial; and giving a grant's unused units back.

// A key that cannot lease may have up to maxBeside calls in flight beside
// its refill while its calls are quick: those that finish within
// 1/quickCall of the store's call timeout.
const (
	maxBeside = 64
	quickCall = 10
)

// storeCall is one store call for a key, shared by the checks that wait
// for it.
type storeCall struct {
	done chan struct{} // closed when res and failed are set
	// res and err answer the check that started the call: err is set
	// (and res empty) when the check is shed (ErrOverloaded).
	res Result
	err error
	// failed is the store's error when the call failed: the checks that
	// waited for it take their failure mode too (or are shed with it),
	// rather than each making a call of its own in turn.
	failed error
	// abandoned means the call's caller left before the store answered
	// (only a plain call runs under its caller's ctx; see call): nothing is
	// known of its outcome, and the checks that waited for it make calls
	// of their own rather than take a failure mode for it.
	abandoned bool
}

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
// A call that may take a grant runs on its own goroutine and finishes even
// if ctx ends first: a grant taken at the store is spent there, and only a
// call that runs to completion can install it or give it back. A plain
// call (every call of a key that cannot lease, and of a cold key) runs on
// the check's own goroutine under ctx: it brings back no grant, so its
// caller leaving loses nothing a check of its own would not. Except under
// a ctx whose deadline comes before the store's call timeout: such a call
// also runs to its end on its own goroutine, so that its failure still
// counts for the breaker (see allowsCall).
func (n *leasing) refill(ctx context.Context, k leaseKey, l *lease, p Policy, cost int64, o CheckOptions) (Result, error) {
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
			return n.call(ctx, k, l, p, cost, o)
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
			return n.call(ctx, k, l, p, cost, o)
		case <-ctx.Done():
			return Result{}, fmt.Errorf("check %s: %w", p.Name, ctx.Err())
		}
		if res, ok := n.answerLocally(k, l, p.Limit, cost, n.clock(), o.Charge); ok {
			return res, nil
		}
		if f.failed != nil {
			return n.failureOf(p, f.failed)
		}
		l.mu.Lock()
	}
	return n.call(ctx, k, l, p, cost, o)
}

// call makes the store call for a check refill could not answer, with l.mu
// held (it unlocks it). With no call in flight for the key it is the key's
// refill and may take a lease; beside one in flight it is a plain check of
// cost, so the key never holds two grants.
func (n *leasing) call(ctx context.Context, k leaseKey, l *lease, p Policy, cost int64, o CheckOptions) (Result, error) {
	if err := ctx.Err(); err != nil {
		// A caller that has gone spends nothing. (Below, its call would race
		// ctx.Done in the select and could win it.)
		l.mu.Unlock()
		return Result{}, fmt.Errorf("check %s: %w", p.Name, err)
	}
	start := n.clock()
	if l.dead {
		// Reset removed this lease while we held it: use the key's new one.
		l.mu.Unlock()
		return n.refill(ctx, k, n.lease(k, start), p, cost, o)
	}
	f := &storeCall{done: make(chan struct{})}
	want, hold := cost, time.Duration(0)
	if l.refilling == nil {
		want, hold = n.grantSize(k, l, p, cost, start)
		l.refilling = f
	} else {
		l.beside++
	}
	l.mu.Unlock()

	if want == cost && n.allowsCall(ctx) {
		// A plain call: no goroutine to start (and grow a stack) and no
		// hand-off back to this one, which the store path of a cold or
		// lease-off check would otherwise pay every time.
		n.callStore(ctx, k, l, f, p, cost, want, hold, start, o)
		if f.abandoned {
			return Result{}, fmt.Errorf("check %s: %w", p.Name, ctx.Err())
		}
		return f.res, f.err
	}
	go n.callStore(context.WithoutCancel(ctx), k, l, f, p, cost, want, hold, start, o)
	select {
	case <-f.done:
		return f.res, f.err
	case <-ctx.Done():
		return Result{}, fmt.Errorf("check %s: %w", p.Name, ctx.Err())
	}
}

// allowsCall reports whether ctx leaves a store call its whole timeout
// (n.coalesceFor), so that a plain call may run under it: a caller that
// would leave sooner (Envoy's rate limit filter allows 20ms by default)
// would abandon every call on a Redis that stopped answering, and the
// breaker, which ignores abandoned calls, would never open, nor would the
// key's calls stop counting as quick.
func (n *leasing) allowsCall(ctx context.Context) bool {
	d, ok := ctx.Deadline()
	return !ok || time.Until(d) > n.coalesceFor
}

// callStore makes the store call f that call started at start (node
// clock) and installs what it brought back: the grant, or the denial. A
// call on its own goroutine (one that may take a grant, or a plain call
// under a short deadline) runs under a ctx that never ends, to its end
// whoever still waits: the store bounds each call (the Redis store by its
// Config.Timeout). A plain call on its caller's goroutine runs under its
// caller's ctx, and is abandoned if that ends first.
func (n *leasing) callStore(ctx context.Context, k leaseKey, l *lease, f *storeCall, p Policy, cost, want int64, hold time.Duration, start int64, o CheckOptions) {
	defer func() {
		if !f.abandoned {
			l.quick.Store(f.failed == nil && n.clock()-start < int64(n.coalesceFor/quickCall))
		}
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
		if old, left := l.claimUnspent(start, false); left > 0 {
			if err := n.returnUnits(ctx, k, l, old, left); err != nil {
				// The store is failing now: take the failure mode rather
				// than make this check, and those waiting for it, wait
				// out a second call.
				f.res, f.err = n.storeFailed(p, err)
				f.failed = err
				return
			}
		}
	}
	base := n.keyBase(p, k.key)
	late := n.newLateTake(k, base, p.Limit)
	d, taken, err := n.store.Acquire(ctx, AcquireRequest{Base: base, Limit: p.Limit, Cost: cost, Want: want, Hold: hold, Bulk: o.Bulk, Charge: o.Charge, Late: late.arrived})
	if err != nil && ctx.Err() != nil {
		// The caller left (a plain call): not a store failure, and the
		// check spent nothing.
		f.abandoned = true
		late.settle(0)
		return
	}
	if err != nil {
		f.res, f.err = n.storeFailed(p, err)
		f.failed = err
		late.settle(admitted(f.res, f.err, cost))
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
			Units: leases.Units{
				ExpiresAt:     start + int64(life),
				AuthRemaining: d.Remaining,
				ResetAt:       start + int64(d.ResetAfter),
				Capacity:      d.Limit,
			},
			taken: taken,
			limit: p.Limit,
			base:  base,
		}
		g.Fill(extra)
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
		n.remember(k, l, p.Limit, max(cost, 1), d, start)
		if o.Charge {
			// A denied charge put the key over its limit: this node's
			// leased units were counted, and are not spent now either.
			l.claimUnspent(start, false)
		}
	}
	l.mu.Unlock()
	if unused != nil {
		_ = n.returnUnits(ctx, k, l, unused, extra) // logged; the decision stands
	}
	f.res = Result{Decision: d, Source: SourceStore}
}

// returnUnits gives units of g, a grant of l, back to the store. A failure only
// costs under-admission until the window or refill restores them, so it is
// logged, and returned only to say that the store is failing. Units that
// went back may make room that the key's remembered denial no longer
// reflects, so that denial is dropped.
func (n *leasing) returnUnits(ctx context.Context, k leaseKey, l *lease, g *grant, units int64) error {
	_, err := n.returnUnitsCounted(ctx, k, l, g, units)
	return err
}

// returnUnitsCounted is returnUnits that also reports how many units made
// a difference at the store. l may be nil (no lease of this node's for k).
func (n *leasing) returnUnitsCounted(ctx context.Context, k leaseKey, l *lease, g *grant, units int64) (int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	returned, err := n.store.Release(ctx, g.base, g.limit, units, g.taken)
	if err != nil {
		n.log.Warn("lease release failed; units return when the window or refill restores them", "units", units, "err", err)
		return 0, err
	}
	n.stats.unitsReturned.Add(returned)
	if returned > 0 {
		n.denials.forget(k, l)
	}
	return returned, nil
}
