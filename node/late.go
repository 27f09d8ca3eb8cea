package node

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/quotad/quotad/algorithms"
)

// This file gives back what a store call took when its reply came after
// its caller was answered without it. A check shed as overloaded, denied
// by its failure mode, or whose caller left, and an all-or-nothing batch
// that was denied, must not have spent; yet a call whose deadline passed
// may have run at the store all the same. When its reply comes, late, the
// units it took go back, but for those the caller's answer spent (a check
// admitted by its failure mode, open). A reply that never comes (the
// connection failed) leaves them spent until the window ends or the bucket
// refills, as for any lost reply.

// lateTake settles one store call's late take: what its caller's answer
// spent is kept, the rest given back, whichever of the reply and the
// answer comes first. Safe for concurrent use.
type lateTake struct {
	n    *Node
	k    leaseKey
	base string
	lim  algorithms.Limit

	mu      sync.Mutex
	settled bool
	keep    int64
	// taken is a take whose reply came before the answer was settled.
	taken *algorithms.Grant
}

func (n *Node) newLateTake(k leaseKey, base string, lim algorithms.Limit) *lateTake {
	return &lateTake{n: n, k: k, base: base, lim: lim}
}

// arrived is the store's report of a late take (AcquireRequest.Late).
func (t *lateTake) arrived(g algorithms.Grant) {
	t.mu.Lock()
	if !t.settled {
		t.taken = &g
		t.mu.Unlock()
		return
	}
	keep := t.keep
	t.mu.Unlock()
	t.giveBack(g, keep)
}

// settle says how many units of a late take the caller's answer spent:
// the check's cost when its failure mode admitted it, else 0. It is called
// once, when the store call failed; what the take brought beyond keep goes
// back, now or when its reply comes.
func (t *lateTake) settle(keep int64) {
	t.mu.Lock()
	t.settled, t.keep = true, keep
	g := t.taken
	t.mu.Unlock()
	if g != nil {
		t.giveBack(*g, keep)
	}
}

// giveBack returns g's units beyond keep to the store. A failure only
// costs under-admission until the window or refill restores them, so it
// is logged.
func (t *lateTake) giveBack(g algorithms.Grant, keep int64) {
	units := g.Units - keep
	if units <= 0 {
		return
	}
	n := t.n
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	returned, err := n.store.Release(ctx, t.base, t.lim, units, g)
	if err != nil {
		// An overloaded node may fail many a second: they are not logged
		// one by one (Stats.StoreOverloads counts them).
		level := slog.LevelWarn
		if errors.Is(err, ErrOverloaded) {
			level = slog.LevelDebug
		}
		n.log.Log(ctx, level, "giving back a take whose reply came late failed; the units return when the window or refill restores them",
			"policy", t.k.policy, "units", units, "err", err)
		return
	}
	n.stats.lateTakesReturned.Add(returned)
	if returned > 0 {
		n.local.returned(t.k)
	}
}

// admitted is what a check of cost spent, answered res and err after its
// store call failed: its cost if its failure mode admitted it, else 0.
func admitted(res Result, err error, cost int64) int64 {
	if err == nil && res.Allowed {
		return cost
	}
	return 0
}
