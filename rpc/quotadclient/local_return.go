package quotadclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"connectrpc.com/connect"

	quotadv1 "github.com/quotad/quotad/proto/quotad/v1"
)

// This file is how local mode's leases end: a grant's unused units going
// back to quotad, the janitor that ends expired leases, and Close.

// finish ends g for good, if nobody has yet, and gives its unused units
// back to quotad in the background.
func (m *local) finish(g *grant) {
	if !g.closed.CompareAndSwap(false, true) {
		return
	}
	if left := g.Claim(); left > 0 {
		m.giveBack(g, left)
	}
}

// giveBack returns left units of g to quotad in the background.
func (m *local) giveBack(g *grant, left int64) {
	m.returns.Add(1)
	m.stats.returning.Add(left)
	go func() {
		defer m.returns.Done()
		defer m.stats.returning.Add(-left)
		ctx, cancel := context.WithTimeout(context.Background(), returnTimeout)
		defer cancel()
		res, err := m.svc.ReturnLease(ctx, connect.NewRequest(&quotadv1.ReturnLeaseRequest{LeaseId: g.id, Units: left}))
		if err == nil {
			m.stats.unitsReturned.Add(res.Msg.GetReturned())
		}
		// A failed return only leaves the units spent until the window or
		// refill restores them.
	}()
}

// janitor returns the unused units of expired leases and forgets idle
// keys until ctx ends.
func (m *local) janitor(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	idle := int64(max(time.Second, 4*m.opts.Horizon))
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := m.clock()
		m.table.Sweep(func(_ leaseKey, e *entry) bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.acquiring != nil {
				// The call in flight retires or returns the current grant
				// (acquire), and installs the next: this round leaves e be.
				return false
			}
			if p := e.prev.Load(); p != nil && (now >= p.ExpiresAt || p.Unspent() == 0) {
				// Run out: the new grant is spent now.
				e.prev.CompareAndSwap(p, nil)
				m.finish(p)
			}
			g := e.cur.Load()
			if g != nil && now >= g.ExpiresAt {
				m.finish(g)
			}
			return (g == nil || now >= g.ExpiresAt) && e.prev.Load() == nil && now-e.demand.LastUsed.Load() > idle
		})
	}
}

// close stops the janitor, ends every lease and returns its unused units,
// waiting for the returns until ctx ends.
func (m *local) close(ctx context.Context) error {
	m.stop()
	<-m.done
	// Grants that refills in flight bring are returned too.
	refilled := make(chan struct{})
	go func() { m.refills.Wait(); close(refilled) }()
	select {
	case <-refilled:
	case <-ctx.Done():
		return fmt.Errorf("returning leases: %w", ctx.Err())
	}
	m.table.Sweep(func(_ leaseKey, e *entry) bool {
		for _, g := range [...]*grant{e.prev.Load(), e.cur.Load()} {
			if g != nil {
				m.finish(g)
			}
		}
		return false
	})
	done := make(chan struct{})
	go func() { m.returns.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("returning leases: %w", ctx.Err())
	}
}

// ctxError is ctx's error with its Connect code, as a call that ended with
// ctx would have returned it.
func ctxError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}
