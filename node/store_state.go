package node

import (
	"context"
	"time"
)

// This file is the watch of a remote store's state: when Redis restarted,
// failed over or was flushed, the node drops its leases and cached denials.

// DefaultStoreStateCheck is Config.StoreStateCheck's default.
const DefaultStoreStateCheck = time.Second

// epochStore is a store that can name the state it holds, so that a node
// notices when that state was lost or replaced (the Redis store's Epoch).
type epochStore interface {
	// Epoch returns a name of the store's current state that changes
	// whenever the state may have been lost or replaced; marker is a key
	// the store may use to tell. It may block on the network until ctx is
	// done.
	Epoch(ctx context.Context, marker string) (string, error)
}

// stateWatch is the goroutine that asks the store, every
// Config.StoreStateCheck and whenever the store becomes available again,
// whether its state changed.
type stateWatch struct {
	store epochStore
	every time.Duration
	nudge chan struct{} // buffered 1: check now
	stop  context.CancelFunc
	done  chan struct{}
}

// watchStoreState starts the watch of store, which must be the node's
// remote store, before any wrapper. drain stops it.
func (n *leasing) watchStoreState(store epochStore) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &stateWatch{store: store, every: n.cfg.StoreStateCheck, nudge: make(chan struct{}, 1), stop: cancel, done: make(chan struct{})}
	n.stateWatch = w
	// A store that comes back after an outage is the likeliest to have
	// restarted: look at once rather than at the next tick.
	n.OnStoreAvailability(func(available bool) {
		if available {
			select {
			case w.nudge <- struct{}{}:
			default:
			}
		}
	})
	go n.runStateWatch(ctx, w)
}

// runStateWatch checks the store's state until ctx ends. A failed check
// changes nothing: the store is down, or slow, and the breaker and the
// failure modes deal with that; the next check that answers compares with
// the last state seen.
func (n *leasing) runStateWatch(ctx context.Context, w *stateWatch) {
	defer close(w.done)
	marker := n.stateMarker()
	var last string
	failing := false
	check := func() {
		// Generous: the watch runs off the check path, and a check that
		// times out on a slow Redis would see nothing.
		cctx, cancel := context.WithTimeout(ctx, max(w.every, time.Second))
		defer cancel()
		epoch, err := w.store.Epoch(cctx, marker)
		if err != nil {
			// Once per streak: an outage is the breaker's to report, but a
			// check that can never succeed (an ACL without INFO) must be
			// seen.
			if ctx.Err() == nil && !failing {
				n.log.Warn("store state check failed; a restarted or flushed Redis goes unnoticed until it succeeds", "err", err)
			}
			failing = true
			return
		}
		failing = false
		if last != "" && epoch != last {
			n.storeStateLost(last, epoch)
		}
		last = epoch
	}
	check()
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check()
		case <-w.nudge:
			check()
		}
	}
}

// storeStateLost drops every lease and cached denial: what the node took
// from a state the store no longer holds. Leased units were spent in the
// old state; spending them now would admit them on top of what the new
// state admits. They are not given back either: the new state never
// counted them. Denials of the old state no longer hold.
func (n *leasing) storeStateLost(from, to string) {
	var keys []leaseKey
	var units int64
	n.leases.Each(func(k leaseKey, l *lease) {
		keys = append(keys, k)
		if g := l.cur.Load(); g != nil {
			units += g.Unspent()
		}
	})
	for _, k := range keys {
		if l := n.leases.Remove(k); l != nil {
			l.kill()
		}
	}
	n.denials.forgetAll()
	n.forgetClientLeases(func(string, string) bool { return true })
	n.stats.storeStateLosses.Add(1)
	n.log.Warn("the store's state changed (Redis restarted, failed over or was flushed): dropped every lease and cached denial; "+
		"counters lost with the old state start again, so a key may admit up to its limit once more",
		"leases", len(keys), "units", units, "from", from, "to", to)
}
