package node

import (
	"context"
	"sync"

	"github.com/quotad/quotad/algorithms"
)

// This file is how a denied all-or-nothing batch reads the groups it did
// not reach: a cost-0 look of each, shared by concurrent batches that look
// at the same key (lookFlights).

// look reads g's state at the store without spending (cost 0), for the
// fields of a group the denied batch did not reach. Concurrent looks at one
// limit and key share one store call, so that a flood of denied batches
// costs the store about one read per key and round trip, not one per batch.
func (b *batch) look(ctx context.Context, g *batchGroup) {
	n := b.n
	ctx, cancel := context.WithTimeout(ctx, batchCallTimeout)
	defer cancel()
	d, err := n.looks.do(ctx, lookKey{g.base, g.p.Limit}, func() (algorithms.Decision, error) {
		start := n.clock()
		d, _, err := n.store.Acquire(ctx, AcquireRequest{Base: g.base, Limit: g.p.Limit, Bulk: b.opts.Bulk})
		if err == nil && !d.Allowed {
			b.rememberDenial(g, 0, d, start)
		}
		return d, err
	})
	if err != nil {
		res, shed := n.storeFailed(g.p, err)
		g.state, g.res, g.shed = groupLooked, res, shed
		return
	}
	g.state, g.res = groupLooked, Result{Decision: d, Source: SourceStore}
}

// lookFlights shares concurrent looks at one limit and key. The zero value
// is ready; it is safe for concurrent use.
type lookFlights struct {
	mu sync.Mutex
	m  map[lookKey]*lookFlight
}

// lookKey names what a look reads: a key base under a limit.
type lookKey struct {
	base  string
	limit algorithms.Limit
}

// lookFlight is one look in flight; d and err are set when done closes.
type lookFlight struct {
	done chan struct{}
	d    algorithms.Decision
	err  error
}

// do returns the outcome of read for k: of a call already in flight for k
// if there is one, else of a call it makes. It waits at most until ctx is
// done.
func (f *lookFlights) do(ctx context.Context, k lookKey, read func() (algorithms.Decision, error)) (algorithms.Decision, error) {
	f.mu.Lock()
	if fl := f.m[k]; fl != nil {
		f.mu.Unlock()
		select {
		case <-fl.done:
			return fl.d, fl.err
		case <-ctx.Done():
			return algorithms.Decision{}, ctx.Err()
		}
	}
	if f.m == nil {
		f.m = make(map[lookKey]*lookFlight)
	}
	fl := &lookFlight{done: make(chan struct{})}
	f.m[k] = fl
	f.mu.Unlock()
	fl.d, fl.err = read()
	f.mu.Lock()
	delete(f.m, k)
	f.mu.Unlock()
	close(fl.done)
	return fl.d, fl.err
}
